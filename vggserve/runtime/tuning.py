"""Autotuning of conv_gemm.cl: time candidate parameter sets per layer shape on the present device.

Every candidate's output is compared with the reference variant's (64x64 tiles, 4x4 per work-item, which the
test suite checks against numpy); a candidate that differs is never chosen. Winners are stored per device in
the JSON file `params.tuned_file()`, which `params_for` reads, so the engine picks them up with no flags.
"""

import itertools
import json
import time
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ..model.layers import GemmLayer, check_conv_params, gemm_defines
from ..model import winograd
from ..weights.spec import INPUT_SIZE, vgg16_spec
from .params import GPU_DEFAULT, shape_key, tuned_file
from .programs import ProgramCache

MF = cl.mem_flags
REFERENCE = GPU_DEFAULT["conv"]


@dataclass
class Trial:
    shape: str
    params: dict
    ms: float
    ok: bool


def candidates(kind: str, local_mem: int, max_wg: int, limit: int | None = None) -> list[dict]:
    """Valid parameter sets, most promising first (by a simple heuristic), at most `limit` of them."""
    out = []
    if kind == "cpu":
        grid = itertools.product((32, 64, 128), (64, 128, 256), (16, 32, 64), (8, 16, 32), (4, 8, 16), (0,))
    else:
        grid = itertools.product((32, 64, 128), (32, 64, 128), (8, 16, 32), (2, 4, 8), (2, 4, 8), (1,))
    for tm, tn, tk, wm, wn, lpad in grid:
        p = dict(TM=tm, TN=tn, TK=tk, WM=wm, WN=wn, LPAD=lpad)
        try:
            check_conv_params(p)
        except ValueError:
            continue
        nt = (tm // wm) * (tn // wn)
        lmem = 2 * tk * (tm + tn + 2 * lpad) * 4
        if nt > max_wg or lmem > local_mem or (kind != "cpu" and (nt < 64 or wm * wn > 64)):
            continue
        if kind == "cpu" and tn // wn != 16:  # PoCL vectorises 16 work-items wide (AVX-512)
            continue
        out.append(p)
    # favour more outputs per work-item and bigger tiles, then the reference shape
    out.sort(key=lambda p: (-(p["WM"] * p["WN"]), -(p["TM"] * p["TN"]), p["TK"] != 16))
    out = [p for p in out if p != REFERENCE]
    out.insert(0, dict(REFERENCE))  # always timed: the baseline every winner is reported against
    return out[:limit] if limit else out


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


def _time_layer(ctx, queue, cache, p, weight, bias, src, dst, batch, size, ks, repeats):
    if winograd.is_winograd(p):  # 3 launches: timed from the first one's start to the last one's end
        program = cache.build(winograd.KERNEL_FILE, winograd.defines(p))
        layer = winograd.WinogradLayer(ctx, program, p, weight, bias, max_batch=batch, max_h=size, max_w=size)
    else:
        program = cache.build("conv_gemm.cl", gemm_defines(p, ks, 1))
        layer = GemmLayer(ctx, program, p, weight, bias)
    cl.enqueue_fill_buffer(queue, dst, np.float32(np.nan), 0, dst.size)  # unwritten outputs fail the check
    layer.enqueue(queue, src, dst, batch, size, size)
    queue.finish()
    times = []
    for _ in range(repeats):
        ev = layer.enqueue(queue, src, dst, batch, size, size)
        first, last = ev if isinstance(ev, tuple) else (ev, ev)
        last.wait()
        times.append((last.profile.end - first.profile.start) * 1e-6)
    out = np.empty(batch * weight.shape[0] * size * size, np.float32)
    cl.enqueue_copy(queue, out, dst)
    return float(np.median(times)), out


def tune(info, device, batch: int, limit: int = 24, repeats: int = 3, shapes=None, progress=print,
         winograd_too: bool = False) -> tuple[dict, list]:
    """Fastest correct parameters per layer shape: ({shape key: params}, [Trial, ...]).

    winograd_too: also time winograd.candidates() (conv_winograd.cl: F(2x2,3x3) ones, then F(4x4,3x3) ones) on
    the 3x3 shapes; a Winograd winner is stored with "ALGO": "winograd" (and "WINO_M": 4 if it is F(4x4)) and the
    engine then runs that layer on it (docs/winograd.md). Every candidate, F(4x4) included, must match the
    reference within 1e-4 of its largest output (F(4x4) measures ~2e-5 on VGG16's 512-channel layers).
    """
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device)
    cands = candidates(info.kind, device.local_mem_size, device.max_work_group_size, limit)
    rng = np.random.default_rng(0)
    winners, trials = {}, []
    for key, cin, cout, size, ks in shapes or layer_shapes(batch):
        weight = (rng.standard_normal((cout, cin, ks, ks), dtype=np.float32) * np.sqrt(2 / (cin * ks * ks))).astype(np.float32)
        bias = rng.standard_normal(cout, dtype=np.float32) * np.float32(0.05)
        x = rng.standard_normal((batch, cin, size, size), dtype=np.float32)
        src = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=x)
        dst = cl.Buffer(ctx, MF.READ_WRITE, 4 * batch * cout * size * size)
        _, ref = _time_layer(ctx, queue, cache, REFERENCE, weight, bias, src, dst, batch, size, ks, 1)
        scale = max(float(np.abs(ref).max()), 1e-30)
        best = None
        for p in cands + (winograd.candidates(info.kind, device.local_mem_size, device.max_work_group_size)
                          if ks == 3 and winograd_too else []):
            ms, out = _time_layer(ctx, queue, cache, p, weight, bias, src, dst, batch, size, ks, repeats)
            ok = bool(np.abs(out - ref).max() / scale < 1e-4)
            trials.append(Trial(key, p, ms, ok))
            if ok and (best is None or ms < best[0]):
                best = (ms, p)
        winners[key] = best[1]
        ref_ms = next(t.ms for t in trials if t.shape == key and t.params == REFERENCE)
        progress(f"{key:>14s} batch {batch}: best {best[0]:8.3f} ms {best[1]}  (64x64/4x4 reference {ref_ms:8.3f} ms)")
    return winners, trials


def store(device_label: str, winners: dict, batch: int) -> None:
    """Merge winners into the tuned-parameter file under this device's name."""
    path = tuned_file()
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    entry = table.setdefault(device_label, {})
    entry.setdefault("conv_by_batch", {}).setdefault(str(batch), {}).update(winners)
    entry["tuned_on"] = time.strftime("%Y-%m-%d")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=True))
