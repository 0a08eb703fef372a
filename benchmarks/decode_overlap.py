"""Does the device JPEG decoder run beside the network on one GPU? The engine streaming ready crops and the decoder
streaming JPEGs, each alone and then both at once from two threads (each on its own command queue), with the
decoder's queue at the default priority and, where the device offers cl_khr_priority_hints, at high priority.
If the two overlap on the device, their rates together exceed what each leaves the other when run in turn.

    python3 benchmarks/decode_overlap.py --device gpu --batch 64 --seconds 4 --network fp16
    python3 benchmarks/decode_overlap.py --device cpu --batch 2 --seconds 0.5 --network fp32 --width 0.0625  # CI
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import pyopencl as cl

from device_decode import corpus

QUEUE_PRIORITY_KHR, PRIORITY_HIGH, PRIORITY_LOW = 0x1096, 1 << 0, 1 << 2


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--network", default="fp16")
    ap.add_argument("--width", type=float, default=1.0, help="the network's channel width (1.0: VGG16's own)")
    args = ap.parse_args(argv)

    from vggserve.decoding.device.onmodel import decode_for_model
    from vggserve.model.vgg16 import VGG16
    from vggserve.weights.init import init_weights

    model = VGG16(init_weights(seed=0, width=args.width), device=args.device, max_batch_size=args.batch,
                  precision=args.network)
    files = corpus(args.batch, 500, 375, 90)
    crops = np.zeros((args.batch, 224, 224, 3), np.uint8)
    decoder, default_queue, lock = model.jpeg_decoder()
    device = decoder.context.devices[0]
    print(f"device {device.name}; priority hints: {'cl_khr_priority_hints' in device.extensions}")

    def engine(stop, out):
        pending, n = [], 0
        t0 = time.perf_counter()
        while not stop.is_set():
            pending.append(model.submit(crops, "logits"))
            if len(pending) > 1:
                pending.pop(0).result()
            n += args.batch
        for p in pending:
            p.result()
        out["engine"] = n / (time.perf_counter() - t0)

    def decode(stop, out):
        n, t0 = 0, time.perf_counter()
        while not stop.is_set():
            decode_for_model(model, files)
            n += args.batch
        out["decode"] = n / (time.perf_counter() - t0)

    def run(*workers) -> dict:
        stop, out = threading.Event(), {}
        threads = [threading.Thread(target=w, args=(stop, out)) for w in workers]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        return out

    model.submit(crops, "logits").result()
    decode_for_model(model, files)
    rows = [("engine alone", run(engine)), ("decoder alone", run(decode)), ("both, default priority",
                                                                                run(engine, decode))]
    for name, prio in (("both, decoder queue high priority", PRIORITY_HIGH),
                       ("both, decoder queue low priority", PRIORITY_LOW)):
        try:
            queue = cl.CommandQueue(decoder.context, device, properties=[QUEUE_PRIORITY_KHR, prio])
        except cl.Error as exc:
            print(f"{name}: no such queue ({exc})")
            continue
        model._jpeg = (decoder, queue, lock)
        decode_for_model(model, files)
        rows.append((name, run(engine, decode)))
    model._jpeg = (decoder, default_queue, lock)
    e0, d0 = max(rows[0][1]["engine"], 1e-9), max(rows[1][1]["decode"], 1e-9)
    for name, r in rows:
        e, d = r.get("engine", 0.0), r.get("decode", 0.0)
        print(f"{name:36s} engine {e:8,.0f}  decoder {d:8,.0f} images/s;  fractions of alone {e / e0:.2f} + "
              f"{d / d0:.2f} = {e / e0 + d / d0:.2f}")


if __name__ == "__main__":
    main()
