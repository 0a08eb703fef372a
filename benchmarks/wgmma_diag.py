"""What holds a wgmma kernel back: each chosen tile of tc_wgmma, tc_halo_wgmma and wgmma_halo timed whole and with a part of its
main loop taken out (kernels' WG_DIAG; those variants compute wrong sums and are timed only), on one GPU.

    python benchmarks/wgmma_diag.py --device gpu --batch 64 [--shapes 256x256x56,512x512x28] [--precision fp16]

Variants per tile (WG_DIAG): full (0); no proxy fence (4; its result is compared with the full kernel's: a
difference means the fence is needed); no copies after the prologue (1: the wgmma side alone, with fence and
barriers); no copies and no fence (5); no wgmma (2: the copy side alone). Prints ms and TFLOP/s of each, beside the
engine's current kernel for the layer.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from wgmma_layers import open_device  # noqa: E402

VARIANTS = {"full": 0, "nofence": 4, "noload": 1, "noload+nofence": 5, "nowgmma": 2}
TILES = {"tc_wgmma": ["128x128s6k32f1", "128x128s3k64f0", "128x256s4k32f1"],
         "tc_halo_wgmma": ["8x16x128s3f0", "8x16x64s4f1"],
         "wgmma_halo": ["28x8x64r", "28x8x128r", "32x8x128r", "14x8x128r"]}


def tiles(p: dict) -> str:
    if "WGS" in p:  # wgmma_halo (weights in registers; WG_DIAG 1 leaves out its weight and patch loads)
        return f"{p['TH']}x8x{64 * p['WGS']}r"
    if "TH" in p:
        return f"{p['TH']}x{p['TW']}x{p['BN']}s{p['STAGES']}f{p.get('WG_INFLIGHT', 0)}"
    return f"{p['BM']}x{p['BN']}s{p['STAGES']}k{p['KB']}f{p.get('WG_INFLIGHT', 0)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shapes", default="64x64x224,256x256x56,512x512x28")
    ap.add_argument("--algos", default=",".join(TILES), help="entries to diagnose (default: all three)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from vggserve.errors import KernelBuildError
    from vggserve.ops import precision as precisions, registry
    from vggserve.ops.registry import LayerSpec
    from vggserve.runtime.params import conv_params_for
    from vggserve.tuning import LayerBench, layer_shapes, time_op

    info, caps, ctx, queue, cache, tables, env = open_device(args.device, args.batch)
    print(f"device: {info.label}; wgmma: {caps.wgmma}; batch {args.batch}; {args.precision}")
    prec = precisions.get(args.precision)
    default = registry.get(registry.DEFAULT_ALGO["tensorcore"]).default(caps, prec)
    rng = np.random.default_rng(0)
    only = set(args.shapes.split(","))
    rows = []
    for key, cin, cout, size, ks in layer_shapes(args.batch, pooled=False):
        if key not in only:
            continue
        layer = LayerSpec("conv3x3", cin, cout, size, relu=True)
        bench = LayerBench(ctx, "tensorcore", prec, layer, args.batch, rng)
        flops = 2.0 * args.batch * size * size * cin * cout * 9
        tf = lambda ms: flops / ms / 1e9  # noqa: E731
        now = conv_params_for(tables, cin, cout, size, args.batch, args.precision, default=default)
        now_algo = registry.choose(now, "tensorcore", layer.kind)
        if not now_algo.available(caps, prec) or now_algo.name in TILES:
            now_algo, now = registry.get("tc_gemm"), default
        op = now_algo.make(ctx, cache, now, prec, layer, bench.weight, bench.bias, env)
        now_ms, ref = time_op(queue, op, bench, args.batch, size, args.repeats)
        print(f"{key}: now {now_ms:.3f} ms {tf(now_ms):.1f} TF/s ({op.describe()})", flush=True)
        row = {"shape": key, "now_ms": now_ms, "tiles": []}
        for name, wanted in TILES.items():
            if name not in args.algos.split(","):
                continue
            algo = registry.get(name)
            for p in algo.candidates(caps, prec, layer):
                if tiles(p) not in wanted:
                    continue
                line, full_out, entry = f"  {name} {tiles(p)}:", None, {"algo": name, "tile": tiles(p)}
                for vname, diag in VARIANTS.items():
                    try:
                        cand = algo.make(ctx, cache, dict(p, WG_DIAG=diag), prec, layer, bench.weight, bench.bias,
                                         env)
                    except KernelBuildError as exc:
                        line += f" {vname} build failed ({str(exc)[:120]})"
                        continue
                    ms, out = time_op(queue, cand, bench, args.batch, size, args.repeats)
                    entry[vname] = ms
                    line += f" {vname} {ms:.3f} ms ({tf(ms):.0f})"
                    if diag == 0:
                        full_out = out
                        scale = max(float(np.abs(ref).max()), 1e-30)
                        entry["err"] = float(np.abs(out - ref).max() / scale)
                        line += f" err {entry['err']:.1e};"
                    elif diag == 4 and full_out is not None:
                        entry["nofence_same"] = bool(np.array_equal(out, full_out))
                        line += f" {'same' if entry['nofence_same'] else 'DIFFERENT'};"
                row["tiles"].append(entry)
                print(line, flush=True)
        rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": info.label, "batch": args.batch, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
