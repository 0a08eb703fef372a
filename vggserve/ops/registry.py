"""The registry of layer algorithms: one entry per way of computing a convolution or a fully connected layer.

An entry (an `Algorithm`) declares everything the engine and the tuner need to know about it:
- `name`, the value of "ALGO" in parameter tables ("gemm" is assumed where a table has none);
- `family`: the activation layout it reads and writes, "portable" (NCHW, any OpenCL device) or "tensorcore"
  (NHWC, NVIDIA tensor cores); a network runs in one family (`family_for`);
- `kinds` ("conv3x3", "fc"), `precisions`, `tunables` (the kernel's `#define`s), `available(caps, precision)`;
- `default(caps, precision)`, `candidates(caps, precision, layer)` for the tuner;
- `local_mem(params, precision)`: its one local-memory formula (`fits` checks it against the device);
- `make(ctx, cache, params, precision, layer, weight, bias, env)`: re-lays the weights out, builds its program and
  returns a layer object with `enqueue(queue, src, dst, n, h, w)` and `flops(n, h, w)`; the 8-bit entries (tc_gemm,
  tc_halo at precision fp8 or int8, or writing 8-bit codes at fp16) also take `in_scale`, `out_scale` and
  `out_codes` (ops/eightbit.py);
- `fuses_pool(params)`: whether this configuration can take the 2x2/2 max-pool that follows a layer into its store
  (`LayerSpec.pool`; the output is then the pooled image); `pool_fused` says whether a layer runs that way;
- `sparse`: an entry for pruned weights (ops/sparse_conv.py, sparse_fc.py, tensorcore_sparse.py), which the engine
  takes only where a layer's measured sparsity makes it win (ops/sparse_select.py) and the dense tuner leaves out.
A new algorithm is one module that registers one entry; nothing else changes.
"""

from dataclasses import dataclass, field

from .precision import Precision

FAMILIES = ("portable", "tensorcore")
_ALGORITHMS: dict = {}


@dataclass(frozen=True)
class LayerSpec:
    """What a layer computes, as algorithms see it."""

    kind: str  # "conv3x3" or "fc"
    cin: int  # input channels (conv) or features (fc), before any padding
    cout: int
    size: int = 1  # image side (1 for fc)
    relu: bool = True
    last: bool = False  # writes the logits: float32 whatever the precision
    pool: bool = False  # a 2x2, stride-2 max-pool fused into the store: writes the (size/2)^2 pooled image

    @property
    def ks(self) -> int:
        return 3 if self.kind == "conv3x3" else 1

    @property
    def shape_key(self) -> str:
        """The tuned tables' key: "CINxCOUTxSIZE"."""
        return f"{self.cin}x{self.cout}x{self.size}"


@dataclass
class BuildEnv:
    """What layers of one model share: the device's capabilities, the largest batch, workspaces by name."""

    caps: object  # runtime.caps.Caps
    max_batch: int
    relayout: object = None  # ops.relayout.DeviceRelayout, or None (weights re-laid out on the host)
    tables: dict = field(default_factory=dict)  # the device's parameter table (runtime.params.params_for)
    workspaces: dict = field(default_factory=dict)

    def workspace(self, name: str, factory):
        """The shared object `name`, made by factory() the first time it is asked for."""
        ws = self.workspaces.get(name)
        if ws is None:
            ws = self.workspaces[name] = factory()
        return ws


class Algorithm:
    name = ""
    family = "portable"
    kinds: tuple = ()
    precisions: tuple = ("fp32",)
    tunables: tuple = ()
    kernel_file = ""
    sparse = False  # True: for pruned weights only, chosen from their measured sparsity (ops/sparse_select.py)

    def available(self, caps, precision: Precision) -> bool:
        return precision.name in self.precisions

    def suits(self, max_batch: int) -> bool:
        """Whether a model whose batches go up to `max_batch` may run this entry where a table names it (a table
        tuned at batch 1 also serves models of a few images)."""
        return True

    def default(self, caps, precision: Precision) -> dict:
        raise NotImplementedError

    def candidates(self, caps, precision: Precision, layer: LayerSpec) -> list[dict]:
        return [self.default(caps, precision)]

    def variants(self, caps, precision: Precision, overrides: list[dict]) -> list[dict]:
        """`default` and then `default` updated with each of `overrides`: each set once, those that fit the device
        (a `candidates` made of a few tunables tried over the default)."""
        base = self.default(caps, precision)
        out = [base] + [{**base, **o} for o in overrides]
        return [p for i, p in enumerate(out) if p not in out[:i] and self.fits(p, caps, precision)]

    def local_mem(self, params: dict, precision: Precision) -> int:
        return 0

    def work_group_size(self, params: dict) -> int:
        return 1

    def fits(self, params: dict, caps, precision: Precision) -> bool:
        return (self.local_mem(params, precision) <= caps.local_mem
                and self.work_group_size(params) <= caps.max_work_group)

    def fuses_pool(self, params: dict) -> bool:
        """Whether `make` accepts a layer with `pool=True` under these parameters."""
        return False

    def make(self, ctx, cache, params: dict, precision: Precision, layer: LayerSpec, weight, bias, env: BuildEnv):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<algorithm {self.name} ({self.family})>"


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.family not in FAMILIES:
        raise ValueError(f"{algorithm.name}: family must be one of {FAMILIES}")
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def _load_all() -> None:
    """Import every module that registers an entry (each registers itself on import)."""
    from . import (eightbit_gemv, gemm, sparse_conv, sparse_fc, tensorcore, tensorcore_gemv,  # noqa: F401
                   tensorcore_sparse, wgmma_halo, winograd)


def get(name: str) -> Algorithm:
    _load_all()
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}: known ones are {', '.join(sorted(_ALGORITHMS))}") from None


def all_algorithms() -> list[Algorithm]:
    _load_all()
    return list(_ALGORITHMS.values())


def family_for(caps, precision: Precision) -> str:
    """Tensor cores where the precision needs them, or where the device has them and the precision is FP16;
    the portable kernels otherwise."""
    if precision.tensor_cores or (precision.half and caps.tensor_cores):
        return "tensorcore"
    return "portable"


DEFAULT_ALGO = {"portable": "gemm", "tensorcore": "tc_gemm"}


def choose(params: dict, family: str, kind: str) -> Algorithm:
    """The entry a layer's parameters name ("ALGO"), or its family's default; it must be of that family and
    compute that kind of layer (a table written for another family falls back to the default)."""
    algo = get(params.get("ALGO", DEFAULT_ALGO[family]))
    if algo.family != family or kind not in algo.kinds:
        algo = get(DEFAULT_ALGO[family])
    return algo


def pool_fused(algo: Algorithm, params: dict) -> bool:
    """Whether a convolution followed by a 2x2 max-pool runs fused: where the entry can under these parameters,
    unless they say "FUSE_POOL": 0 (a tuned table whose winner was the separate pooling kernel). Tables without the
    key (all written before fusion existed) fuse wherever the entry can."""
    return bool(params.get("FUSE_POOL", 1)) and algo.fuses_pool(params)


def for_layer(caps, precision: Precision, layer: LayerSpec, sparse: bool = False) -> list[Algorithm]:
    """Every entry that can compute `layer` on this device at this precision, in its family: the dense ones, or
    with sparse=True the sparse ones (`Algorithm.sparse`: they win only on pruned weights, ops/sparse_select.py)."""
    family = family_for(caps, precision)
    return [a for a in all_algorithms() if a.family == family and layer.kind in a.kinds
            and a.available(caps, precision) and a.sparse == sparse]
