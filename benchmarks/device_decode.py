"""The device JPEG decoder alone and with Resize(256) + CenterCrop(224), against the CPU decode and, where PyTorch
with CUDA is installed, torchvision's decode_jpeg(device="cuda") (nvJPEG): speed, host CPU per image, and pixel
agreement with Pillow. One run prints every figure and writes them as JSON.

    python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
from PIL import Image


def photo_like(width: int, height: int, seed: int) -> np.ndarray:
    """A synthetic picture with a photo's spectrum: smooth regions, edges, some texture (q90 4:2:0 500x375 comes
    out near the 70-80 KB of a typical photo)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3)).astype(np.float64)
    img = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((width, height), Image.BICUBIC), np.float64)
    y, x = np.mgrid[0:height, 0:width]
    img += 40 * np.sin(x / (7 + seed % 5))[..., None] * np.cos(y / 11.0)[..., None]
    img += rng.normal(0, 9, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def corpus(n: int, width: int, height: int, quality: int) -> list[bytes]:
    files = []
    for i in range(min(n, 64)):
        buffer = io.BytesIO()
        Image.fromarray(photo_like(width, height, i)).save(buffer, "JPEG", quality=quality, subsampling=2)
        files.append(buffer.getvalue())
    return [files[i % len(files)] for i in range(n)]


class _Span:
    """Two events' span, profiled as one: from the first's start to the last's end."""

    def __init__(self, first, last):
        self.first, self.last = first, last

    @property
    def profile(self):
        return type("Profile", (), {"start": self.first.profile.start, "end": self.last.profile.end})


def cpu_ms_per_image(fn, items, repeat: int = 1) -> float:
    t0 = time.process_time()
    for _ in range(repeat):
        for item in items:
            fn(item)
    return (time.process_time() - t0) * 1e3 / (repeat * len(items))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--mix", choices=("single", "photo"), default="single",
                    help="photo: serve_saturation.py's phone-photo mix (of every 8 files one 12 MP, one 2 MP, six "
                         "500x375) instead of --size")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--chunk-bytes", type=int, default=None, help="parallel entropy decoding's chunk (default: "
                    "the decoder's)")
    ap.add_argument("--long-chunk-bytes", type=int, default=None, help="the chunks of segments of "
                    "LONG_SEGMENT_BYTES or more (0: --chunk-bytes; default: the decoder's)")
    ap.add_argument("--rounds", type=int, default=None, help="its synchronisation rounds (0: serial decoding)")
    ap.add_argument("--lookback", type=int, default=None, help="bytes before a chunk from which round 0 decodes to "
                    "guess its entry (default: the decoder's)")
    ap.add_argument("--kernels", choices=("quad", "item"), default=None,
                    help="the variant of jpeg_color.cl and resize.cl for the whole run (item: the first versions, one "
                         "work-item per pixel; default: each kernel's shipped default, quad colour and item resize)")
    ap.add_argument("--checkpoints", type=int, default=None,
                    help="states each chunk's decode records, where the decoding pass splits it (0: whole chunks; "
                         "default: the decoder's)")
    ap.add_argument("--one-symbol", action="store_true",
                    help="the synchronisation rounds without their multi-symbol tables, one symbol at a time (the "
                         "same exits; to measure what the tables save)")
    ap.add_argument("--no-resume", action="store_true",
                    help="a chunk decoding again from a new entry decodes whole, not stopping where it meets its last "
                         "decode at a checkpoint (the same exits; to measure what resuming saves)")
    ap.add_argument("--no-skip-quiet", action="store_true",
                    help="every synchronisation round checks every chunk, where by default a round after one that "
                         "moved no chunk's state returns at once (the same exits; to measure what skipping saves)")
    ap.add_argument("--variants", action="store_true",
                    help="also time each kernel variant's colour and resize on the same batches, and check they "
                         "write the same bytes")
    ap.add_argument("--group", type=int, default=1,
                    help="batches decoded in one launch sequence (as the batch job's DeviceChunkDecoder groups its "
                         "chunks): the device ms are still per batch of --batch, and --network's device decode "
                         "decodes this many batches per call")
    ap.add_argument("--no-torch", action="store_true", help="skip torchvision's GPU decode")
    ap.add_argument("--network", metavar="PRECISION", default=None,
                    help="also classify: device decode + VGG16 at this precision (random weights), against the engine "
                         "alone on ready crops and the CPU decode feeding it")
    ap.add_argument("--profile-host", action="store_true", help="print a profile of the streamed loop's host work")
    ap.add_argument("--json")
    args = ap.parse_args()
    import pyopencl as cl

    if args.one_symbol:  # every decoder of this process, the network run's (decode_for_model) included
        import vggserve.decoding.device.decoder as decoder_module

        decoder_module.MULTI = False
    if args.no_resume:
        import vggserve.decoding.device.decoder as decoder_module

        decoder_module.RESUME = False
    if args.no_skip_quiet:
        import vggserve.decoding.device.decoder as decoder_module

        decoder_module.SKIP_QUIET = False

    from vggserve.decoding import decode_pixels
    from vggserve.decoding.device import JpegDecoder, Window, prepare
    from vggserve.ops.resize import DeviceResize
    from vggserve.preprocessing import aspect_box
    from vggserve.runtime import devices as devs
    from vggserve.runtime.programs import ProgramCache

    width, height = map(int, args.size.split("x"))
    if args.mix == "photo":
        from serve_saturation import photo_mix

        mix = photo_mix()
        files = [mix[i % len(mix)] for i in range(args.images)]
        args.size = "photo mix"
    else:
        files = corpus(args.images, width, height, args.quality)
    res = {"device": None, "images": len(files), "batch": args.batch, "size": args.size, "quality": args.quality,
           "mean_kb": round(float(np.mean([len(f) for f in files])) / 1024, 1)}
    info = devs.resolve(args.device)
    dev = devs.cl_device(info)
    res["device"] = dev.name.strip()
    print(f"{res['device']}: {len(files)} JPEGs {args.size} q{args.quality} 4:2:0, mean {res['mean_kb']} KB, "
          f"batches of {args.batch}")
    res["cpu_decode_ms"] = cpu_ms_per_image(lambda d: decode_pixels(d), files[:64])
    res["host_prepare_ms"] = cpu_ms_per_image(prepare, files[:64], repeat=4)
    print(f"CPU decode_pixels: {res['cpu_decode_ms']:.3f} ms CPU per image; device path host work (parse, "
          f"tables): {res['host_prepare_ms']:.4f} ms CPU per image")

    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, dev)
    tuning = {k: v for k, v in (("chunk_bytes", args.chunk_bytes), ("long_chunk_bytes", args.long_chunk_bytes),
                                ("rounds", args.rounds),
                                ("lookback", args.lookback), ("checkpoints", args.checkpoints)) if v is not None}
    decoder = JpegDecoder(ctx, dev, cache, **({"kernels": args.kernels} if args.kernels else {}), **tuning)
    res["chunk_bytes"], res["rounds"], res["lookback"] = decoder.chunk_bytes, decoder.rounds, decoder.lookback
    res["long_chunk_bytes"] = decoder.long_chunk_bytes
    res["multi_symbol"] = decoder.multi
    res["checkpoints"] = decoder.checkpoints
    res["resume"] = decoder.resume
    res["skip_quiet"] = decoder.skip_quiet
    res["kernels"] = args.kernels
    resize = DeviceResize(ctx, cache.build("resize.cl", {}), **({"variant": args.kernels} if args.kernels else {}))
    prepared = [prepare(f) for f in files]
    assert all(prepared), [p.reason for p in prepared if not p]
    b = args.batch
    batches = [prepared[i:i + b] for i in range(0, len(prepared), b)]

    def whole_windows(batch):
        out, offset = [], 0
        for p in batch:
            out.append(Window.whole(p, offset))
            offset += p.size[0] * p.size[1] * 3
        return out, offset

    # exactness against Pillow over the corpus's distinct files
    distinct = prepared[:min(64, len(prepared))]
    wins, total = whole_windows(distinct)
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, total)
    run = decoder.enqueue(queue, distinct, wins, out)
    ok = run.ok()
    host = np.empty(total, np.uint8)
    cl.enqueue_copy(queue, host, out)
    same = 0
    for p, w in zip(distinct, wins):
        pw, ph = p.size
        same += np.array_equal(host[w.offset:w.offset + pw * ph * 3].reshape(ph, pw, 3),
                               np.asarray(decode_pixels(p.data)))
    res["identical_to_pillow"] = f"{same}/{len(distinct)}"
    res["device_ok"] = sum(ok)
    res["segments_in_parallel"] = run.segments_in_parallel()
    way = (("multi-symbol" if decoder.multi else "one symbol at a time") + f", {decoder.checkpoints} checkpoints"
           + ("" if decoder.resume else ", no resuming") + ("" if decoder.skip_quiet else ", no round skipped"))
    print(f"chunks of {decoder.chunk_bytes} bytes ({decoder.long_chunk_bytes} in long segments), lookback "
          f"{decoder.lookback}, {decoder.rounds} rounds, {way}: device decode identical to Pillow: "
          f"{same}/{len(distinct)} distinct files (device status ok: {sum(ok)}; segments settled in parallel: "
          f"{res['segments_in_parallel']}/{len(distinct)})")

    def timed(step, groups=None) -> tuple[float, dict]:
        """images/s of step(group, stages) over `groups` (default the prepared batches) for --seconds, and each
        stage's seconds in `stages` as ms per image."""
        groups = groups or batches
        stages: dict = {}
        step(groups[0], stages)  # warm
        queue.finish()
        stages.clear()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            for group in groups:
                step(group, stages)
                n += len(group)
        queue.finish()
        return n / (time.perf_counter() - t0), {k: v / n * 1e3 for k, v in stages.items()}

    buffers = {}

    def buf(name, size):
        if buffers.get(name, (0,))[0] < size:
            buffers[name] = (size, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size))
        return buffers[name][1]

    def decode_only(batch, stages):
        wins, total = whole_windows(batch)
        run = decoder.enqueue(queue, batch, wins, buf("whole", total))
        run.ok()
        for name, ev in (("huffman+idct+colour", run.done),):
            stages[name] = stages.get(name, 0.0) + (ev.profile.end - ev.profile.start) * 1e-9
    rate, _ = timed(decode_only)
    res["decode_images_per_s"] = rate
    print(f"device decode alone: {rate:,.0f} images/s")

    def stage_times(batch):
        wins, total = whole_windows(batch)
        run = decoder.enqueue(queue, batch, wins, buf("whole", total))
        run.ok()
        return run

    def crop_windows(batch):
        wins, placed, offset = [], [], 0
        for i, p in enumerate(batch):
            pw, ph = p.size
            box = aspect_box(pw, ph) or (0, 0, pw, ph)
            bw, bh = box[2] - box[0], box[3] - box[1]
            wins.append(Window(offset, box[0], box[1], bw, bh))
            placed.append((offset, bw, bh, i))
            offset += bw * bh * 3
        return wins, placed, offset

    # per-stage device times of one batch, from the events of each kernel of a profiled run
    kernels: dict = {}
    group = max(1, args.group)
    grouped = [sum(batches[i:i + group], []) for i in range(0, len(batches), group)][:max(1, 4 // group)]
    measured = sum(len(g) for g in grouped) / b  # batches of --batch in the timed groups
    res["group"] = group
    for batch in grouped:
        stage_times(batch)
        for name, evs in decoder.events.items():
            kernels.setdefault(name, []).extend(evs)
        wins, placed, offset = crop_windows(batch)  # the resize and crop the engine runs next, timed alone
        raw = buf("raw", offset)
        decoder.enqueue(queue, batch, wins, raw).ok()
        end = resize.enqueue(queue, raw, placed, buf("crops", len(batch) * 224 * 224 * 3))
        # from its table's upload (enqueued after the host packed the table) to its last kernel's end: device time
        kernels.setdefault("resize", []).append(_Span(resize.last_upload, end))
    queue.finish()
    per = {k: float(np.sum([(e.profile.end - e.profile.start) * 1e-6 for e in evs])) / measured
           for k, evs in kernels.items()}
    res["stage_ms_per_batch"] = per
    print("device ms per batch of %d (%d per launch sequence): " % (b, group)
          + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
    rounds = kernels.get("sync", [])
    if rounds and decoder.rounds:
        by_round = np.array([(e.profile.end - e.profile.start) * 1e-6 for e in rounds]).reshape(-1, decoder.rounds)
        res["sync_round_ms"] = by_round.mean(axis=0).round(4).tolist()
        print(f"sync rounds, ms each (a launch sequence of {group} batches): "
              + " ".join(f"{v:.3f}" for v in res["sync_round_ms"]))
    first = min(e.profile.start for evs in kernels.values() for e in evs[:1])
    res["device_span_ms_first_batch"] = (kernels["colour"][0].profile.end - first) * 1e-6
    res["stage_ms_per_batch"] = per
    print("device ms per batch of %d: " % b + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
    if args.variants:
        res["variants"] = compare_variants(ctx, dev, cache, queue, batches[:4], crop_windows, tuning)

    def decode_crop(batch, stages):
        wins, placed, offset = crop_windows(batch)
        raw = buf("raw", offset)
        crops = buf("crops", len(batch) * 224 * 224 * 3)
        run = decoder.enqueue(queue, batch, wins, raw)
        run.ok()
        resize.enqueue(queue, raw, placed, crops)
    rate, _ = timed(decode_crop)
    res["decode_resize_crop_images_per_s"] = rate
    print(f"device decode + Resize(256) + CenterCrop(224), one batch at a time: {rate:,.0f} images/s")

    # streamed from the files' bytes, as a pipeline runs it: the host parses and lays out batch i + 1 (prepare,
    # enqueue) while the device decodes batch i; batch i's statuses are read once batch i + 1 is enqueued.
    raw_files = [files[i:i + b] for i in range(0, len(files), b)]
    slots = [{}, {}]

    def streamed(group, stages, state={"turn": 0, "pending": None}):
        t0 = time.process_time()
        batch = [prepare(f) for f in group]
        wins, placed, offset = crop_windows(batch)
        own = slots[state["turn"]]
        state["turn"] ^= 1
        if own.get("size", 0) < offset:
            own["size"], own["raw"] = offset, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, offset)
        crops = buf("crops", len(batch) * 224 * 224 * 3)
        run = decoder.enqueue(queue, batch, wins, own["raw"])
        resize.enqueue(queue, own["raw"], placed, crops)
        stages["host"] = stages.get("host", 0.0) + time.process_time() - t0
        if state["pending"] is not None:
            state["pending"].ok()
        state["pending"] = run

    rate, per_image = timed(streamed, raw_files)
    if args.profile_host:  # where the host's time goes in the streamed loop (calls that block show up here)
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        for group in raw_files:
            streamed(group, {})
        queue.finish()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    res["streamed_decode_resize_crop_images_per_s"] = rate
    res["streamed_host_cpu_ms_per_image"] = per_image["host"]
    print(f"device decode + Resize(256) + CenterCrop(224), streamed from bytes (host parse included): {rate:,.0f} "
          f"images/s; host CPU {res['streamed_host_cpu_ms_per_image']:.4f} ms per image (prepare + enqueue)")

    try:
        if args.no_torch:
            raise ImportError("--no-torch")
        import torch
        import torchvision
        from torchvision.io import decode_jpeg
        if not torch.cuda.is_available():
            raise ImportError("no CUDA")
    except ImportError as exc:
        print(f"torchvision GPU decode not measured: {exc}")
    else:
        tensors = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
        decode_jpeg(tensors[:b], device="cuda")
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            for i in range(0, len(tensors), b):
                decode_jpeg(tensors[i:i + b], device="cuda")
                n += len(tensors[i:i + b])
        torch.cuda.synchronize()
        res["torchvision_cuda_images_per_s"] = n / (time.perf_counter() - t0)
        t0 = time.process_time()
        for i in range(0, len(tensors), b):
            decode_jpeg(tensors[i:i + b], device="cuda")
        torch.cuda.synchronize()
        res["torchvision_cuda_cpu_ms"] = (time.process_time() - t0) * 1e3 / len(tensors)
        got = decode_jpeg(tensors[:64], device="cuda")
        same, diffs = 0, []
        for f, t in zip(files[:64], got):
            want = np.asarray(decode_pixels(f))
            have = t.permute(1, 2, 0).cpu().numpy()
            same += np.array_equal(have, want)
            diffs.append(np.abs(have.astype(int) - want).mean())
        res["torchvision_identical_to_pillow"] = f"{same}/64"
        res["torchvision_mean_abs_diff"] = float(np.mean(diffs))
        print(f"torchvision {torchvision.__version__} decode_jpeg(device='cuda'): "
              f"{res['torchvision_cuda_images_per_s']:,.0f} images/s, {res['torchvision_cuda_cpu_ms']:.3f} ms CPU per "
              f"image; identical to Pillow: {same}/64, mean |diff| {res['torchvision_mean_abs_diff']:.3f}")
    if args.network:
        res.update(network(args, files))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


def compare_variants(ctx, dev, cache, queue, batches, crop_windows, tuning) -> dict:
    """Device ms per batch of the colour and resize kernels in each variant (quad, item) on the same batches (the
    mean of 3 runs of each after a warm one), and whether both variants wrote the same crops."""
    import pyopencl as cl

    from vggserve.decoding.device import JpegDecoder
    from vggserve.ops.resize import DeviceResize

    mf = cl.mem_flags
    out, crops = {}, {}
    for variant in ("quad", "item"):
        decoder = JpegDecoder(ctx, dev, cache, kernels=variant, **tuning)
        resize = DeviceResize(ctx, cache.build("resize.cl", {}), variant=variant)
        times = {"colour": [], "resize": []}
        got = []
        for batch in batches:
            wins, placed, offset = crop_windows(batch)
            raw = cl.Buffer(ctx, mf.READ_WRITE, offset)
            crop = cl.Buffer(ctx, mf.READ_WRITE, len(batch) * 224 * 224 * 3)
            for rep in range(4):
                decoder.enqueue(queue, batch, wins, raw).ok()
                start = cl.enqueue_marker(queue)
                end = resize.enqueue(queue, raw, placed, crop)
                end.wait()
                if rep:
                    times["colour"].append(sum((e.profile.end - e.profile.start) * 1e-6
                                               for e in decoder.events["colour"]))
                    times["resize"].append((end.profile.end - start.profile.start) * 1e-6)
            host = np.empty(len(batch) * 224 * 224 * 3, np.uint8)
            cl.enqueue_copy(queue, host, crop)
            got.append(host)
        crops[variant] = got
        out[variant] = {k: float(np.mean(v)) for k, v in times.items()}
        print(f"variant {variant}: device ms per batch: " + ", ".join(f"{k} {v:.3f}" for k, v in out[variant].items()))
    out["identical_crops"] = all(np.array_equal(a, b) for a, b in zip(crops["quad"], crops["item"]))
    print(f"variants quad and item wrote the same crops: {out['identical_crops']}")
    return out


def streamed_network(model, groups, make, seconds: float, then=None) -> tuple[float, float]:
    """(images/s, this process's CPU ms per image) of `model.submit(make(group), "logits")` over `groups` again and
    again for `seconds` (at least once through), two batches in flight. `then(i)`: called after group i's submit,
    before the results of the group before it are waited for."""
    pending, n = [], 0
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds or n == 0:
        for i, g in enumerate(groups):
            pending.append(model.submit(make(g), "logits"))
            if then is not None:
                then(i)
            if len(pending) > 1:
                pending.pop(0).result()
            n += len(g)
    for p in pending:
        p.result()
    return n / (time.perf_counter() - t0), (time.process_time() - c0) * 1e3 / n


def network(args, files) -> dict:
    """images/s of the whole path, streamed with two batches in flight: the engine alone on ready uint8 crops; device
    decode (decode_for_model) + engine; this process's CPU decode (one thread) + engine."""
    from vggserve.decoding import decode_pixels
    from vggserve.decoding.device.onmodel import decode_for_model, start_decode
    from vggserve.model.vgg16 import VGG16
    from vggserve.modelinput import device_input
    from vggserve.weights.init import init_weights

    model = VGG16(init_weights(seed=0, width=1.0), device=args.device, max_batch_size=args.batch,
                  precision=args.network)
    b = args.batch
    groups = [files[i:i + b] for i in range(0, len(files) - b + 1, b)]
    crops = np.zeros((b, 224, 224, 3), np.uint8)

    def stream(make) -> tuple[float, float]:
        make(groups[0])
        model.submit(make(groups[0]), "logits").result()
        return streamed_network(model, groups, make, args.seconds)

    group = max(1, args.group)

    def position(g) -> int:
        """g's index in groups (by identity: the corpus repeats its files, so groups may be equal)"""
        return next(k for k, x in enumerate(groups) if x is g)

    firsts = list(range(0, len(groups), group))  # each launch sequence's first batch

    def files_from(first: int) -> list:
        """the files of the launch sequence whose first batch is groups[first]"""
        return [f for x in groups[first:first + group] for f in x]

    def device_decoded(g, state={}):
        """batch g's inputs, from one decode_for_model call per `group` batches (the first batch's asks for all)"""
        i = position(g)
        first = i - i % group
        if state.get("first") != first:
            state["first"] = first
            state["items"] = decode_for_model(model, files_from(first))
        at = (i - first) * b
        return state["items"][at:at + b]

    def ahead(seconds: float) -> tuple[float, float]:
        """each launch sequence's decode (`group` batches) launched (start_decode) before the previous one's is
        waited for and its first batch submitted"""
        state = {"next": start_decode(model, files_from(0)), "first": None, "items": None}

        def make(g):
            i = position(g)
            first = i - i % group
            if state["first"] != first:
                following = start_decode(model, files_from(firsts[(firsts.index(first) + 1) % len(firsts)]))
                state["items"], state["next"], state["first"] = state["next"].items(), following, first
            at = (i - first) * b
            return state["items"][at:at + b]

        rate = streamed_network(model, groups, make, seconds)
        state["next"].items()
        return rate

    def early(seconds: float) -> tuple[float, float]:
        """the service feeder's early-take order: batch k + 1 decoded (launched and waited for) right after batch k is
        submitted, with batches k - 1 and k on the device, then submitted once batch k - 1's results are in"""
        decoded = {"next": decode_for_model(model, groups[0])}

        def then(i):
            decoded["next"] = decode_for_model(model, groups[(i + 1) % len(groups)])

        return streamed_network(model, groups, lambda g: decoded["next"], seconds, then)

    out = {}
    out["engine_images_per_s"], _ = stream(lambda g: crops)
    out["device_decode_network_images_per_s"], out["device_decode_network_cpu_ms"] = stream(device_decoded)
    ahead(0.2)
    out["decode_ahead_network_images_per_s"], out["decode_ahead_network_cpu_ms"] = ahead(args.seconds)
    print(f"device decode launched a launch sequence ({group} batches) ahead + network: "
          f"{out['decode_ahead_network_images_per_s']:,.0f} images/s ({out['decode_ahead_network_cpu_ms']:.3f} ms CPU "
          f"per image)")
    if group == 1:
        early(0.2)
        out["decode_early_network_images_per_s"], out["decode_early_network_cpu_ms"] = early(args.seconds)
        print(f"device decode of the next batch after each submit (the service's early take) + network: "
              f"{out['decode_early_network_images_per_s']:,.0f} images/s ({out['decode_early_network_cpu_ms']:.3f} ms "
              f"CPU per image)")
    out["cpu_decode_network_images_per_s"], out["cpu_decode_network_cpu_ms"] = stream(
        lambda g: [device_input(decode_pixels(d)) for d in g])
    print(f"VGG16 {args.network}, batch {b}, streamed: engine alone on ready crops {out['engine_images_per_s']:,.0f} "
          f"images/s; device decode ({group} batches per call) + network "
          f"{out['device_decode_network_images_per_s']:,.0f} images/s "
          f"({out['device_decode_network_cpu_ms']:.3f} ms CPU per image in this process); one CPU thread decoding "
          f"+ network {out['cpu_decode_network_images_per_s']:,.0f} images/s "
          f"({out['cpu_decode_network_cpu_ms']:.3f} ms CPU per image)")
    return out


if __name__ == "__main__":
    main()
