"""Which kernel a layer gets, from its measured sparsity and the tuned speed-up curves (docs/sparse.md).

    choose(table, "conv3x3", "512x512x14", batch=1, sparsity=0.9, nnz=235930) -> Choice(algo, reason)
    for_layer(tables, caps, precision, layer, weight, batch) -> Choice   (what the engine calls at load)

The table comes from `sparse_table(params, kind)`: the device kind's defaults (`DEFAULTS`), overridden by the
"sparse" entry of the tuned parameters (`vggserve tune --sparse` writes it: per batch and layer shape, each sparse
kernel's speed-up over the engine's dense kernel at the sparsities it measured). A sparse kernel is chosen only
where its speed-up at the layer's sparsity is above 1, the fastest of them; else the dense kernel. With no
measured curve for the shape, a kernel counts as winning from its default crossover sparsity on (less
SPARSITY_SLACK: a layer pruned to the crossover measures a hair below it).
The generated kernel is considered only where the layer's non-zeros are at most "codegen_max_nnz": its build
time grows with them (PoCL: ~5 ms a non-zero; docs/sparse.md).
At FP16 on tensor cores the candidates are the two 2:4 kernels (TC_SPARSE24 and TC_HALO_SPARSE24,
ops/tensorcore_sparse.py), for convolutions whose weights are 2:4 per tap (weights.prune.is_2_4); a curve has one
point, at the layer's sparsity (0.5 when every group of 4 holds 2; conv1, 3 channels a tap, keeps 2 of 3: 0.33,
below the crossovers), and the faster of the two per shape is taken. A layer that a 2x2 max-pool follows reads the
curves of "CINxCOUTxSIZE+pool" where they were measured (the pooled step: tc_halo_sparse24 fuses the pooling).
"""

import math
from dataclasses import dataclass

import numpy as np

DENSE = "dense"
CODEGEN = "sparse_codegen"
COMPRESSED = "sparse_compressed"
CSR = "sparse_csr"
TC_SPARSE24 = "tc_sparse24"
TC_HALO_SPARSE24 = "tc_halo_sparse24"
TC24_ALGOS = (TC_HALO_SPARSE24, TC_SPARSE24)  # on a tie (untuned defaults) the first
CONV_ALGOS = (CODEGEN, COMPRESSED)
FC_ALGOS = (CSR,)

# Untuned defaults. CPU (PoCL, measured on a 2-core AVX-512 Xeon at batch 1, BENCHMARKS.md): the generated kernel
# beat the tuned dense layers wherever it was built (from 0.5 sparsity on), the compressed one from 0.7-0.9
# (median 0.8), CSR FC layers from 0.5-0.9 (fc1 0.8); codegen is limited to 20 k non-zeros (a ~2 minute first
# build). GPU (an H100 against the FP32 engine's Winograd layers, batches 64 and 1, BENCHMARKS.md): the generated
# kernel wins on most layers from 0.95, the compressed one never did (1.01: never chosen by default), CSR from 0.5;
# NVIDIA's compiler takes ~1.8 ms per non-zero (108 s for 59 k), so codegen stops at 30 k (under a minute).
# Measured curves (shipped for the H100, or `vggserve tune --sparse`) replace these per layer shape.
# 2:4 (tensor cores, FP16): taken for any 2:4 layer at least 0.45 sparse (a group of 4 keeps 2; a per-tap last group
# shorter than 4, Cin not a multiple of 4, keeps up to 2 of fewer) until `vggserve tune --sparse --precision fp16`
# measures it per shape; conv1 (2 of 3 kept, 0.33) stays dense. The halo-tile 2:4 kernel likewise on the CPU (the
# emulated one, first on a tie), but on GPUs never until measured: tc_sparse24 has shipped H100 curves, it has none.
DEFAULTS = {
    "cpu": {"crossover": {CODEGEN: 0.5, COMPRESSED: 0.8, CSR: 0.8, TC_SPARSE24: 0.45, TC_HALO_SPARSE24: 0.45},
            "codegen_max_nnz": 20_000},
    "gpu": {"crossover": {CODEGEN: 0.95, COMPRESSED: 1.01, CSR: 0.5, TC_SPARSE24: 0.45, TC_HALO_SPARSE24: 1.01},
            "codegen_max_nnz": 30_000},
}
# how far below a sparsity a layer pruned to it can measure: pruning zeroes round(S x count) weights, so a layer of
# 1,728 weights pruned to 0.8 measures 0.79977 (and one pruned to 0.9 may measure 0.8999...)
SPARSITY_SLACK = 1e-3


@dataclass(frozen=True)
class Choice:
    algo: str  # DENSE or one of CONV_ALGOS / FC_ALGOS
    sparsity: float
    reason: str


def sparse_table(params: dict, kind: str) -> dict:
    """The device kind's defaults updated with the tuned "sparse" entry of `params` (if any)."""
    base = DEFAULTS["cpu" if kind == "cpu" else "gpu"]
    tuned = params.get("sparse", {})
    return {"crossover": {**base["crossover"], **tuned.get("crossover", {})},
            "codegen_max_nnz": tuned.get("codegen_max_nnz", base["codegen_max_nnz"]),
            "curves": tuned.get("curves", {}),
            "params": tuned.get("params", {})}  # {algo: tunables} over the entry's default


def speedup_at(curve: list, sparsity: float) -> float | None:
    """Linear interpolation of [(sparsity, speed-up), ...] at `sparsity`; above the measured range the last point's
    (speed-ups grow with sparsity), below it None: not measured there (e.g. codegen skipped as too big to build)."""
    points = sorted((float(s), float(x)) for s, x in curve)
    if sparsity < points[0][0] - SPARSITY_SLACK:
        return None
    sparsity = max(sparsity, points[0][0])
    for (s0, x0), (s1, x1) in zip(points, points[1:]):
        if sparsity <= s1:
            return x0 + (x1 - x0) * (sparsity - s0) / (s1 - s0) if s1 > s0 else x1
    return points[-1][1]


def _curves_for(table: dict, shape: str, batch: int) -> dict:
    """{algo: curve} measured for this shape at the batch nearest (in ratio) to `batch`, or {}."""
    by_batch = {b: c[shape] for b, c in table["curves"].items() if shape in c}
    if not by_batch:
        return {}
    nearest = min(by_batch, key=lambda b: abs(math.log(int(b)) - math.log(max(batch, 1))))
    return by_batch[nearest]


def choose(table: dict, kind: str, shape: str, batch: int, sparsity: float, nnz: int, algos=None) -> Choice:
    """The kernel for one layer ("conv3x3" or "fc") of shape key `shape` ("CINxCOUTxSIZE"), run at `batch`, among
    `algos` (default: the FP32 sparse kernels of that kind)."""
    if algos is None:
        algos = CONV_ALGOS if kind == "conv3x3" else FC_ALGOS
    curves = _curves_for(table, shape, batch)
    best, best_x, why = DENSE, 1.0, []
    for algo in algos:
        if algo == CODEGEN and nnz > table["codegen_max_nnz"]:
            why.append(f"{algo}: {nnz:,} non-zeros > {table['codegen_max_nnz']:,} (build time)")
            continue
        if algo in curves:
            x = speedup_at(curves[algo], sparsity)
            why.append(f"{algo}: {x:.2f}x tuned" if x is not None else f"{algo}: not measured this dense")
            x = x or 0.0
        else:
            cross = table["crossover"][algo]
            wins = sparsity >= cross - SPARSITY_SLACK
            # the earlier a kernel starts to win, the better
            x = 1.0 + 1e-6 + (sparsity - cross + SPARSITY_SLACK) if wins else 0.0
            why.append(f"{algo}: {'wins' if wins else 'loses'} (default crossover {cross})")
        if x > best_x:
            best, best_x = algo, x
    reason = f"sparsity {sparsity:.3f}; " + "; ".join(why)
    return Choice(best, sparsity, reason)


SAMPLE = 1 << 16  # weights looked at before counting them all


def measured(weight: np.ndarray) -> tuple[float, int]:
    """(fraction of the weights that are exactly zero, non-zero count). A layer none of whose SAMPLE evenly spaced
    weights is zero counts as unpruned, (0.0, size), without reading the rest: counting all of VGG16's 138 M weights
    would add ~0.1-0.2 s to every start, and a layer with so few zeros is dense anyway."""
    flat = np.asarray(weight).reshape(-1)
    sample = flat[::max(1, flat.size // SAMPLE)]
    if np.count_nonzero(sample) == sample.size:
        return 0.0, flat.size
    nnz = int(np.count_nonzero(flat))
    return 1.0 - nnz / max(flat.size, 1), nnz


def curve_key(table: dict, layer, pool: bool) -> str:
    """The curves' shape key for a layer: "CINxCOUTxSIZE+pool" where a 2x2 max-pool follows it and that key was
    measured (the 2:4 kernels are timed so as the engine runs the pooled step, sparse_tuning.measure_2_4), else
    "CINxCOUTxSIZE"."""
    from ..runtime.params import shape_key

    pooled = shape_key(layer.cin, layer.cout, layer.size, pool=True)
    if pool and any(pooled in shapes for shapes in table["curves"].values()):
        return pooled
    return layer.shape_key


def for_layer(tables: dict, caps, precision, layer, weight: np.ndarray, batch: int, pool: bool = False) -> Choice:
    """The engine's choice for one layer (registry.LayerSpec) from its weights' measured sparsity. FP32: the sparse
    kernels (NCHW); FP16 on tensor cores: the faster 2:4 kernel for 2:4 convolutions; anything else, and unpruned
    weights, stay dense. pool: a 2x2 max-pool follows the layer (its "+pool" curves apply, `curve_key`)."""
    tc24 = precision.name == "fp16" and caps.tensor_cores and layer.kind == "conv3x3"
    if precision.name != "fp32" and not tc24:
        return Choice(DENSE, 0.0, "")
    sparsity, nnz = measured(weight)
    if nnz == weight.size:  # unpruned
        return Choice(DENSE, 0.0, "")
    table = sparse_table(tables, caps.kind)
    if tc24:
        from ..weights.prune import is_2_4

        if not is_2_4(weight):
            return Choice(DENSE, sparsity, f"sparsity {sparsity:.3f}, not 2:4 (FP16 has no unstructured kernel)")
        return choose(table, layer.kind, curve_key(table, layer, pool), batch, sparsity, nnz, algos=TC24_ALGOS)
    return choose(table, layer.kind, layer.shape_key, batch, sparsity, nnz)
