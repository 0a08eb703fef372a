"""Autotuning: time every registered algorithm's candidates per layer shape on the present device, at a precision.

The tuner sits above the ops: it asks the registry (ops/registry.py) which algorithms can compute a layer on this
device at this precision and what their candidates are, builds each as the engine would, and times it. Every
candidate's output is compared with its family's reference (the portable 64x64/4x4 GEMM, or the tensor-core
default, both checked against numpy by the test suite); a candidate that differs is never chosen. Winners are
stored per device and precision in the JSON file `params.tuned_file()`, which `params_for` reads, so the engine
picks them up with no flags.

Where an algorithm of the family can fuse the 2x2 max-pool into a convolution's store (`Algorithm.fuses_pool`:
tc_halo), the shapes a pool follows are tuned as their own entries, "CINxCOUTxSIZE+pool": every candidate is timed
unfused (the convolution plus the separate pooling kernel) and, where it can, fused, against the pooled reference;
the winner says "FUSE_POOL": 1 or 0 (`runtime.params.conv_params_for`, `registry.pool_fused`).
"""

from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from dataclasses import replace

from .errors import KernelBuildError, VggserveError
from .ops import first_conv, nhwc, precision as precisions, registry
from .ops.launch import MF, first_last
from .ops.registry import BuildEnv, LayerSpec
from .ops.eightbit import u8_codes
from .ops.tensorcore import rna_tf32, vec
from .quant import e4m3
from .runtime import caps as device_caps
from .runtime.params import POOL_SUFFIX, params_for, shape_key, table_key, update_tuned
from .runtime.programs import ProgramCache
from .weights.spec import INPUT_SIZE, vgg16_spec

# how far a candidate may be from its family's reference, relative to the reference's largest output: FP32
# kernels differ only in summation order; TF32/FP16 ones also round their output to the storage type
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 5e-3, "fp8": 1e-2, "int8": 1e-2}  # 8-bit: one code of the largest
# the 8-bit layers' scales while timing (LayerBench's input codes, and outputs up to 28 (FP8) or 8 (INT8) unsaturated)
EIGHT_BIT_SCALES = {"fp8": {"in_scale": 1.0, "out_scale": 1 / 16}, "int8": {"in_scale": 1 / 32, "out_scale": 8 / 255}}
# FP8's codes are logarithmic, so a difference in code units says little: a candidate whose sums part from the
# reference's by a little (Hopper's e4m3 wgmma accumulates in fewer bits than FP32, conv_wg_halo.cl) moves a large
# value by one code, 2^-3 of it, and a value near zero by several. So FP8 outputs agree where every decoded value is
# within one e4m3 step (2^-3) of the reference's, or within FP8_FLOOR of the reference's largest; a layout error
# misses that on most outputs
FP8_STEP, FP8_FLOOR = 2.0 ** -3, 2.0 ** -7


def outputs_agree(prec, out: np.ndarray, want: np.ndarray, scale: float, tol: float) -> bool:
    """Whether a candidate's output (as float32: values, or 8-bit codes) agrees with the reference's: finite, and
    within tol of the reference's largest (scale), or for FP8 codes within one step (see FP8_STEP)."""
    if not np.all(np.isfinite(out)):
        return False
    if out.size == 0:
        return True
    if prec.fp8:
        a, b = e4m3.decode(out.astype(np.uint8)), e4m3.decode(want.astype(np.uint8))
        top = float(np.nanmax(np.abs(b))) if b.size else 0.0
        return bool(np.all(np.abs(a - b) <= np.maximum(FP8_STEP * np.maximum(np.abs(a), np.abs(b)), FP8_FLOOR * top)))
    return bool(np.abs(out - want).max() / scale < tol)


@dataclass
class Trial:
    shape: str
    params: dict
    ms: float
    ok: bool


def layer_shapes(batch: int, width: float = 1.0, pooled: bool = False) -> list[tuple[str, int, int, int, int]]:
    """(key, cin, cout, size, ks) of every distinct GEMM in VGG16 at this batch (convolutions, then the FC GEMMs).
    pooled: a convolution that a 2x2 max-pool follows is its own shape, keyed "CINxCOUTxSIZE+pool"."""
    spec = vgg16_spec(width)
    seen, shapes, size = set(), [], INPUT_SIZE
    for c in spec.convs:
        key = shape_key(c.cin, c.cout, size, pool=pooled and c.pool_after)
        if key not in seen:
            seen.add(key)
            shapes.append((key, c.cin, c.cout, size, 3))
        size //= 2 if c.pool_after else 1
    for f in spec.fcs:
        key = shape_key(f.fin, f.fout, 1)
        if key not in seen:
            seen.add(key)
            shapes.append((key, f.fin, f.fout, 1, 1))
    return shapes


class LayerBench:
    """Random weights, input and an output buffer for one layer shape, laid out for a family (with layer.pool, also
    a buffer for the pooled image: `pooled`, `pooled_shape`)."""

    def __init__(self, ctx, family, prec, layer: LayerSpec, batch: int, rng):
        ks = layer.ks
        fan_in = layer.cin * ks * ks
        w = rng.standard_normal((layer.cout, layer.cin, ks, ks), dtype=np.float32) * np.float32(np.sqrt(2 / fan_in))
        self.weight = w if ks == 3 else w.reshape(layer.cout, layer.cin)
        self.bias = rng.standard_normal(layer.cout, dtype=np.float32) * np.float32(0.05)
        s = layer.size
        if family == "tensorcore":
            v = vec(prec)
            cin, cout = -(-layer.cin // v) * v, -(-layer.cout // v) * v
            x = np.zeros((batch, s, s, cin), np.float32)
            x[..., :layer.cin] = rng.standard_normal((batch, s, s, layer.cin), dtype=np.float32)
            if prec.int8:  # u8 codes of |x| (8-bit layers read post-ReLU activations)
                x = u8_codes(np.abs(x), EIGHT_BIT_SCALES["int8"]["in_scale"])
            else:
                x = e4m3.encode(x) if prec.fp8 else x.astype(np.float16) if prec.half else rna_tf32(x)
        else:
            cout = layer.cout
            x = rng.standard_normal((batch, layer.cin, s, s), dtype=np.float32).astype(prec.storage)
        self.channels = cout
        self.out_shape = (batch * s * s * cout,)
        self.out_dtype = prec.storage
        self.src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
        self.dst = cl.Buffer(ctx, MF.READ_WRITE, int(np.prod(self.out_shape)) * np.dtype(prec.storage).itemsize)
        if layer.pool:  # the pooled image: what a fused candidate writes, and the separate pooling kernel
            self.pooled_shape = (batch * (s // 2) ** 2 * cout,)
            nbytes = int(np.prod(self.pooled_shape)) * np.dtype(prec.storage).itemsize
            self.pooled = cl.Buffer(ctx, MF.READ_WRITE, max(1, nbytes))


class PoolStep:
    """The separate pooling kernel (nhwc.cl maxpool_nhwc) with a layer's enqueue signature."""

    def __init__(self, pool, channels: int):
        self.pool, self.channels = pool, channels

    def enqueue(self, queue, src, dst, n, h, w):
        return self.pool.enqueue(queue, src, dst, n, self.channels, h, w)


def maxpool_nhwc(flat: np.ndarray, batch: int, size: int) -> np.ndarray:
    """numpy's 2x2/2 max-pool (floor) of a flat NHWC activation."""
    a = flat.reshape(batch, size, size, -1)[:, :size // 2 * 2, :size // 2 * 2]
    h = size // 2
    return a.reshape(batch, h, 2, h, 2, -1).max(axis=(2, 4)).reshape(-1)


def time_op(queue, op, bench, batch, size, repeats, src=None, dst=None, out_shape=None):
    """(median ms, output as float32) of op on bench's input (or src) into bench's output buffer (or dst)."""
    src = bench.src if src is None else src
    dst, out_shape = (bench.dst, bench.out_shape) if dst is None else (dst, out_shape)
    cl.enqueue_fill_buffer(queue, dst, np.uint8(0xFF), 0, dst.size)  # NaN: unwritten outputs fail
    op.enqueue(queue, src, dst, batch, size, size)
    queue.finish()
    times = []
    for _ in range(repeats):
        first, last = first_last(op.enqueue(queue, src, dst, batch, size, size))
        last.wait()
        times.append((last.profile.end - first.profile.start) * 1e-6)
    out = np.empty(out_shape, bench.out_dtype)
    cl.enqueue_copy(queue, out, dst)
    return float(np.median(times)), out.astype(np.float32)


def fusion_possible(caps, prec) -> bool:
    """Whether any candidate of this family on a 3x3 layer can fuse the pooling that follows it."""
    layer = LayerSpec("conv3x3", 64, 64, 56)
    return any(a.fuses_pool(p) for a in registry.for_layer(caps, prec, layer) for p in a.candidates(caps, prec, layer))


def select_shapes(shapes: list, only, precision: str) -> list:
    """The shapes whose keys `only` names (all of them when only is None); a key that is not there is a
    VggserveError naming those that are."""
    if only is None:
        return shapes
    unknown = sorted(set(only) - {s[0] for s in shapes})
    if unknown:
        raise VggserveError(f"unknown shape {', '.join(unknown)} at {precision}: choose from "
                            f"{', '.join(s[0] for s in shapes)}")
    return [s for s in shapes if s[0] in only]


def shapes_to_tune(info, device, batch: int, precision: str = "fp32", only=None, algos=None) -> list:
    """What `tune` times on this device at this precision: VGG16's shapes (`layer_shapes`, "+pool" ones where the
    family can fuse the pooling), or those of them that `only` names. Refuses, before anything is timed, a precision
    the device cannot run, a shape key that is not one of them and registry entries (`algos`) that compute none of
    them (VggserveError)."""
    prec = precisions.get(precision)
    caps = device_caps.of(device, info.kind, info.label)
    precisions.check(prec, caps.tensor_cores, info.label, fp8=caps.fp8)
    shapes = select_shapes(layer_shapes(batch, pooled=fusion_possible(caps, prec)), only, prec.name)
    if algos is not None:
        check_algos(algos, caps, prec, shapes, info.label)
    return shapes


def check_algos(algos, caps, prec, shapes, label: str) -> None:
    """Refuse, in one line, a list of registry entries of which one is unknown or computes none of these shapes."""
    usable = set()
    for _, cin, cout, size, ks in shapes:
        layer = LayerSpec("conv3x3" if ks == 3 else "fc", cin, cout, size, relu=True)
        usable.update(a.name for a in registry.for_layer(caps, prec, layer))
    wrong = [a for a in algos if a not in usable]
    if wrong:
        raise VggserveError(f"--algos {','.join(wrong)}: no such entry computes these shapes at {prec.name} on "
                            f"{label}; choose from {', '.join(sorted(usable))}")


def tune(info, device, batch: int, limit: int = 24, repeats: int = 3, shapes=None, progress=print,
         winograd_too: bool = False, precision: str = "fp32", only=None, algos=None) -> tuple[dict, list]:
    """Fastest correct parameters per layer shape: ({shape key: params}, [Trial, ...]).

    Candidates: for each registered algorithm that computes the layer on this device at this precision, its first
    `limit` candidates (Winograd's only with winograd_too). A shape where no candidate agrees with the reference
    gets no winner (`progress` says so). A winner that is not the portable GEMM carries
    "ALGO" (e.g. "winograd", with "WINO_M": 4 for F(4x4); "tc_gemm"); the engine then runs that layer on it.
    only: the shape keys to tune, of `shapes` (default: VGG16's, `layer_shapes`); one that is not there is a
    VggserveError naming those that are.
    algos: the registry entries to time (default: every one that computes the layer); a name the registry does not
    know, or one that computes none of the shapes here, is a VggserveError naming those that do. The reference
    (the family's default entry) is built whatever they are: it is what every candidate is checked against.
    """
    prec = precisions.get(precision)
    caps = device_caps.of(device, info.kind, info.label)
    precisions.check(prec, caps.tensor_cores, info.label, fp8=caps.fp8)
    family = registry.family_for(caps, prec)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device, progress=False)  # compiles interleave with timings: `progress` reports
    env = BuildEnv(caps=caps, max_batch=batch, tables=params_for(info.kind, info.label))
    default_algo = registry.get(registry.DEFAULT_ALGO[family])
    from .ops.gemm import REFERENCE

    reference = dict(REFERENCE) if family == "portable" else default_algo.default(caps, prec)
    tol = TOLERANCE[prec.name]
    rng = np.random.default_rng(0)
    shapes = select_shapes(shapes or layer_shapes(batch, pooled=fusion_possible(caps, prec)), only, prec.name)
    if algos is not None:
        check_algos(algos, caps, prec, shapes, info.label)
    winners, trials = {}, []
    for key, cin, cout, size, ks in shapes:
        pool = key.endswith(POOL_SUFFIX)
        layer = LayerSpec("conv3x3" if ks == 3 else "fc", cin, cout, size, relu=True)
        if family == "tensorcore" and first_conv.fits(replace(layer, pool=pool), prec.floats):
            progress(f"{key:>14s} batch {batch} {prec.name}: not tuned (the engine runs it on conv_first.cl, from "
                     "the float32 input)")
            continue
        bench = LayerBench(ctx, family, prec, replace(layer, pool=pool), batch, rng)

        scales = EIGHT_BIT_SCALES.get(prec.name, {})

        def build(algo, p):
            extra = {"first": False} if family == "portable" else scales
            if layer.kind == "fc" and family == "portable":  # time the batch GEMM itself, not the FC composite
                from .ops.gemm import GemmLayer, KERNEL_FILE

                program = cache.build(KERNEL_FILE, algo.defines(p, prec, layer))
                tiles = {k: p[k] for k in algo.tunables if k in p}
                return GemmLayer(ctx, program, tiles, bench.weight, bench.bias, storage=prec.storage)
            return algo.make(ctx, cache, p, prec, layer, bench.weight, bench.bias, env, **extra)

        _, ref = time_op(queue, build(default_algo, reference), bench, batch, size, 1)
        scale = max(float(np.abs(ref).max()), 1e-30)
        pool_ms = 0.0
        if pool:  # the separate pooling kernel, timed once on the reference's output: unfused candidates pay it
            pool_ms, pooled = time_op(queue, PoolStep(nhwc.MaxPoolNhwc(cache.build(nhwc.KERNEL_FILE, nhwc.defines(prec)),
                                                                      prec), bench.channels),
                                    bench, batch, size, repeats, src=bench.dst, dst=bench.pooled,
                                    out_shape=bench.pooled_shape)
            pooled_ref = maxpool_nhwc(ref, batch, size)
            if not np.array_equal(pooled, pooled_ref):
                raise RuntimeError(f"{key}: the pooling kernel disagrees with numpy on the reference's output")
        best = None

        def judge(p, ms, out, want):
            nonlocal best
            ok = outputs_agree(prec, out, want, scale, tol)
            trials.append(Trial(key, p, ms, ok))
            if ok and (best is None or ms < best[0]):
                best = (ms, p)

        for algo in registry.for_layer(caps, prec, layer):
            if (algo.name == "winograd" and not winograd_too) or (algos is not None and algo.name not in algos):
                continue
            cands = algo.candidates(caps, prec, layer)
            for p in cands[:limit] if algo.name != "winograd" else cands:
                try:
                    op = build(algo, p)
                except KernelBuildError as exc:  # e.g. a PTX program the driver refuses (runtime/ptx.py)
                    progress(f"{key:>14s} batch {batch} {prec.name}: {algo.name} {p} failed to build, its other "
                             f"candidates skipped: {exc}")
                    break
                ms, out = time_op(queue, op, bench, batch, size, repeats)
                judge({**p, "FUSE_POOL": 0} if pool else p, ms + pool_ms, out, ref)
                # a layer that splits K at this batch: its other splits too (the same program, GROUPS_TARGET)
                for target in getattr(op, "split_targets", lambda n: [])(batch):
                    q = {**p, "GROUPS_TARGET": target}
                    ms, out = time_op(queue, build(algo, q), bench, batch, size, repeats)
                    judge({**q, "FUSE_POOL": 0} if pool else q, ms + pool_ms, out, ref)
                if pool and algo.fuses_pool(p):
                    fused = algo.make(ctx, cache, p, prec, replace(layer, pool=True), bench.weight, bench.bias, env,
                                      **scales)
                    ms, out = time_op(queue, fused, bench, batch, size, repeats, dst=bench.pooled,
                                    out_shape=bench.pooled_shape)
                    judge({**p, "FUSE_POOL": 1}, ms, out, pooled_ref)
        if best is None:  # every candidate, the reference's own parameters included, differed from the reference
            progress(f"{key:>14s} batch {batch} {prec.name}: no candidate agreed with the reference; left untuned "
                     "(the engine keeps its default for this shape)")
            continue
        winners[key] = best[1]
        ref_ms = next((t.ms for t in trials if t.shape == key and not t.params.get("FUSE_POOL")
                       and {k: v for k, v in t.params.items() if k != "FUSE_POOL"} == reference), float("nan"))
        progress(f"{key:>14s} batch {batch} {prec.name}: best {best[0]:8.3f} ms {best[1]}  "
                 f"(reference {ref_ms:8.3f} ms)")
    return winners, trials


def store(device_label: str, winners: dict, batch: int, precision: str = "fp32") -> None:
    """Merge winners into the tuned-parameter file under this device's name and the precision's table."""
    update_tuned(device_label, lambda entry: entry.setdefault(table_key(precision), {})
                 .setdefault(str(batch), {}).update(winners))
