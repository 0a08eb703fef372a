"""The device JPEG decoder's host work alone, per batch: `prepare` of every file, then the layout part of
`JpegDecoder.enqueue` (Batch.pack into a reused staging array, chunked, the window table, the meta table), no
OpenCL. Times are CPU seconds of this process (helper copying threads included), the mean over the repeats, and
the fastest wall time of one batch. --distinct-sizes gives every file of a batch its own size (parse.py caches
what headers fix apart from the size; this shows that a batch of many sizes costs the same).

    python3 benchmarks/decode_host.py --batch 64 --repeat 50 [--distinct-sizes]

--device DEVICE (e.g. auto: PoCL on a machine without a GPU) times instead the whole host path as the engine runs
it on that OpenCL device, in CPU seconds of the calling thread alone (time.thread_time: the OpenCL runtime's own
threads, PoCL's kernels, are left out): `decode_for_model` on the files' bytes (prepare, windows, output buffer,
enqueue, statuses, the DeviceImages made and dropped), and the service engine's `DeviceDecoding.decode` on a batch
of encoded inputs as they arrive from a front end (unpickled), and its `decode_group` on groups.GROUP such batches
at once (--decode-group's default). The median over --runs passes of --images files.

    python3 benchmarks/decode_host.py --device auto --images 512 --runs 5
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
from PIL import Image

from device_decode import corpus, photo_like


def timed(fn, repeat: int) -> tuple[float, float]:
    """(mean CPU ms, fastest wall ms) of fn() over `repeat` calls."""
    fn()
    best, cpu0 = float("inf"), time.process_time()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return (time.process_time() - cpu0) * 1e3 / repeat, best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--chunk-bytes", type=int, default=128)
    ap.add_argument("--distinct-sizes", action="store_true", help="every file its own size (width - i)")
    ap.add_argument("--device", help="time decode_for_model and DeviceDecoding.decode on this OpenCL device instead")
    ap.add_argument("--images", type=int, default=512, help="with --device: files per pass")
    ap.add_argument("--runs", type=int, default=5, help="with --device: passes (the median is printed)")
    args = ap.parse_args()
    if args.device:
        on_device(args)
        return
    from vggserve.decoding.device import decoder as dec
    from vggserve.decoding.device import prepare
    from vggserve.decoding.device.tables import Batch

    width, height = map(int, args.size.split("x"))
    files = corpus(args.batch, width, height, args.quality)
    if args.distinct_sizes:
        files = []
        for i in range(args.batch):
            buffer = io.BytesIO()
            Image.fromarray(photo_like(width - i, height - i // 2, i)).save(buffer, "JPEG", quality=args.quality,
                                                                          subsampling=2)
            files.append(buffer.getvalue())
    prepared = [prepare(f) for f in files]
    assert all(prepared), [p.reason for p in prepared if not p]
    windows, offset = [], 0
    for p in prepared:
        windows.append(dec.Window.whole(p, offset))
        offset += p.size[0] * p.size[1] * 3
    staging: dict = {}

    def array(role, nbytes, dtype=np.uint8):
        have = staging.get(role)
        if have is None or have.size < nbytes:
            staging[role] = have = np.zeros(nbytes * 2, np.uint8)
        return have[:nbytes].view(dtype)

    def pack():
        return Batch.pack([f.frame for f in prepared], [f.data for f in prepared], [f.restarts for f in prepared],
                          place=lambda nbytes: array("data", nbytes + 16))

    batch = pack()

    def chunked():
        batch.chunked(args.chunk_bytes)

    def windows_table():
        return dec._windows(prepared, windows, batch)

    def meta():
        win, _ = dec._windows(prepared, windows, batch)
        parts = [batch.seg, batch.img, batch.comp, batch.tab, batch.plane, batch.quant, win]
        at = np.cumsum([0] + [p.size for p in parts])[:-1].tolist()
        out = array("meta", 4 * int(at[-1] + win.size), np.int32)
        for p, a in zip(parts, at):
            out[a:a + p.size] = p.ravel()

    def layout():
        if hasattr(dec, "lay_out"):
            return dec.lay_out(prepared, windows, args.chunk_bytes, array)
        b = pack()
        b.chunked(args.chunk_bytes)
        win, _ = dec._windows(prepared, windows, b)
        parts = [b.seg, b.img, b.comp, b.tab, b.plane, b.quant, win]
        at = np.cumsum([0] + [p.size for p in parts])[:-1].tolist()
        out = array("meta", 4 * int(at[-1] + win.size), np.int32)
        for p, a in zip(parts, at):
            out[a:a + p.size] = p.ravel()

    def copy():
        from vggserve.decoding.device.tables import _joined

        datas = [f.data for f in prepared]
        _joined(datas, sum(map(len, datas)), lambda nbytes: array("data", nbytes + 16))

    chunked()
    rows = [("prepare (parse, restarts, orientation)", lambda: [prepare(f) for f in files]),
            ("copy of the files into staging memory", copy), ("Batch.pack (with that copy)", pack),
            ("chunked", chunked), ("_windows", windows_table),
            ("_windows + meta assembly", meta), ("layout in all (pack, chunked, windows, meta)", layout)]
    print(f"{len(files)} files {args.size}{' down to ' + str(files and prepared[-1].size) if args.distinct_sizes else ''} q{args.quality}, mean {np.mean([len(f) for f in files]) / 1024:.1f} KB; "
          f"ms per batch of {args.batch}: CPU mean, fastest wall")
    total = 0.0
    for name, fn in rows:
        cpu, wall = timed(fn, args.repeat)
        if name.startswith(("prepare", "layout")):
            total += cpu
        print(f"  {name:48s} {cpu:7.3f} {wall:7.3f}")
    print(f"  {'host CPU per batch (prepare + layout)':48s} {total:7.3f}   ({total / args.batch:.4f} ms per image)")


def on_device(args) -> None:
    """The calling thread's CPU per image of decode_for_model and of the service engine's DeviceDecoding.decode."""
    import pickle
    import statistics
    from concurrent.futures import Future
    from types import SimpleNamespace

    from vggserve.decoding.device import _decoder_for
    from vggserve.decoding.groups import GROUP
    from vggserve.decoding.device.onmodel import decode_for_model
    from vggserve.modelinput import ModelInput
    from vggserve.serving.scheduling.devicedecode import DeviceDecoding

    class Model:  # what decode_for_model asks of the engine: its decoder, queue and lock
        def jpeg_decoder(self):
            return _decoder_for(args.device)

    class Counter:
        def labels(self, **_):
            return self

        def inc(self, n=1):
            pass

        def observe(self, amount):
            pass

    width, height = map(int, args.size.split("x"))
    files = corpus(args.images, width, height, args.quality)
    groups = [files[i:i + args.batch] for i in range(0, len(files), args.batch)]
    model = Model()
    service = DeviceDecoding(SimpleNamespace(decoded=Counter(), device_decode_batches=Counter()), "gpu")
    arrived = [pickle.loads(pickle.dumps([ModelInput.encoded(f) for f in g], pickle.HIGHEST_PROTOCOL))
               for g in groups]

    def direct(i):
        return decode_for_model(model, groups[i])

    def engine(i):
        batch = [SimpleNamespace(input=x, future=Future()) for x in arrived[i]]
        return service.decode(model, batch, True, "vgg")[1]

    def grouped(i):  # batch i starts a decode group of GROUP batches (the others are decoded with it)
        if i % GROUP:
            return []
        batches = [[SimpleNamespace(input=x, future=Future()) for x in arrived[j]]
                   for j in range(i, min(i + GROUP, len(groups)))]
        return [x for _, inputs in service.decode_group(model, batches, True, "vgg") for x in inputs]

    print(f"{_decoder_for(args.device)[0].context.devices[0].name.strip()}: {len(files)} files {args.size} "
          f"q{args.quality}, batches of {args.batch}; the calling thread's CPU ms per image, median of {args.runs} "
          f"passes (each: min, max)")
    steps = (("decode_for_model (bytes)", direct), ("DeviceDecoding.decode (service engine)", engine),
             (f"DeviceDecoding.decode_group, {GROUP} batches", grouped))
    for name, step in steps:
        assert all(getattr(x, "form", None) == "device" for x in step(0))  # warm: programs, staging, pools
        per = []
        for _ in range(args.runs):
            t0 = time.thread_time()
            for i in range(len(groups)):
                items = step(i)
                del items  # the images dropped, as the engine drops them after its submit
            per.append((time.thread_time() - t0) * 1e3 / len(files))
        print(f"  {name:40s} {statistics.median(per):.4f}   ({min(per):.4f}, {max(per):.4f})")


if __name__ == "__main__":
    main()
