"""One mma.sp m16n8k32 (FP16, FP32 accumulate) by one warp against numpy: does the hardware read the fragments and
the 2:4 metadata the way kernels/mma.clh (and so kernels/conv_tc_sparse.cl) packs them?

    python benchmarks/mma_sp_probe.py --device gpu [--json probe.json]     # native mma.sp on an NVIDIA GPU
    VGGSERVE_EMULATE_MMA=1 python benchmarks/mma_sp_probe.py --device cpu  # mma.clh's software model (PoCL)

A (16 x 32, exactly 2 non-zeros per chunk of 4 at random positions) and B (32 x 8) hold small integers, so every
product and sum is exact in FP32 and a result is right or wrong, never close. A is compressed by the engine's own
code (vggserve/ops/sparse24.py: values + metadata words); the probe then packs each lane's registers under the
documented convention (mma.clh's banner: PTX ISA "Matrix fragments for sparse mma.m16n8k32 with .f16") and under
the plausible alternatives, one dimension at a time and all combinations:
  holder    which words the metadata threads hold: "halves" (documented: thread 0 of a quad k 0-15, thread 1
            k 16-31, row g in bits 0-15 and row g + 8 in 16-31) or "rows" (thread 0 row g, thread 1 row g + 8, all
            32 k each)
  nibble    "low-first" (documented: the first kept position in bits 0-1) or "high-first"
  a_order   "documented" (a0 row g, a1 row g + 8, a2 row g k + 8, a3 row g + 8 k + 8) or "a1<->a2"
  b_order   "documented" (b_i = k 8i + 2t, +1) or "b1<->b2"
  selector  0 (threads 0, 1 of each quad hold the metadata) or 1 (threads 2, 3), the instruction's immediate
and, where the device's PTX accepts it, mma.sp::ordered_metadata besides mma.sp. It prints every convention's
result and which ones match. Exit status 0 when the documented convention (selector 0, mma.sp) matches, 1 if not.
Under emulation the match proves only that the model and the packing agree (and that the probe tells conventions
apart); on the GPU it is the hardware's answer.
"""

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

KERNEL_FILE = "mma_sp_probe.cl"
DIMENSIONS = {
    "holder": ("halves", "rows"),
    "nibble": ("low-first", "high-first"),
    "a_order": ("documented", "a1<->a2"),
    "b_order": ("documented", "b1<->b2"),
    "selector": (0, 1),
}
DOCUMENTED = {name: values[0] for name, values in DIMENSIONS.items()}


def operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(A 16 x 32 float16, 2 non-zeros in every chunk of 4 at random positions; B 32 x 8 float16), small integers."""
    rng = np.random.default_rng(seed)
    a = np.zeros((16, 8, 4), np.float16)
    pairs = list(itertools.combinations(range(4), 2))
    for r in range(16):
        for c in range(8):
            i, j = pairs[rng.integers(len(pairs))]
            a[r, c, [i, j]] = rng.choice([-4, -3, -2, -1, 1, 2, 3, 4], 2)
    b = rng.integers(-4, 5, (32, 8)).astype(np.float16)
    return a.reshape(16, 32), b


def _pack(lo, hi) -> int:
    return int(np.array([lo, hi], np.float16).view(np.uint32)[0])


def lane_registers(values: np.ndarray, meta_words: np.ndarray, b: np.ndarray, convention: dict) -> np.ndarray:
    """(32, 9) uint32: each lane's a0-a3, b0-b3 and metadata word under `convention` (see the module doc).
    values (16, 16) and meta_words (16,) are sparse24.compress's output for one m16n8k32 step."""
    regs = np.zeros((32, 9), np.uint32)
    a_rows = [(0, 0), (8, 0), (0, 8), (8, 8)]  # (row offset, compressed column offset) of a0..a3, documented
    if convention["a_order"] != "documented":
        a_rows = [a_rows[0], a_rows[2], a_rows[1], a_rows[3]]
    b_ks = [0, 8, 16, 24]
    if convention["b_order"] != "documented":
        b_ks = [0, 16, 8, 24]
    words = _metadata_words(meta_words, convention)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i, (dr, dc) in enumerate(a_rows):
            regs[lane, i] = _pack(values[g + dr, dc + 2 * t], values[g + dr, dc + 2 * t + 1])
        for i, k in enumerate(b_ks):
            regs[lane, 4 + i] = _pack(b[k + 2 * t, g], b[k + 2 * t + 1, g])
        sel = convention["selector"]
        if t // 2 == sel:
            regs[lane, 8] = words[2 * g + t % 2]
    return regs


def _metadata_words(meta_words, convention) -> list[int]:
    """The 16 metadata words (quad g, thread h at 2g + h) under the convention's holder and nibble order."""
    words = [int(w) for w in meta_words]
    if convention["holder"] == "rows":  # thread 0: row g, k 0-31 (8 nibbles); thread 1: row g + 8
        halves = {}
        for g in range(8):
            for h in range(2):
                w = words[2 * g + h]
                halves[(g, h)], halves[(g + 8, h)] = w & 0xFFFF, w >> 16
        words = [0] * 16
        for g in range(8):
            for h in range(2):
                row = g + 8 * h
                words[2 * g + h] = halves[(row, 0)] | (halves[(row, 1)] << 16)
    if convention["nibble"] != "low-first":
        words = [_swap_fields(w) for w in words]
    return words


def _swap_fields(word: int) -> int:
    """Every nibble's two 2-bit fields exchanged."""
    return ((word & 0x33333333) << 2) | ((word >> 2) & 0x33333333)


def accumulators(d: np.ndarray) -> np.ndarray:
    """(16, 8) D from the (32, 4) per-lane accumulator registers."""
    out = np.zeros((16, 8), np.float64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for q in range(4):
            out[g + 8 * (q // 2), 2 * t + q % 2] = d[lane, q]
    return out


def conventions(one_at_a_time: bool = False):
    """Every combination of DIMENSIONS (documented first); or the documented one and each single change."""
    if one_at_a_time:
        yield dict(DOCUMENTED)
        for name, values in DIMENSIONS.items():
            for v in values[1:]:
                yield {**DOCUMENTED, name: v}
        return
    names = list(DIMENSIONS)
    for combo in itertools.product(*(DIMENSIONS[n] for n in names)):
        yield dict(zip(names, combo))


def label(convention: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in convention.items())


def probe(device: str = "auto", seed: int = 0, one_at_a_time: bool = False, progress=print) -> dict:
    """Runs every convention on `device`; returns {"native", "device", "results": [...], "documented_ok",
    "matching": [labels]}."""
    import pyopencl as cl

    from vggserve.ops import sparse24
    from vggserve.runtime import caps as device_caps, devices as devs
    from vggserve.errors import KernelBuildError
    from vggserve.runtime.programs import ProgramCache

    info = devs.resolve(device)
    dev = devs.cl_device(info)
    caps = device_caps.of(dev, info.kind, info.label)
    native = caps.tensor_cores and not caps.emulate_mma
    emulate = int(not native)
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    cache = ProgramCache(ctx, dev)
    a, b = operands(seed)
    values, meta = sparse24.compress(a)
    assert np.array_equal(sparse24.decompress(values, meta), a)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    mf = cl.mem_flags
    d_buf = cl.Buffer(ctx, mf.WRITE_ONLY, 32 * 4 * 4)
    kernels, results = {}, []
    ops = ((0, "mma.sp"), (1, "mma.sp::ordered_metadata"))
    for ordered, op in ops:
        for conv in conventions(one_at_a_time):
            key = (conv["selector"], ordered)
            if key not in kernels:
                try:
                    prog = cache.build(KERNEL_FILE, {"MMA_EMULATE": emulate, "SP_SEL": conv["selector"],
                                                     "SP_ORDERED": ordered})
                    kernels[key] = cl.Kernel(prog, "mma_sp_probe")
                except KernelBuildError as err:
                    kernels[key] = None
                    progress(f"{op} selector {conv['selector']}: does not build here ({str(err)[:160]})")
            if kernels[key] is None:
                continue
            regs = lane_registers(values, meta[0, 0], b, conv)
            r_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=regs)
            kernels[key](queue, (32,), (32,), r_buf, d_buf)
            d = np.empty((32, 4), np.float32)
            cl.enqueue_copy(queue, d, d_buf)
            queue.finish()
            got = accumulators(d)
            err = float(np.abs(got - ref).max())
            wrong = int(np.count_nonzero(got != ref))
            results.append({"op": op, **conv, "max_abs_err": err, "wrong": wrong, "match": wrong == 0})
    documented = [r for r in results if r["op"] == "mma.sp" and all(r[k] == v for k, v in DOCUMENTED.items())]
    matching = [f"{r['op']} {label({k: r[k] for k in DIMENSIONS})}" for r in results if r["match"]]
    return {"native": native, "device": info.label, "results": results,
            "documented_ok": bool(documented and documented[0]["match"]), "matching": matching}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="gpu, cpu, auto, or an index (vggserve's device syntax)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="only the documented convention and each single change (else every combination)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    out = probe(args.device, args.seed, args.one_at_a_time)
    mode = "native mma.sp" if out["native"] else "EMULATED (mma.clh's software model: self-consistency only)"
    print(f"mma.sp m16n8k32 probe on {out['device']}: {mode}")
    print(f"{'op':26s} {'holder':7s} {'nibble':11s} {'a_order':11s} {'b_order':11s} sel  wrong/128  max|err|")
    for r in out["results"]:
        print(f"{r['op']:26s} {r['holder']:7s} {r['nibble']:11s} {r['a_order']:11s} {r['b_order']:11s} "
              f"{r['selector']:3d}  {r['wrong']:9d}  {r['max_abs_err']:8.1f}{'  MATCH' if r['match'] else ''}")
    if out["documented_ok"]:
        print("PROBE OK: the documented convention (mma.clh, ops/sparse24.py) matches: " + "; ".join(out["matching"]))
    else:
        print("PROBE MISMATCH: the documented convention is wrong here; matching conventions: "
              + ("; ".join(out["matching"]) or "none"))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if out["documented_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
