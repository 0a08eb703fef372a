"""The 2x2 max-pool fused into the halo-tile convolution (kernels/conv_tc_halo.cl, POOL=1) against the convolution
plus the separate pooling kernel (nhwc.cl maxpool_nhwc), for VGG16's five conv + pool pairs on the tensor cores.

    python3 benchmarks/tc_pool.py --device gpu --batch 64 --precisions fp16,tf32 [--tiles table|all] [--network]
    python3 benchmarks/tc_pool.py --device gpu --batch 64 --precisions fp16 --sparse24 [--tiles table|all]

Per pair and precision: the tile (the device's tuned entry for the shape, as the engine would take it, or with
--tiles all every halo tile that can fuse), then ms of the convolution alone, of the pooling kernel, their sum, and of
the fused kernel; the fused output is checked bit for bit against the unfused output pooled by the pooling kernel
(they must agree exactly). --sparse24 times the halo-tile 2:4 kernel instead (kernels/conv_tc_halo_sparse.cl, entry
tc_halo_sparse24, FP16 only) on the same weights pruned 2:4, its tile the one the engine takes (the tuned sparse
table's, else its default). --network also runs the whole network twice (as the engine builds it, fusing where the
tuned entry's tile can, and with every pair unfused through "+pool" table entries saying FUSE_POOL 0) and prints the
sum of its kernels and each pair's steps. Emulated on a CPU with
--device cpu --emulate (correctness only; a small --batch).
"""

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vggserve.ops import nhwc, precision as precisions, registry  # noqa: E402
from vggserve.ops.registry import BuildEnv, LayerSpec  # noqa: E402
from vggserve.ops.sparse_select import sparse_table  # noqa: E402
from vggserve.ops.tensorcore_sparse import HALO_DEFAULT as HALO_SPARSE_DEFAULT, HALO_NAME  # noqa: E402
from vggserve.ops.tensorcore import HALO_DEFAULT  # noqa: E402
from vggserve.runtime import caps as device_caps, devices as devs  # noqa: E402
from vggserve.runtime.params import POOL_SUFFIX, conv_params_for, params_for, shape_key, table_key  # noqa: E402
from vggserve.runtime.programs import ProgramCache  # noqa: E402
from vggserve.tuning import LayerBench, PoolStep, layer_shapes, time_op  # noqa: E402
from vggserve.weights.prune import prune_2_4  # noqa: E402


def tiles_for(args, tables, caps, prec, layer, batch):
    """[(label, params)] of fusable halo tiles to time for one shape."""
    algo = registry.get(HALO_NAME if args.sparse24 else "tc_halo")
    if args.tiles == "all":
        return [("candidate", p) for p in algo.candidates(caps, prec, layer) if algo.fuses_pool(p)]
    if args.sparse24:  # the engine's tile for a 2:4 layer: one per kernel, from the tuned sparse table
        p = {**HALO_SPARSE_DEFAULT, **sparse_table(tables, caps.kind)["params"].get(HALO_NAME, {})}
        return [("the engine's tile" if algo.fuses_pool(p) else "default (the tuned tile cannot fuse)",
                 p if algo.fuses_pool(p) else dict(HALO_SPARSE_DEFAULT))]
    p = conv_params_for(tables, layer.cin, layer.cout, layer.size, batch, prec.name, default=HALO_DEFAULT, pool=True)
    if p.get("ALGO") == "tc_halo" and algo.fuses_pool(p):
        return [("the engine's tile", p)]
    return [("default (the table's entry cannot fuse: %s)" % p.get("ALGO", "?"), dict(HALO_DEFAULT))]


def pairs(args, info, device, prec, batch):
    caps = device_caps.of(device, info.kind, info.label)
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cache = ProgramCache(ctx, device)
    tables = params_for(info.kind, info.label)
    env = BuildEnv(caps=caps, max_batch=batch, tables=tables)
    pool = nhwc.MaxPoolNhwc(cache.build(nhwc.KERNEL_FILE, nhwc.defines(prec)), prec)
    algo = registry.get(HALO_NAME if args.sparse24 else "tc_halo")
    rng = np.random.default_rng(0)
    rows, total = [], {"conv": 0.0, "pool": 0.0, "fused": 0.0}
    for key, cin, cout, size, _ in layer_shapes(batch, args.width, pooled=True):
        if not key.endswith(POOL_SUFFIX):
            continue
        layer = LayerSpec("conv3x3", cin, cout, size)
        bench = LayerBench(ctx, "tensorcore", prec, replace(layer, pool=True), batch, rng)
        if args.sparse24:
            bench.weight = prune_2_4(bench.weight)
        best = None
        for label, p in tiles_for(args, tables, caps, prec, layer, batch):
            conv_ms, conv_out = time_op(queue, algo.make(ctx, cache, p, prec, layer, bench.weight, bench.bias, env),
                                        bench, batch, size, args.reps)
            pool_ms, pooled = time_op(queue, PoolStep(pool, bench.channels), bench, batch, size, args.reps,
                                      src=bench.dst, dst=bench.pooled, out_shape=bench.pooled_shape)
            fused_op = algo.make(ctx, cache, p, prec, replace(layer, pool=True), bench.weight, bench.bias, env)
            fused_ms, fused = time_op(queue, fused_op, bench, batch, size, args.reps, dst=bench.pooled,
                                      out_shape=bench.pooled_shape)
            same = bool(np.array_equal(fused, pooled))
            row = dict(precision=prec.name, batch=batch, shape=key, tile=fused_op.describe(), source=label,
                       conv_ms=conv_ms, pool_ms=pool_ms, unfused_ms=conv_ms + pool_ms, fused_ms=fused_ms,
                       identical=same)
            rows.append(row)
            print(f"{prec.name} b{batch} {key:>16s}  conv {conv_ms:7.3f} + pool {pool_ms:6.3f} = {conv_ms + pool_ms:7.3f}"
                  f" ms | fused {fused_ms:7.3f} ms ({(conv_ms + pool_ms) / fused_ms:4.2f}x)  "
                  f"{'identical' if same else 'DIFFERENT'}  [{label}: {fused_op.describe()}]", flush=True)
            if best is None or fused_ms < best["fused_ms"]:
                best = row
        for k in total:
            total[k] += best[f"{k}_ms"] if k != "pool" else best["pool_ms"]
    print(f"{prec.name} b{batch} five conv + pool pairs: unfused {total['conv'] + total['pool']:.3f} ms "
          f"(conv {total['conv']:.3f}, pool {total['pool']:.3f}), fused {total['fused']:.3f} ms", flush=True)
    return rows


def network(info, prec, batch, reps, width):
    """Sum of the kernels of the whole network per forward pass, fused and unfused, with the per-step ms."""
    from vggserve import VGG16
    from vggserve.engine import engine as engine_module
    from vggserve.weights.init import init_weights
    from vggserve.weights.spec import vgg16_spec

    tensors = init_weights(seed=0, width=width)
    x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    original = engine_module.params_for
    out = {}
    for label in ("as the engine builds it", "unfused"):
        def patched(kind, name, label=label):
            params = original(kind, name)
            if label == "unfused":  # "+pool" entries copying what the shape would get, with fusion off
                size, table = 224, params.setdefault(table_key(prec.name), {}).setdefault(str(batch), {})
                for c in vgg16_spec(width).convs:
                    if c.pool_after:
                        p = conv_params_for(params, c.cin, c.cout, size, batch, prec.name,
                                            default=registry.get("tc_gemm").default(None, prec), pool=True)
                        table[shape_key(c.cin, c.cout, size, pool=True)] = {**p, "FUSE_POOL": 0}
                    size //= 2 if c.pool_after else 1
            return params
        engine_module.params_for = patched
        try:
            with VGG16(tensors, device=info.spec, max_batch_size=batch, profile=True, precision=prec.name) as model:
                model.logits(x)
                runs = [model.layer_times(x) for _ in range(reps)]
        finally:
            engine_module.params_for = original
        steps = [(name, float(np.median([r[i][1] for r in runs]))) for i, (name, _, _) in enumerate(runs[0])]
        out[label] = steps
        ms = dict(steps)
        pooled = [c.name for c in vgg16_spec(width).convs if c.pool_after]
        per_pair = [f"{n}+pool {ms[n + '+pool']:.3f}" if n + "+pool" in ms
                    else f"{n} {ms[n]:.3f} + pool {ms['pool after ' + n]:.3f}" for n in pooled]
        fused = sum(n + "+pool" in ms for n in pooled)
        print(f"{prec.name} b{batch} network, {label} ({fused} of {len(pooled)} pairs fused): kernels "
              f"{sum(ms.values()):.3f} ms per batch; " + ", ".join(per_pair), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--tiles", choices=("table", "all"), default="table",
                    help="the tuned table's tile per shape (default), or every halo tile that can fuse")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--width", type=float, default=1.0, help="VGG16 width (a fraction: small shapes for a CPU check)")
    ap.add_argument("--network", action="store_true", help="also the whole network, fused and unfused")
    ap.add_argument("--emulate", action="store_true", help="tensor cores emulated (VGGSERVE_EMULATE_MMA=1)")
    ap.add_argument("--sparse24", action="store_true", help="the halo-tile 2:4 kernel on 2:4-pruned weights (FP16)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.sparse24 and (args.precisions != "fp16" or args.network):
        ap.error("--sparse24 runs at --precisions fp16 only, without --network (tests/test_sparse_tc_pool.py checks "
                 "the pooled 2:4 network)")
    if args.emulate:
        os.environ["VGGSERVE_EMULATE_MMA"] = "1"
    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    print(f"device: {info.label}")
    results = {"device": info.label, "pairs": [], "network": {}}
    for name in args.precisions.split(","):
        prec = precisions.get(name)
        results["pairs"] += pairs(args, info, device, prec, args.batch)
        if args.network:
            results["network"][name] = network(info, prec, args.batch, 3, args.width)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["identical"] for r in results["pairs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
