"""The sparse half of the tuner: the sparse kernels against the engine's own dense layers, per layer shape and
sparsity, to find where each sparse kernel wins (it sits above the engine, as tuning.py sits above the ops).

`measure` takes a dense engine (VGG16 on unpruned weights, so every dense layer is exactly the one the engine runs:
tuned GEMM, Winograd, GEMV or split-K) and, per layer shape and sparsity, builds the sparse registry entries on
magnitude-pruned copies of the same weights, and times them all with OpenCL profiling events (first launch's start
to last launch's end, median).
`curves` turns the runs into the speed-up curves `sparse_select` reads, `store` writes them to the tuned-parameter
file (so the engine uses them with no flag). benchmarks/sparse_vs_dense.py and `vggserve tune --sparse` use it.

`measure_2_4` is the FP16 tensor-core counterpart: per conv shape, the engine's dense FP16 layer against every tile
candidate of both 2:4 kernels (tc_sparse24, tc_halo_sparse24) on 2:4-pruned weights; `best_2_4` picks, per kernel,
the one candidate that wins most (geometric mean over the shapes) and its one-point curves, so the engine takes per
shape the faster kernel where it beats dense (benchmarks/sparse_tc.py, `vggserve tune --sparse --precision fp16`).
"""

import json
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyopencl as cl

from .model.reference import conv3x3_relu, maxpool2x2
from .ops import nhwc, registry
from .ops.registry import BuildEnv, LayerSpec
from .ops.launch import round_up
from .ops.sparse_select import CODEGEN, COMPRESSED, CSR, TC24_ALGOS, TC_SPARSE24
from .runtime.params import POOL_SUFFIX, shape_key, update_tuned
from .weights.prune import prune_2_4, prune_unstructured
from .weights.spec import INPUT_SIZE, vgg16_spec

MF = cl.mem_flags
SPARSITIES = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


@dataclass
class Point:
    sparsity: float
    algo: str
    ms: float | None  # None: not run (see note)
    speedup: float | None = None  # dense ms / ms
    err: float | None = None  # max |out - ref| / max |ref| against float64 (first image), if checked
    nnz: int = 0
    build_s: float | None = None  # codegen: program build + first launch, seconds
    binary_bytes: int | None = None
    weight_bytes: int | None = None  # bytes of the sparse weight format
    note: str = ""
    params: dict | None = None  # the kernel's tunables, where several were tried (2:4)

    @property
    def correct(self) -> bool:
        """Whether the output matched float64 (unchecked points count as correct): within the dense tuner's
        tolerance for the kernel's precision (tuning.TOLERANCE: FP16 for the 2:4 kernels, FP32 for the others).
        A point that is not never enters the curves, so a wrong kernel is never chosen."""
        if self.err is None:
            return True
        from .tuning import TOLERANCE

        limit = TOLERANCE["fp16" if self.algo in TC24_ALGOS else "fp32"]
        return bool(np.isfinite(self.err) and self.err < limit)


@dataclass
class LayerRun:
    shape: str  # CINxCOUTxSIZE
    layers: list  # torchvision names of the layers with this shape
    kind: str  # "conv" or "fc"
    cin: int
    cout: int
    size: int
    batch: int
    dense_ms: float
    dense_algo: str
    torch_ms: float | None = None
    points: list = field(default_factory=list)


def layer_shapes(width: float = 1.0) -> list[tuple[str, list, str, int, int, int]]:
    """(shape key, layer names, "conv"/"fc", cin, cout, size) of every distinct VGG16 layer shape, network order."""
    out, size = {}, INPUT_SIZE
    for c in vgg16_spec(width).convs:
        key = shape_key(c.cin, c.cout, size)
        out.setdefault(key, (key, [], "conv", c.cin, c.cout, size))[1].append(c.name)
        size //= 2 if c.pool_after else 1
    for f in vgg16_spec(width).fcs:
        key = shape_key(f.fin, f.fout, 1)
        out.setdefault(key, (key, [], "fc", f.fin, f.fout, 1))[1].append(f.name)
    return list(out.values())


def timed(queue, enqueue, iterations: int) -> float:
    """Median milliseconds of `enqueue()` (an event or (first, last) events) after one untimed call."""
    enqueue()
    queue.finish()
    times = []
    for _ in range(iterations):
        ev = enqueue()
        first, last = ev if isinstance(ev, tuple) else (ev, ev)
        last.wait()
        times.append((last.profile.end - first.profile.start) * 1e-6)
    return float(np.median(times))


def _dense_layer(model, name):
    """The engine's op for layer `name`, and a call (queue, src, dst, n, size) of it."""
    for spec, op in model.convs + model.fcs:
        if spec.name == name:
            return op, lambda q, s, d, n, size: op.enqueue(q, s, d, n, size, size)
    raise KeyError(name)


def _dense_run(model, name, x, dst_bytes, batch, size, iterations):
    """x uploaded (src), an output buffer of dst_bytes (dst), and the engine's dense op for layer `name` timed on
    them: (src, dst, op, milliseconds)."""
    ctx, queue = model.context, model.queue
    src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
    dst = cl.Buffer(ctx, MF.READ_WRITE, dst_bytes)
    op, run = _dense_layer(model, name)
    return src, dst, op, timed(queue, lambda: run(queue, src, dst, batch, size), iterations)


def _layer_run(key, names, kind, cin, cout, size, batch, dense_ms, op, torch_time) -> LayerRun:
    lr = LayerRun(key, names, kind, cin, cout, size, batch, dense_ms, op.describe())
    if torch_time is not None:
        lr.torch_ms = torch_time(kind, cin, cout, size, batch)
    return lr


def _torch_note(lr: LayerRun) -> str:
    return f", torch {lr.torch_ms:.3f} ms" if lr.torch_ms is not None else ""


def _shape_done(runs: list, lr: LayerRun, src, dst, on_layer) -> None:
    """Free the shape's buffers, keep its run, report the runs so far."""
    src.release()
    dst.release()
    runs.append(lr)
    if on_layer is not None:
        on_layer(runs)


def _relative_err(got, ref) -> float:
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _reference(kind, x, weight, bias, relu):
    f64 = np.float64
    if kind == "conv":
        return conv3x3_relu(x[:1].astype(f64), weight.astype(f64), bias.astype(f64))
    out = x[:1].astype(f64) @ weight.astype(f64).T + bias
    return np.maximum(out, 0) if relu else out


def measure(model, tensors: dict, batch: int, sparsities=SPARSITIES, algos=(CODEGEN, COMPRESSED, CSR),
            iterations: int = 5, codegen_max_nnz: int | None = None, check: bool = True, shapes=None,
            torch_time=None, progress=print, params: dict | None = None, on_layer=None) -> list[LayerRun]:
    """Dense vs sparse per layer shape (`shapes`: a subset of keys) and sparsity, at `batch` images.

    model: a VGG16 built with profile=True and max_batch_size >= batch on `tensors`. codegen_max_nnz: skip the
    generated kernel above this many non-zeros (its build time). torch_time(kind, cin, cout, size, batch): dense
    milliseconds of another library at the same shape, or None. params: {algo: tunables} over the defaults.
    on_layer(runs): called with the runs so far after each layer shape (to save partial results)."""
    ctx, queue, cache = model.context, model.queue, model.program_cache
    env = BuildEnv(caps=model.caps, max_batch=batch, tables=model.params)  # one pad workspace for every layer
    params = params or {}
    rng = np.random.default_rng(0)
    runs = []
    relu_of = {f.name: f.relu for f in model.spec.fcs}
    for key, names, lkind, cin, cout, size in layer_shapes(model.spec.width):
        if shapes and key not in shapes:
            continue
        weight, bias = tensors[f"{names[0]}.weight"], tensors[f"{names[0]}.bias"]
        relu = relu_of.get(names[0], True)
        layer = LayerSpec("conv3x3" if lkind == "conv" else "fc", cin, cout, size, relu=relu)
        xshape = (batch, cin, size, size) if lkind == "conv" else (batch, cin)
        x = np.maximum(rng.standard_normal(xshape, dtype=np.float32), 0)  # ReLU outputs, as most layers get
        src, dst, op, dense_ms = _dense_run(model, names[0], x, 4 * batch * cout * size * size, batch, size, iterations)
        lr = _layer_run(key, names, lkind, cin, cout, size, batch, dense_ms, op, torch_time)
        progress(f"{key:>14s} {','.join(names)}: dense {dense_ms:.3f} ms ({lr.dense_algo})" + _torch_note(lr))
        for s in sparsities:
            w = prune_unstructured(weight, s)
            ref = _reference(lkind, x, w, bias, relu) if check else None
            for algo in registry.for_layer(model.caps, model.precision, layer, sparse=True):
                if algo.name not in algos:
                    continue
                point = Point(s, algo.name, None, nnz=int(np.count_nonzero(w)))
                if algo.name == CODEGEN and codegen_max_nnz is not None and point.nnz > codegen_max_nnz:
                    point.note = f"skipped: {point.nnz} non-zeros > {codegen_max_nnz} (build time)"
                    lr.points.append(point)
                    continue
                t0 = time.perf_counter()
                sp = algo.make(ctx, cache, params.get(algo.name, {}), model.precision, layer, w, bias, env)
                call = lambda: sp.enqueue(queue, src, dst, batch, size, size)  # noqa: E731
                call()
                queue.finish()
                point.weight_bytes = getattr(sp, "format_bytes", None)
                if algo.name == CODEGEN:
                    point.build_s = round(time.perf_counter() - t0, 3)  # build (or cache) + first launch
                    point.binary_bytes = sp.binary_bytes
                point.ms = timed(queue, call, iterations)
                point.speedup = dense_ms / point.ms if point.ms > 0 else None
                if ref is not None:
                    out = np.empty((batch, cout, size, size) if lkind == "conv" else (batch, cout), np.float32)
                    cl.enqueue_copy(queue, out, dst)
                    point.err = _relative_err(out[:1], ref)
                lr.points.append(point)
                progress(f"{'':>14s}   {s:5.2f} {algo.name:18s} {point.ms:9.3f} ms  x{point.speedup:6.2f}"
                         + (f"  err {point.err:.1e}" if point.err is not None else "")
                         + (f"  build {point.build_s:.1f} s, {point.binary_bytes / 1e6:.2f} MB"
                            if algo.name == CODEGEN else "")
                         + ("" if point.correct else "  WRONG: left out of the curves"))
                sp = call = None  # the layer's buffers go before the next one is built
        _shape_done(runs, lr, src, dst, on_layer)
    return runs


def conv_runs_2_4(width: float = 1.0) -> list[tuple[str, list, int, int, int, bool]]:
    """(key, layer names, cin, cout, size, pooled) of the runs measure_2_4 makes: per conv shape, its layers that no
    pooling follows under "CINxCOUTxSIZE", and those a 2x2 max-pool follows under "CINxCOUTxSIZE+pool" (the engine
    runs such a layer and its pooling as one step where the kernel fuses them), network order."""
    spec = vgg16_spec(width)
    pooled_after = {c.name: c.pool_after for c in spec.convs}
    out = []
    for key, names, lkind, cin, cout, size in layer_shapes(width):
        if lkind != "conv":
            continue
        for pooled in (False, True):
            mine = [n for n in names if pooled_after[n] == pooled]
            if mine:
                out.append((shape_key(cin, cout, size, pool=pooled), mine, cin, cout, size, pooled))
    return out


def measure_2_4(model, tensors: dict, batch: int, iterations: int = 5, check: bool = True, shapes=None,
                torch_time=None, progress=print, candidates=None, on_layer=None) -> list[LayerRun]:
    """Dense FP16 vs the 2:4 kernels per conv shape (`shapes`: a subset of keys, `conv_runs_2_4`; a plain key takes its
    "+pool" run too) at `batch` images,
    on the weights of `tensors` pruned 2:4. model: a VGG16 at FP16 on tensor cores, profile=True, max_batch_size >=
    batch. candidates: parameter sets, each naming its kernel in "ALGO" (default: both 2:4 entries' candidates for
    the device). One Point per candidate, its kernel in `algo` and its tunables in `params`.

    A "+pool" shape is timed as the engine runs the step: the dense layer with the pooling fused where the engine
    fused it, else plus the pooling kernel; a 2:4 candidate that can fuse (`fuses_pool`: tc_halo_sparse24) with the
    pooling in its store, checked against the pooled reference, and one that cannot plus the pooling kernel."""
    ctx, queue, cache = model.context, model.queue, model.program_cache
    env = BuildEnv(caps=model.caps, max_batch=batch, tables=model.params)
    rng = np.random.default_rng(0)
    runs = []
    for key, names, cin, cout, size, pooled in conv_runs_2_4(model.spec.width):
        if shapes and key not in shapes and key.removesuffix(POOL_SUFFIX) not in shapes:  # a shape: both its runs
            continue
        weight, bias = prune_2_4(tensors[f"{names[0]}.weight"]), tensors[f"{names[0]}.bias"]
        layer = LayerSpec("conv3x3", cin, cout, size)
        cpad, cstore = round_up(cin, 8), round_up(cout, 8)
        x = np.zeros((batch, size, size, cpad), np.float16)  # NHWC, ReLU outputs, as most layers get
        x[..., :cin] = np.maximum(rng.standard_normal((batch, size, size, cin), dtype=np.float32), 0)
        dst_bytes = 2 * batch * size * size * cstore
        src, dst, op, dense_ms = _dense_run(model, names[0], x, dst_bytes, batch, size, iterations)
        dense_fused = bool(getattr(getattr(op, "layer", None), "pool", False))
        pool_ms, pooled_buf, pooled_shape = 0.0, None, (batch, size // 2, size // 2, cstore)
        if pooled:  # the separate pooling kernel, timed on the full-size output: what an unfused layer pays
            pool = nhwc.MaxPoolNhwc(cache.build(nhwc.KERNEL_FILE, nhwc.defines(model.precision)), model.precision)
            pooled_buf = cl.Buffer(ctx, MF.READ_WRITE, max(1, 2 * int(np.prod(pooled_shape))))
            pool_ms = timed(queue, lambda: pool.enqueue(queue, dst, pooled_buf, batch, cstore, size, size), iterations)
            if not dense_fused:
                dense_ms += pool_ms
        lr = _layer_run(key, names, "conv", cin, cout, size, batch, dense_ms, op, torch_time)
        progress(f"{key:>14s} {','.join(names)}: dense FP16 {dense_ms:.3f} ms ({lr.dense_algo})"
                 + (f", its pooling {'fused' if dense_fused else 'included'} (the kernel alone {pool_ms:.3f} ms)"
                    if pooled else "") + _torch_note(lr))
        ref = None
        if check:
            x0 = x[:1, :, :, :cin].astype(np.float64).transpose(0, 3, 1, 2)
            ref = conv3x3_relu(x0, weight.astype(np.float16).astype(np.float64), bias.astype(np.float64))
            if pooled:
                ref = maxpool2x2(ref)
        sparsity = 1.0 - np.count_nonzero(weight) / weight.size
        sets = candidates or [p for name in TC24_ALGOS
                              for p in registry.get(name).candidates(model.caps, model.precision, layer)]
        for params in sets:
            algo = registry.get(params.get("ALGO", TC_SPARSE24))
            fused = pooled and registry.pool_fused(algo, params)
            point = Point(round(sparsity, 4), algo.name, None, nnz=int(np.count_nonzero(weight)),
                          params={k: v for k, v in params.items() if k != "ALGO"})
            sp = algo.make(ctx, cache, params, model.precision, replace(layer, pool=fused), weight, bias, env)
            out_buf = pooled_buf if fused else dst
            call = lambda: sp.enqueue(queue, src, out_buf, batch, size, size)  # noqa: E731
            point.weight_bytes, point.note = sp.format_bytes, sp.describe()
            point.ms = timed(queue, call, iterations)
            paid = 0.0 if fused or not pooled else pool_ms
            point.speedup = dense_ms / (point.ms + paid) if point.ms > 0 else None
            if ref is not None:
                shape = pooled_shape if fused else (batch, size, size, cstore)
                out = np.empty(shape, np.float16)
                cl.enqueue_copy(queue, out, out_buf)
                got = out[:1, :, :, :cout].astype(np.float64).transpose(0, 3, 1, 2)
                if pooled and not fused:
                    got = maxpool2x2(got)
                point.err = _relative_err(got, ref)
            lr.points.append(point)
            progress(f"{'':>14s}   2:4 {point.ms:9.3f} ms{f' + pool {paid:.3f}' if paid else ''}  "
                     f"x{point.speedup:5.2f}" + (f"  err {point.err:.1e}" if point.err is not None else "")
                     + ("" if point.correct else "  WRONG: left out of the curves") + f"  {point.note}")
            sp = call = None
        if pooled_buf is not None:
            pooled_buf.release()
        _shape_done(runs, lr, src, dst, on_layer)
    return runs


def best_2_4(runs: list[LayerRun]) -> tuple[dict, dict]:
    """({algo: tunables}, curves): per 2:4 kernel that ran, its candidate with the highest geometric-mean speed-up
    over the shapes where it ran, and their curves {shape: {algo: [[sparsity, speed-up]]}} (what sparse_select
    reads: per shape it takes the faster kernel, if faster than dense)."""
    params: dict = {}
    out: dict = {}
    for name in TC24_ALGOS:
        by_params: dict = {}
        for r in runs:
            for p in r.points:
                if p.algo == name and p.speedup and p.correct:
                    by_params.setdefault(json.dumps(p.params, sort_keys=True), {})[r.shape] = p
        if not by_params:
            continue
        shapes = max(len(v) for v in by_params.values())
        complete = {k: v for k, v in by_params.items() if len(v) == shapes}
        best = max(complete, key=lambda k: float(np.mean([np.log(p.speedup) for p in complete[k].values()])))
        params[name] = json.loads(best)
        for shape, p in complete[best].items():
            out.setdefault(shape, {})[name] = [[p.sparsity, round(p.speedup, 4)]]
    return params, out


def curves(runs: list[LayerRun]) -> dict:
    """{shape: {algo: [[sparsity, speed-up], ...]}} of the points that ran (the curves sparse_select reads)."""
    out: dict = {}
    for r in runs:
        for p in r.points:
            if p.speedup is not None and p.correct:
                out.setdefault(r.shape, {}).setdefault(p.algo, []).append([p.sparsity, round(p.speedup, 4)])
    return out


def crossover(curve: list) -> float | None:
    """The lowest measured sparsity from which on the kernel beats dense at every measured sparsity above, or None."""
    points = sorted(curve)
    for i, (s, _) in enumerate(points):
        if all(x > 1.0 for _, x in points[i:]):
            return s
    return None


def store(device_label: str, measured: dict, batch: int, params: dict | None = None) -> None:
    """Merge the curves measured at `batch` into the tuned-parameter file under this device's name; params:
    {algo: tunables} for the sparse entries (as `sparse_table` reads them)."""
    def change(device_entry: dict) -> None:
        entry = device_entry.setdefault("sparse", {})
        for shape, per_algo in measured.items():
            entry.setdefault("curves", {}).setdefault(str(batch), {}).setdefault(shape, {}).update(per_algo)
        if params:
            entry.setdefault("params", {}).update(params)

    update_tuned(device_label, change)


def as_json(runs: list[LayerRun]) -> list[dict]:
    return [asdict(r) for r in runs]
