"""The VGG16 engine: weights on one OpenCL device, the whole forward pass enqueued with one read at the end.

    model = VGG16.load("vgg16.safetensors", device="auto", max_batch_size=16)
    model.logits(x)                 # (N, 3, 224, 224) float32, normalised -> (N, 1000) float32
    model.probabilities_from_pixels(px)  # (N, 224, 224, 3) uint8 RGB crops, normalised on the device
    model.classify(["cat.jpg"], 5)  # -> [[{"index", "label", "probability"}, ...]]
    pending = model.submit(x); ...; pending.result()  # streaming: the next upload overlaps this batch's kernels

Device memory: weights once (re-laid out for the kernels, on the device), two ping-pong activation buffers sized
for `max_batch_size` images of the largest layer, two output buffers, and two staging slots (pinned host memory
and input buffers, `staging.py`) so that two batches can be in flight. Larger inputs run in chunks of
`max_batch_size`, each chunk's upload overlapping the previous chunk's kernels; nothing is allocated per call.
Enqueuing is serialised by a lock; the kernels run on one in-order queue, uploads on a second one.
"""

import threading
import time
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ..predictions import top_k as top_k_predictions
from ..runtime import devices as devs, warmstart
from ..runtime.params import conv_params_for, params_for
from ..runtime.programs import ProgramCache
from ..weights.spec import INPUT_SIZE, NUM_CLASSES, infer_width, vgg16_spec
from .layers import (DeviceRelayout, GemmLayer, GemvLayer, MaxPool, PixelInput, Softmax, SplitKGemm, gemm_defines,
                     gemv_span)
from ..preprocessing import RawImage
from .resize import DeviceResize, place_images
from .staging import Pending, Slot
from . import winograd

MF = cl.mem_flags


@dataclass
class StartupTimes:
    discovery_s: float = 0.0
    build_s: float = 0.0
    upload_s: float = 0.0
    programs_compiled: int = 0
    programs_cached: int = 0


def activation_sizes(spec) -> list[int]:
    """Floats per image of every activation the forward pass writes (what the ping-pong buffers must hold)."""
    sizes, size = [], INPUT_SIZE
    for c in spec.convs:
        sizes.append(c.cout * size * size)
        if c.pool_after:
            size //= 2
            sizes.append(c.cout * size * size)
    return sizes + [f.fout for f in spec.fcs]


def build_programs(cache: ProgramCache, params: dict) -> dict:
    """The programs every forward pass needs whatever its layers' parameters; each layer's GEMM or Winograd
    program is built with the layer (the cache shares one program among layers with the same parameters)."""
    gemv_defs = {k: v for k, v in params["gemv"].items() if k.startswith("GEMV_")}
    return {
        "gemv": {relu: cache.build("fc_gemv.cl", {**gemv_defs, "RELU": relu}) for relu in (0, 1)},
        "pool": cache.build("maxpool.cl", {}),
        "softmax": cache.build("softmax.cl", {}),
        "relayout": cache.build("relayout.cl", {}),
    }


def check_input(x: np.ndarray) -> np.ndarray:
    """uint8 (N, 224, 224, 3) crops as they are, anything else as contiguous float32 (N, 3, 224, 224)."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        if x.ndim != 4 or x.shape[1:] != (INPUT_SIZE, INPUT_SIZE, 3):
            raise ValueError(f"expected uint8 pixels of shape (N, {INPUT_SIZE}, {INPUT_SIZE}, 3), got {x.shape}")
        return np.ascontiguousarray(x)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 4 or x.shape[1:] != (3, INPUT_SIZE, INPUT_SIZE):
        raise ValueError(f"expected input of shape (N, 3, {INPUT_SIZE}, {INPUT_SIZE}), got {x.shape}")
    return x


class VGG16:
    resizes_on_device = True  # submit takes preprocess.RawImage images and resizes them itself (model/resize.py)

    def __init__(self, tensors: dict, device: str = "auto", max_batch_size: int = 16, profile: bool = False,
                 preprocessing: str = "torchvision", program_dir=None):
        """program_dir: where compiled programs are cached (default: `programs.cache_dir()`)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.startup = StartupTimes()
        t0 = time.perf_counter()
        self.device_info = devs.resolve(device)
        self.device = devs.cl_device(self.device_info)
        self.context = warmstart.take_context(self.device) or cl.Context([self.device])
        props = cl.command_queue_properties.PROFILING_ENABLE if profile else 0
        self.queue = cl.CommandQueue(self.context, properties=props)
        self.copy_queue = cl.CommandQueue(self.context, properties=props)  # uploads, overlapping the kernels
        self.startup.discovery_s = time.perf_counter() - t0

        self.spec = vgg16_spec(infer_width(tensors))
        self.max_batch_size = int(max_batch_size)
        self.preprocessing = preprocessing
        self.params = params_for(self.device_info.kind, self.device_info.label)
        self._lock = threading.Lock()
        self.program_cache = ProgramCache(self.context, self.device, folder=program_dir)
        self._build_programs()
        t1, built = time.perf_counter(), self.program_cache.seconds
        self._upload(tensors)  # also builds the programs of layers with tuned parameters
        self.queue.finish()
        cache = self.program_cache
        self.startup.upload_s = time.perf_counter() - t1 - (cache.seconds - built)
        self.startup.build_s = cache.seconds
        self.startup.programs_compiled, self.startup.programs_cached = cache.compiles, cache.hits

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def load(cls, weights, device: str = "auto", max_batch_size: int = 16, profile: bool = False,
             program_dir=None) -> "VGG16":
        """From a weights file (any supported format) or a dict of arrays (any supported key scheme)."""
        from ..weights import load_weights, weights_from_tensors

        loaded = weights_from_tensors(weights) if isinstance(weights, dict) else load_weights(weights)
        model = cls(loaded.tensors, device, max_batch_size, profile, preprocessing=loaded.preprocessing,
                    program_dir=program_dir)
        model._weights_loaded = loaded  # only for its lazily computed, cached sha256; tensors dropped below
        loaded.tensors = {}
        return model

    @property
    def weights_info(self) -> dict:
        """Where the weights came from: path, format, key_scheme, width, sha256 (hashed on first access)."""
        loaded = getattr(self, "_weights_loaded", None)
        if loaded is None:  # constructed directly from arrays
            return {"path": None, "format": "memory", "key_scheme": "torchvision", "width": self.spec.width,
                    "sha256": None}
        return {"path": None if loaded.path is None else str(loaded.path), "format": loaded.format,
                "key_scheme": loaded.key_scheme, "width": loaded.width, "sha256": loaded.sha256}

    def _build_programs(self):
        progs = build_programs(self.program_cache, self.params)
        self._prog_gemv = progs["gemv"]
        self._prog_pool, self._prog_softmax = progs["pool"], progs["softmax"]
        self._prog_relayout = progs["relayout"]
        self._prog_pixels = self.program_cache.build("pixels.cl", PixelInput.defines(self.preprocessing))
        self.resize_op = DeviceResize(self.context, self.program_cache.build("resize.cl", {}))

    def _gemm_program(self, p: dict, ks: int, relu: int, splitk: int = 0):
        """conv_gemm.cl specialised for one parameter set (shared by every layer that uses it)."""
        return self.program_cache.build("conv_gemm.cl", gemm_defines(p, ks, relu, splitk))

    def _upload(self, tensors: dict):
        gemv_p = self.params["gemv"]
        # fully connected layers split K until their work-groups reach twice the compute units (or the table's say)
        self.splitk_groups = int(self.params.get("splitk_groups", 2 * self.device.max_compute_units))
        on_device = DeviceRelayout(self.context, self.queue, self._prog_relayout)
        # V and M of every Winograd layer: they run one after another on the one in-order queue
        workspace = winograd.WinogradWorkspace(self.context)
        self.convs = []
        size = INPUT_SIZE
        for c in self.spec.convs:
            p = conv_params_for(self.params, c.cin, c.cout, size, self.max_batch_size)
            if winograd.is_winograd(p):  # "ALGO": "winograd" in the layer's params (docs/winograd.md)
                layer = winograd.WinogradLayer(
                    self.context, self.program_cache.build(winograd.KERNEL_FILE, winograd.defines(p)), p,
                    tensors[f"{c.name}.weight"], tensors[f"{c.name}.bias"], max_batch=self.max_batch_size,
                    max_h=size, max_w=size, workspace=workspace, device_relayout=on_device)
            else:
                layer = GemmLayer(self.context, self._gemm_program(p, 3, 1), p, tensors[f"{c.name}.weight"],
                                  tensors[f"{c.name}.bias"], device_relayout=on_device)
            self.convs.append((c, layer))
            size //= 2 if c.pool_after else 1
        self.fcs = []
        for f in self.spec.fcs:
            relu = int(f.relu)
            p = conv_params_for(self.params, f.fin, f.fout, 1, self.max_batch_size)
            gemm = GemmLayer(self.context, self._gemm_program(p, 1, relu), p, tensors[f"{f.name}.weight"],
                             tensors[f"{f.name}.bias"], m_multiple=gemv_span(gemv_p), device_relayout=on_device)
            gemv = GemvLayer(self.context, self._prog_gemv[relu], gemv_p, gemm)
            split = None  # built (and its program too) only where some batch size splits K
            if any(s > 1 for s, _ in SplitKGemm.plan(gemm, self.max_batch_size, self.splitk_groups).values()):
                split = SplitKGemm(self.context, self._gemm_program(p, 1, 0, splitk=1), self._prog_gemv[relu], gemm,
                                   self.max_batch_size, self.splitk_groups)
            self.fcs.append((f, gemm, gemv, split))
        self.pool = MaxPool(self._prog_pool, {})
        self.softmax_op = Softmax(self._prog_softmax, {})
        self.pixel_op = PixelInput(self.context, self._prog_pixels, self.preprocessing)
        on_device.close()
        b = self.max_batch_size
        largest = max(activation_sizes(self.spec))  # floats per image of the largest activation
        self.ping = cl.Buffer(self.context, MF.READ_WRITE, 4 * b * largest)
        self.pong = cl.Buffer(self.context, MF.READ_WRITE, 4 * b * largest)
        self.slots = [Slot(self.context, self.queue, b) for _ in range(2)]
        self._turn = 0
        self.logits_buf = cl.Buffer(self.context, MF.READ_WRITE, 4 * b * NUM_CLASSES)
        self.probs_buf = cl.Buffer(self.context, MF.READ_WRITE, 4 * b * NUM_CLASSES)
        self.gemv_max_batch = gemv_p["GEMV_NB"]

    # ---- the forward pass ---------------------------------------------------------------------------------
    def _enqueue_forward(self, src, n: int, events: list | None):
        """All layers for n <= max_batch_size images already in `src`; logits end in logits_buf."""
        other = (self.ping, self.pong)
        flip = 0
        size = INPUT_SIZE

        def note(name, ev, flops):
            if events is not None:
                events.append((name, ev, flops))

        for c, layer in self.convs:
            dst = other[flip]
            note(c.name, layer.enqueue(self.queue, src, dst, n, size, size), layer.flops(n, size, size))
            src, flip = dst, flip ^ 1
            if c.pool_after:
                dst = other[flip]
                note(f"pool after {c.name}", self.pool.enqueue(self.queue, src, dst, n, c.cout, size, size), 0.0)
                src, flip, size = dst, flip ^ 1, size // 2
        for i, (f, gemm, gemv, split) in enumerate(self.fcs):
            dst = self.logits_buf if i == len(self.fcs) - 1 else other[flip]
            if n <= self.gemv_max_batch:
                ev = gemv.enqueue(self.queue, src, dst, n)
            elif split is not None and split.used_for(n):
                ev = split.enqueue(self.queue, src, dst, n)
            else:
                ev = gemm.enqueue(self.queue, src, dst, n)
            note(f.name, ev, 2.0 * n * f.fin * f.fout)
            src, flip = dst, flip ^ 1

    def submit(self, x: np.ndarray, want: str = "logits", events: list | None = None, pinned: bool = True) -> Pending:
        """Start one batch of at most max_batch_size images and return at once; `.result()` gives its rows.

        x: normalised float32 (n, 3, 224, 224), or uint8 (n, 224, 224, 3) RGB crops, normalised on the device as
        the model's preprocessing mode says, or a list of n images, each a uint8 (224, 224, 3) crop or a
        `preprocess.RawImage`, whose Resize(256) + CenterCrop(224) the device does, bit for bit as `center_crop`.
        want: "logits" or "probabilities". Two batches can be in flight; a third submit waits for the first one's
        result (kept in its Pending). pinned=False uploads straight from x (x must then stay unchanged until the
        result is in): quicker for a lone batch that nothing overlaps.
        """
        if want not in ("logits", "probabilities"):
            raise ValueError(f"want must be 'logits' or 'probabilities', got {want!r}")
        as_images = isinstance(x, (list, tuple))
        if as_images:
            crops, raws = self._sort_images(x)
            n = len(x)
        else:
            x = check_input(x)
            n = x.shape[0]
        if not 1 <= n <= self.max_batch_size:
            raise ValueError(f"submit takes 1 to max_batch_size={self.max_batch_size} images, got {n}")
        with self._lock:
            slot = self.slots[self._turn]
            self._turn ^= 1
            if slot.pending is not None:
                slot.pending.result()  # its batch is done with the slot's staging and input buffers
            if as_images:
                uploads, placed = slot.stage_images(self.copy_queue, crops, raws)
            else:
                uploads, placed = [slot.stage(self.copy_queue, x, pinned)], []
            self.copy_queue.flush()
            cl.enqueue_barrier(self.queue, wait_for=uploads)
            if placed:
                ev = self.resize_op.enqueue(self.queue, slot.raw.device, placed, slot.pixels)
                if events is not None:
                    events.append(("resize", ev, 0.0))
            if as_images or x.dtype == np.uint8:
                ev = self.pixel_op.enqueue(self.queue, slot.pixels, slot.input, n, INPUT_SIZE * INPUT_SIZE)
                if events is not None:
                    events.append(("pixels", ev, 0.0))
            self._enqueue_forward(slot.input, n, events)
            result = self.logits_buf
            if want == "probabilities":
                ev = self.softmax_op.enqueue(self.queue, self.logits_buf, self.probs_buf, n, NUM_CLASSES)
                if events is not None:
                    events.append(("softmax", ev, 0.0))
                result = self.probs_buf
            read = cl.enqueue_copy(self.queue, slot.host_out[:n], result, is_blocking=False)
            self.queue.flush()
            slot.pending = Pending(slot, n, read)
            return slot.pending

    def _sort_images(self, images) -> tuple[dict, list]:
        """A batch given as a list of uint8 (224, 224, 3) crops and `preprocess.RawImage`s -> ({index: crop},
        [(index, raw pixels)]): raw images that need a resize go to the device resize, the others are cropped
        here (a crop of an image that keeps its size is a slice)."""
        crops, raws = {}, []
        for i, image in enumerate(images):
            if isinstance(image, RawImage):
                if image.needs_resize:
                    raws.append((i, image.pixels))
                    continue
                image = image.center_crop()
            crop = np.asarray(image)
            if crop.dtype != np.uint8 or crop.shape != (INPUT_SIZE, INPUT_SIZE, 3):
                raise ValueError(f"image {i} of the batch: expected a uint8 ({INPUT_SIZE}, {INPUT_SIZE}, 3) crop or a "
                                 f"RawImage, got {crop.dtype} {crop.shape}")
            crops[i] = crop
        return crops, raws

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
        """Pre-softmax scores (N, 1000) for normalised float32 input (N, 3, 224, 224)."""
        return self._run(x, "logits")

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Softmax of the logits, computed on the device."""
        return self._run(x, "probabilities")

    def logits_from_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Logits for uint8 (N, 224, 224, 3) RGB centre crops (`preprocess.center_crop`), normalised on the device
        with the model's preprocessing mode: the same input `preprocess` would give, 4x less to upload."""
        return self._run(pixels, "logits")

    def probabilities_from_pixels(self, pixels: np.ndarray) -> np.ndarray:
        return self._run(pixels, "probabilities")

    def classify(self, images, top_k: int = 5) -> list[list[dict]]:
        """PIL images, paths or encoded bytes -> per image, the top_k classes [{"index", "label", "probability"}].

        All or nothing: an image that cannot be read raises its ImageError before anything runs, with the message
        starting `images[i]: ` and the position in `.index` (to go on past bad images, open them first with
        `vggserve.images.open_image`, as `vggserve classify` and the batch job do).
        """
        from PIL import Image

        from ..preprocessing import center_crop

        if not images:
            return []
        pictures = [img if isinstance(img, Image.Image) else _open_listed(img, i) for i, img in enumerate(images)]
        crops = np.stack([center_crop(p) for p in pictures])
        return top_k_predictions(self.probabilities_from_pixels(crops), top_k)

    # ---- introspection ------------------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return self.device_info.label

    def layer_times(self, x: np.ndarray) -> list[tuple[str, float, float]]:
        """One profiled forward pass: (layer name, milliseconds, flops) per kernel launch (needs profile=True)."""
        events: list = []
        self._run(x, "logits", events)
        out = []
        for name, ev, flops in events:
            first, last = ev if isinstance(ev, tuple) else (ev, ev)
            out.append((name, (last.profile.end - first.profile.start) * 1e-6, flops))
        return out

    def close(self):
        with self._lock:
            for slot in getattr(self, "slots", []):
                if slot.pending is not None:
                    slot.pending.result()
                slot.release(self.queue)
            self.slots = []
            for attr in ("ping", "pong", "logits_buf", "probs_buf"):
                buf = getattr(self, attr, None)
                if buf is not None:
                    buf.release()
                    setattr(self, attr, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
