"""The engine: a network's forward pass on one OpenCL device, with one read at the end.

It knows no network. A network (model/vgg16.py) builds its `Step`s once; the engine owns the device side that every
network needs: the context and its queues, the program cache, the lanes (below), two staging slots per lane (pinned
host memory, `staging.py`) so that two batches per lane can be in flight, the input side (float32 NCHW, uint8 crops
normalised on the device, raw images resized on the device), softmax, and the public calls (`submit`, `logits`,
`probabilities`, `classify`, `layer_times`).

A lane is an in-order queue with its own two ping-pong activation buffers, logits and scratch (`ops.launch.PerQueue`):
batches submitted one after another go to the lanes in turn, so with `lanes=2` two forward passes run on the device
at once. A small batch fills few of a GPU's compute units and each of its layers is short, so a second lane fills
the gaps (Triton's instance groups do the same with model copies; here the weights are shared). One lane (the
default) is one forward pass at a time.

A forward pass's launches are recorded once per batch size, lane and slot and replayed from then on, one C call a
launch (replay.py): the host side of a CUDA graph, which NVIDIA's OpenCL lacks.

Enqueuing is serialised by a lock; uploads run on a queue of their own. Larger inputs run in chunks of
`max_batch_size`, each chunk's upload overlapping the previous chunk's kernels; nothing is allocated per call.
"""

import threading
import time
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ..ops import precision as precisions
from ..ops.launch import MF, first_last
from ..ops.pixels import KERNEL_FILE as PIXELS_FILE, PixelInput
from ..ops.resize import DeviceResize, place_images
from ..ops.softmax import KERNEL_FILE as SOFTMAX_FILE, Softmax
from ..predictions import top_k as top_k_predictions
from ..modelinput import check_array as check_input, check_form, split_images
from ..runtime import caps as device_caps, devices as devs, warmstart
from ..errors import SettingError
from ..runtime.params import params_for
from ..runtime.programs import ProgramCache
from ..weights.spec import INPUT_SIZE, NUM_CLASSES
from ..wording import count
from .lanes import MAX_LANES, Lane
from .replay import Plans, enabled_by_default as replay_by_default
from .staging import Pending, Slot

LOGIT = np.dtype(np.float32).itemsize  # logits and probabilities are float32 whatever the precision


@dataclass
class StartupTimes:
    discovery_s: float = 0.0
    build_s: float = 0.0
    upload_s: float = 0.0
    programs_compiled: int = 0
    programs_cached: int = 0


INDEX_LIMIT = 2**31 - 1  # values in one activation buffer: the kernels' global ids and offsets are 32-bit ints


@dataclass
class Step:
    """One launch group of the forward pass: `run(queue, src, dst, n)` returns its event (or first and last),
    `flops(n)` what it computes, `out_bytes` what it writes per image; `how` says which kernel and why."""

    name: str
    run: object
    flops: object
    out_bytes: int
    how: str = ""


def _split_host_images(batch) -> tuple[dict, list]:
    """`split_images` of a batch's host inputs, with their positions in the whole batch (device-decoded inputs,
    placed by `_place_device_images`, left out)."""
    where = [i for i, d in enumerate(batch) if getattr(d, "form", None) != "device"]
    if not where:
        return {}, []
    crops, raws = split_images([batch[i] for i in where])
    return {where[i]: c for i, c in crops.items()}, [(where[i], r) for i, r in raws]


class Engine:
    resizes_on_device = True  # submit takes image ModelInputs and resizes them itself (ops/resize.py)

    def __init__(self, device: str = "auto", max_batch_size: int = 16, profile: bool = False,
                 preprocessing: str = "torchvision", program_dir=None, precision: str = precisions.DEFAULT,
                 lanes: int = 1):
        """program_dir: where compiled programs are cached (default: `programs.cache_dir()`); lanes: forward passes
        that may run on the device at once (1 to MAX_LANES; module docstring)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= MAX_LANES:
            raise SettingError(f"lanes must be an integer from 1 to {MAX_LANES}, got {lanes!r}")
        self.lane_count = lanes
        self.precision = precisions.get(precision)
        self.startup = StartupTimes()
        t0 = time.perf_counter()
        self.device_info = devs.resolve(device)
        self.device = devs.cl_device(self.device_info)
        self.caps = device_caps.of(self.device, self.device_info.kind, self.device_info.label)
        precisions.check(self.precision, self.caps.tensor_cores, self.device_info.label, fp8=self.caps.fp8)
        self.context = warmstart.take_context(self.device) or cl.Context([self.device])
        props = cl.command_queue_properties.PROFILING_ENABLE if profile else 0
        # a queue per lane; lane 0's (`queue`) also runs the load's copies
        self._lane_queues = [cl.CommandQueue(self.context, properties=props) for _ in range(lanes)]
        self.queue = self._lane_queues[0]
        self.copy_queue = cl.CommandQueue(self.context, properties=props)  # uploads, overlapping the kernels
        self.startup.discovery_s = time.perf_counter() - t0
        self.max_batch_size = int(max_batch_size)
        self.preprocessing = preprocessing
        self.params = params_for(self.device_info.kind, self.device_info.label)
        self._lock = threading.Lock()
        self.program_cache = ProgramCache(self.context, self.device, folder=program_dir)
        cache = self.program_cache
        self.pixel_op = PixelInput(self.context, cache.build(PIXELS_FILE, PixelInput.defines(preprocessing)),
                                   preprocessing)
        self.resize_op = DeviceResize(self.context, cache.build("resize.cl", {}))
        self.softmax_op = Softmax(cache.build(SOFTMAX_FILE, {}), {})
        self.steps: list[Step] = []
        # forward passes recorded once and replayed (replay.py); profiled passes (layer_times) always run the steps
        self.replay = replay_by_default()
        self.plans = Plans()

    def _allocate(self) -> None:
        """Activation, staging and output buffers for the built steps (the last one writes the logits)."""
        b = self.max_batch_size
        largest = max([s.out_bytes for s in self.steps[:-1]] or [LOGIT * NUM_CLASSES])
        per_image = max(-(-largest // self.precision.itemsize), 3 * INPUT_SIZE * INPUT_SIZE)  # elements
        if b * per_image > INDEX_LIMIT:
            raise SettingError(f"max_batch_size={b} is more than this network's kernels can index: its largest "
                             f"activation is {per_image:,} values per image and the kernels count a batch's "
                             f"values in 32-bit integers, so at most {count(INDEX_LIMIT // per_image, 'image')} "
                             "per batch")
        def buffer(nbytes):
            return cl.Buffer(self.context, MF.READ_WRITE, nbytes)

        self.lanes = [Lane(q, buffer(b * largest), buffer(b * largest), buffer(LOGIT * b * NUM_CLASSES),
                           buffer(LOGIT * b * NUM_CLASSES)) for q in self._lane_queues]
        # slot i is lane i % lanes's: batches go to the lanes in turn, two of them per lane in flight
        self.slots = [Slot(self.context, self.queue, b) for _ in range(2 * self.lane_count)]
        for i, slot in enumerate(self.slots):
            slot.lane = self.lanes[i % self.lane_count]
        self._turn = 0

    def _finish_startup(self, t_upload: float, built_before: float) -> None:
        self.queue.finish()
        cache = self.program_cache
        cache.finish()
        self.startup.upload_s = time.perf_counter() - t_upload - (cache.seconds - built_before)
        self.startup.build_s = cache.seconds
        self.startup.programs_compiled, self.startup.programs_cached = cache.compiles, cache.hits

    # ---- the forward pass ---------------------------------------------------------------------------------
    def _enqueue_forward(self, lane: Lane, src, n: int, events: list | None):
        """Every step for n <= max_batch_size images already in `src`, on `lane`; logits end in lane.logits: replayed
        (replay.py) unless profiled or `replay` is off."""
        if events is None and self.replay:
            self.plans.run(*self._pass(lane, src, n))
        else:
            self._run_steps(lane, src, n, events)

    def _pass(self, lane: Lane, src, n: int) -> tuple:
        """A forward pass as `Plans` takes it: (key, queue, the steps that make its launches)."""
        return (id(lane), id(src), n), lane.queue, lambda: self._run_steps(lane, src, n, None)

    def prepare_replays(self) -> int:
        """Record the forward pass of every batch size on every lane and slot now (replay.py), so that no batch of a
        service pays a recording (0.7-0.9 ms each on an H200) when its size first comes; nothing runs on the device.
        Only where all of them fit the plans' LIMIT, else the full batch and batch 1. Returns how many were made."""
        if not self.replay:
            return 0
        sizes = range(1, self.max_batch_size + 1)
        if len(self.slots) * len(sizes) > self.plans.LIMIT:
            sizes = sorted({1, self.max_batch_size})
        made = 0
        with self._lock:
            self._check_open()
            for slot in self.slots:
                for n in sizes:
                    made += self.plans.record(*self._pass(slot.lane, slot.input, n))
        return made

    def _run_steps(self, lane: Lane, src, n: int, events: list | None):
        other, queue = (lane.ping, lane.pong), lane.queue
        flip, last = 0, len(self.steps) - 1
        for i, step in enumerate(self.steps):
            dst = lane.logits if i == last else other[flip]
            ev = step.run(queue, src, dst, n)
            if events is not None:
                events.append((step.name, ev, step.flops(n)))
            src, flip = dst, flip ^ 1

    def submit(self, x: np.ndarray, want: str = "logits", events: list | None = None, pinned: bool = True) -> Pending:
        """Start one batch of at most max_batch_size images and return at once; `.result()` gives its rows.

        x: normalised float32 (n, 3, 224, 224), or uint8 (n, 224, 224, 3) RGB crops, normalised on the device as
        the model's preprocessing mode says, or a list of n images, each a uint8 (224, 224, 3) crop or a
        `modelinput.ModelInput` (an image, whose Resize(256) + CenterCrop(224) the device does, bit for bit as
        `center_crop`, or a crop).
        want: "logits" or "probabilities". Two batches can be in flight; a third submit waits for the first one's
        result (kept in its Pending). pinned=False uploads straight from x (x must then stay unchanged until the
        result is in): quicker for a lone batch that nothing overlaps.
        """
        if want not in ("logits", "probabilities"):
            raise ValueError(f"want must be 'logits' or 'probabilities', got {want!r}")
        as_images = isinstance(x, (list, tuple))
        on_device = []
        if as_images:
            on_device = [(i, d) for i, d in enumerate(x) if getattr(d, "form", None) == "device"]
            crops, raws = _split_host_images(x) if on_device else split_images(x)
            n = len(x)
        else:
            x = check_input(x)
            n = x.shape[0]
        if not 1 <= n <= self.max_batch_size:
            raise ValueError(f"submit takes 1 to max_batch_size={self.max_batch_size} images, got {n}")
        with self._lock:
            self._check_open()
            slot = self.slots[self._turn]
            self._turn = (self._turn + 1) % len(self.slots)
            lane, queue = slot.lane, slot.lane.queue
            _collect(slot)  # its batch is done with the slot's staging and input buffers
            if as_images:
                uploads, placed = slot.stage_images(self.copy_queue, crops, raws) if (crops or raws) else ([], [])
            else:
                uploads, placed = [slot.stage(self.copy_queue, x, pinned)], []
            self.copy_queue.flush()
            cl.enqueue_barrier(queue, wait_for=uploads)
            if placed:
                ev = self.resize_op.enqueue(queue, slot.raw.device, placed, slot.pixels)
                if events is not None:
                    events.append(("resize", ev, 0.0))
            if on_device:
                self._place_device_images(queue, slot, on_device, events)
            if as_images or x.dtype == np.uint8:
                ev = self.pixel_op.enqueue(queue, slot.pixels, slot.input, n, INPUT_SIZE * INPUT_SIZE)
                if events is not None:
                    events.append(("pixels", ev, 0.0))
            self._enqueue_forward(lane, slot.input, n, events)
            result = lane.logits
            if want == "probabilities":
                ev = self.softmax_op.enqueue(queue, lane.logits, lane.probs, n, NUM_CLASSES)
                if events is not None:
                    events.append(("softmax", ev, 0.0))
                result = lane.probs
            read = cl.enqueue_copy(queue, slot.host_out[:n], result, is_blocking=False)
            queue.flush()
            slot.pending = Pending(slot, n, read)
            return slot.pending

    def _place_device_images(self, queue, slot, items: list, events) -> None:
        """Device-decoded inputs (decoding.device.onmodel.DeviceImage) into the slot's crops: images resized from
        their buffers, crops copied, each at its index of the batch."""
        crop_bytes = INPUT_SIZE * INPUT_SIZE * 3
        by_buffer: dict = {}
        for index, d in items:
            if d.kind == "crop":
                d.read_by(cl.enqueue_copy(queue, slot.pixels, d.buffer, byte_count=crop_bytes,
                                          src_offset=d.offset, dst_offset=index * crop_bytes))
            else:
                by_buffer.setdefault(id(d.buffer), (d, []))[1].append((d.offset, d.width, d.height, index))
        for d, placed in by_buffer.values():  # the images of one buffer share its lease: one note of the read
            ev = self.resize_op.enqueue(queue, d.buffer, placed, slot.pixels)
            d.read_by(ev)
            if events is not None:
                events.append(("resize", ev, 0.0))

    def jpeg_decoder(self):
        """(JpegDecoder, its queue, its lock) on this engine's context and device, made on first use: the device
        JPEG decoder (vggserve.decoding.device) sharing the engine's program cache."""
        if getattr(self, "_jpeg", None) is None:
            from ..decoding.device import JpegDecoder

            self._jpeg = (JpegDecoder(self.context, self.device, self.program_cache), cl.CommandQueue(self.context),
                          threading.Lock())
        return self._jpeg

    def resize_matches_pillow(self) -> bool:
        """Whether this device's resize gives the installed Pillow's crops, bit for bit, on probe images of both
        pass orders (resize.py follows Pillow's algorithm by version: a Pillow that changed it is caught here).
        The service checks it once before it lets front ends send raw images."""
        from PIL import Image

        from ..preprocessing import center_crop

        rng = np.random.default_rng(0)
        images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in ((500, 375), (300, 1000), (231, 97))]
        raw = np.concatenate([im.reshape(-1) for im in images])
        placed, _ = place_images(enumerate(images))
        host_out = np.empty((len(images), INPUT_SIZE, INPUT_SIZE, 3), dtype=np.uint8)
        with self._lock:
            self._check_open()
            src = cl.Buffer(self.context, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=raw)
            out = cl.Buffer(self.context, MF.READ_WRITE, host_out.nbytes)
            self.resize_op.enqueue(self.queue, src, placed, out)
            cl.enqueue_copy(self.queue, host_out, out)
            src.release()
            out.release()
        return all(np.array_equal(host_out[i], center_crop(Image.fromarray(im))) for i, im in enumerate(images))

    def _run(self, x: np.ndarray, want: str, events: list | None = None) -> np.ndarray:
        x = check_input(x)
        chunks = range(0, x.shape[0], self.max_batch_size)
        pending = [self.submit(x[s:s + self.max_batch_size], want, events, pinned=len(chunks) > 1) for s in chunks]
        if not pending:
            return np.empty((0, NUM_CLASSES), dtype=np.float32)
        return np.concatenate([p.result() for p in pending])

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Pre-softmax scores (N, 1000) for normalised float32 input (N, 3, 224, 224) (uint8 crops: the
        `_from_pixels` functions; a ValueError names them)."""
        return self._run(check_form(x, False, "logits", "logits_from_pixels"), "logits")

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Softmax of the logits, computed on the device."""
        return self._run(check_form(x, False, "probabilities", "probabilities_from_pixels"), "probabilities")

    def logits_from_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Logits for uint8 (N, 224, 224, 3) RGB centre crops (`preprocessing.center_crop`), normalised on the device
        with the model's preprocessing mode: the same input `preprocess` would give, 4x less to upload."""
        return self._run(check_form(pixels, True, "logits_from_pixels", "logits"), "logits")

    def probabilities_from_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Softmax of `logits_from_pixels`, computed on the device."""
        return self._run(check_form(pixels, True, "probabilities_from_pixels", "probabilities"), "probabilities")

    def classify(self, images, top_k: int = 5) -> list[list[dict]]:
        """PIL images, paths or encoded bytes -> per image, the top_k classes [{"index", "label", "probability"}].

        `images` is a list (or other sequence) even for one image: a lone path, bytes or PIL image is a TypeError
        (pass `[image]`). All or nothing: an image that cannot be read raises its ImageError before anything runs,
        with the message starting `images[i]: ` and the position in `.index` (to go on past bad images, open them
        first with `vggserve.images.open_image`, as `vggserve classify` and the batch job do).
        """
        from PIL import Image

        from ..preprocessing import center_crop

        _check_listed(images)
        if not images:
            return []
        pictures = [img if isinstance(img, Image.Image) else _open_listed(img, i) for i, img in enumerate(images)]
        crops = np.stack([center_crop(p) for p in pictures])
        return top_k_predictions(self.probabilities_from_pixels(crops), top_k)

    # ---- introspection ------------------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return self.device_info.label

    def kernel_plan(self) -> list[dict]:
        """Per step: its name and which kernel runs it, and why (`vggserve bench` prints this)."""
        return [{"name": s.name, "kernel": s.how} for s in self.steps]

    def layer_times(self, x: np.ndarray) -> list[tuple[str, float, float]]:
        """One profiled forward pass: (layer name, milliseconds, flops) per kernel launch (needs profile=True).
        The steps run once unprofiled first: after replays (replay.py) their own kernels have not had their
        arguments set, and setting them inside the profiled pass would put host time between a step's launches."""
        self._run(x, "logits", [])
        events: list = []
        self._run(x, "logits", events)
        out = []
        for name, ev, flops in events:
            first, last = first_last(ev)
            out.append((name, (last.profile.end - first.profile.start) * 1e-6, flops))
        return out

    def _check_open(self) -> None:
        if not getattr(self, "slots", None):
            raise RuntimeError("this model is closed (or was never built): make a new one")

    def close(self):
        """Wait for the batches in flight and release the device buffers; the model cannot be used after it."""
        with self._lock:
            if getattr(self, "plans", None) is not None:
                self.plans.clear()
            for slot in getattr(self, "slots", []):
                _collect(slot)
                slot.release(self.queue)
            self.slots = []
            for lane in getattr(self, "lanes", []):
                lane.release()
            self.lanes = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _collect(slot) -> None:
    """Wait for the batch that holds `slot`, if any. slot.pending is read once: a caller's Pending.result() in
    another thread may clear it at any moment."""
    pending = slot.pending
    if pending is not None:
        pending.result()


def _check_listed(images) -> None:
    """TypeError for one image given where `classify` takes a list: a string would be read letter by letter."""
    import os

    from PIL import Image

    if isinstance(images, (str, bytes, bytearray, memoryview, os.PathLike, Image.Image)) or hasattr(images, "read"):
        raise TypeError(f"classify takes a list of images (paths, bytes or PIL images), got one "
                        f"{type(images).__name__}: pass [image]")


def _open_listed(source, index: int):
    """open_image for the `index`-th entry of a list; its ImageError says which entry it was."""
    from ..errors import ImageError
    from ..images import open_image

    try:
        return open_image(source)
    except ImageError as exc:
        error = type(exc)(f"images[{index}]: {exc}")
        error.index = index
        raise error from None
