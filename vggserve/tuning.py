"""Autotuning: time every registered algorithm's candidates per layer shape on the present device, at a precision.

The tuner sits above the ops: it asks the registry (ops/registry.py) which algorithms can compute a layer on this
device at this precision and what their candidates are, builds each as the engine would, and times it. Every
candidate's output is compared with its family's reference (the portable 64x64/4x4 GEMM, or the tensor-core
default, both checked against numpy by the test suite); a candidate that differs is never chosen. Winners are
stored per device and precision in the JSON file `params.tuned_file()`, which `params_for` reads, so the engine
picks them up with no flags.
"""

import json
import time
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from .ops import precision as precisions, registry
from .ops.launch import MF, first_last
from .ops.registry import BuildEnv, LayerSpec
from .ops.tensorcore import rna_tf32, vec
from .runtime import caps as device_caps
from .runtime.params import params_for, shape_key, table_key, tuned_file
from .runtime.programs import ProgramCache
from .weights.spec import INPUT_SIZE, vgg16_spec

# how far a candidate may be from its family's reference, relative to the reference's largest output: FP32
# kernels differ only in summation order; TF32/FP16 ones also round their output to the storage type
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 5e-3}


@dataclass
class Trial:
    shape: str
    params: dict
    ms: float
    ok: bool


def layer_shapes(batch: int, width: float = 1.0) -> list[tuple[str, int, int, int, int]]:
    """(key, cin, cout, size, ks) of every distinct GEMM in VGG16 at this batch (convolutions, then the FC GEMMs)."""
    spec = vgg16_spec(width)
    seen, shapes, size = set(), [], INPUT_SIZE
    for c in spec.convs:
        key = shape_key(c.cin, c.cout, size)
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


class _Bench:
    """Random weights, input and an output buffer for one layer shape, laid out for a family."""

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
            x = x.astype(np.float16) if prec.half else rna_tf32(x)
        else:
            cout = layer.cout
            x = rng.standard_normal((batch, layer.cin, s, s), dtype=np.float32).astype(prec.storage)
        self.out_shape = (batch * s * s * cout,)
        self.out_dtype = prec.storage
        self.src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
        self.dst = cl.Buffer(ctx, MF.READ_WRITE, int(np.prod(self.out_shape)) * np.dtype(prec.storage).itemsize)


def _time(queue, op, bench, batch, size, repeats):
    cl.enqueue_fill_buffer(queue, bench.dst, np.uint8(0xFF), 0, bench.dst.size)  # NaN: unwritten outputs fail
    op.enqueue(queue, bench.src, bench.dst, batch, size, size)
    queue.finish()
    times = []
    for _ in range(repeats):
        first, last = first_last(op.enqueue(queue, bench.src, bench.dst, batch, size, size))
        last.wait()
        times.append((last.profile.end - first.profile.start) * 1e-6)
    out = np.empty(bench.out_shape, bench.out_dtype)
    cl.enqueue_copy(queue, out, bench.dst)
    return float(np.median(times)), out.astype(np.float32)


def tune(info, device, batch: int, limit: int = 24, repeats: int = 3, shapes=None, progress=print,
         winograd_too: bool = False, precision: str = "fp32") -> tuple[dict, list]:
    """Fastest correct parameters per layer shape: ({shape key: params}, [Trial, ...]).

    Candidates: for each registered algorithm that computes the layer on this device at this precision, its first
    `limit` candidates (Winograd's only with winograd_too). A winner that is not the portable GEMM carries
    "ALGO" (e.g. "winograd", with "WINO_M": 4 for F(4x4); "tc_gemm"); the engine then runs that layer on it.
    """
    prec = precisions.get(precision)
    caps = device_caps.of(device, info.kind, info.label)
    precisions.check(prec, caps.tensor_cores, info.label)
    family = registry.family_for(caps, prec)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device)
    env = BuildEnv(caps=caps, max_batch=batch, tables=params_for(info.kind, info.label))
    default_algo = registry.get(registry.DEFAULT_ALGO[family])
    from .ops.gemm import REFERENCE

    reference = dict(REFERENCE) if family == "portable" else default_algo.default(caps, prec)
    tol = TOLERANCE[prec.name]
    rng = np.random.default_rng(0)
    winners, trials = {}, []
    for key, cin, cout, size, ks in shapes or layer_shapes(batch):
        layer = LayerSpec("conv3x3" if ks == 3 else "fc", cin, cout, size, relu=True)
        bench = _Bench(ctx, family, prec, layer, batch, rng)

        def build(algo, p):
            extra = {"first": False} if family == "portable" else {}
            if layer.kind == "fc" and family == "portable":  # time the batch GEMM itself, not the FC composite
                from .ops.gemm import GemmLayer, KERNEL_FILE

                program = cache.build(KERNEL_FILE, algo.defines(p, prec, layer))
                tiles = {k: p[k] for k in algo.tunables if k in p}
                return GemmLayer(ctx, program, tiles, bench.weight, bench.bias, storage=prec.storage)
            return algo.make(ctx, cache, p, prec, layer, bench.weight, bench.bias, env, **extra)

        _, ref = _time(queue, build(default_algo, reference), bench, batch, size, 1)
        scale = max(float(np.abs(ref).max()), 1e-30)
        best = None
        for algo in registry.for_layer(caps, prec, layer):
            if algo.name == "winograd" and not winograd_too:
                continue
            cands = algo.candidates(caps, prec, layer)
            for p in cands[:limit] if algo.name != "winograd" else cands:
                ms, out = _time(queue, build(algo, p), bench, batch, size, repeats)
                ok = bool(np.all(np.isfinite(out)) and np.abs(out - ref).max() / scale < tol)
                trials.append(Trial(key, p, ms, ok))
                if ok and (best is None or ms < best[0]):
                    best = (ms, p)
        winners[key] = best[1]
        ref_ms = next((t.ms for t in trials if t.shape == key and t.params == reference), float("nan"))
        progress(f"{key:>14s} batch {batch} {prec.name}: best {best[0]:8.3f} ms {best[1]}  "
                 f"(reference {ref_ms:8.3f} ms)")
    return winners, trials


def store(device_label: str, winners: dict, batch: int, precision: str = "fp32") -> None:
    """Merge winners into the tuned-parameter file under this device's name and the precision's table."""
    path = tuned_file()
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    entry = table.setdefault(device_label, {})
    entry.setdefault(table_key(precision), {}).setdefault(str(batch), {}).update(winners)
    entry["tuned_on"] = time.strftime("%Y-%m-%d")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=True))
