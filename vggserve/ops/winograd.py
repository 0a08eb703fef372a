"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution: host side of kernels/conv_winograd.cl (docs/winograd.md).

A 3x3 convolution (stride 1, padding 1) + bias + ReLU in three launches: input transform -> a*a batched GEMMs
(depth Cin; a = m + 2: 16 for F(2x2), 36 for F(4x4)) -> output transform. 2.25x (F(2x2)) or 4x (F(4x4)) fewer
multiplications than the direct convolution; the transformed input V and the GEMM result M live in device
workspace buffers sized ONCE at construction for `max_batch` images of `max_h` x `max_w` (larger batches run in
chunks; nothing is allocated per call).

A layer is selected per conv layer by parameters with "ALGO": "winograd" (see `conv_params_for`); the other keys
are conv_winograd.cl's #define tunables (TM, TN, TK, WM, WN, LPAD, XWG) and the output tile size "WINO_M"
(2 when absent, so tables written before F(4x4) existed keep meaning F(2x2); 4 for F(4x4, 3x3)).
"""


import numpy as np
import pyopencl as cl

from .gemm import check_tile_params, local_mem as gemm_local_mem, work_group_size
from .launch import Launch, PerQueue, round_up, upload
from .registry import Algorithm, register

MF = cl.mem_flags
ALGO = "winograd"
KERNEL_FILE = "conv_winograd.cl"

# F(2x2, 3x3) matrices (Lavin & Gray 2015), for correlation as deep-learning "convolution" computes it
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)
# F(4x4, 3x3) matrices (Lavin & Gray 2015), interpolation points 0, 1, -1, 2, -2 and infinity: A^T is the
# Vandermonde matrix of the points (p^k, k = 0..3; infinity contributes the leading coefficient), G's rows are
# [1, p, p^2] / prod_{q != p} (p - q), and B^T is what makes A^T ((G g) .* (B^T d)) the correlation of d with g
# (tests/test_winograd.py derives B^T from A^T and G and checks these)
BT4 = np.array([[4, 0, -5, 0, 1, 0],
                [0, -4, -4, 1, 1, 0],
                [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0],
                [0, 4, 0, -5, 0, 1]], dtype=np.float64)
G4 = np.array([[1 / 4, 0, 0],
               [-1 / 6, -1 / 6, -1 / 6],
               [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6],
               [0, 0, 1]], dtype=np.float64)
AT4 = np.array([[1, 1, 1, 1, 1, 0],
                [0, 1, -1, 2, -2, 0],
                [0, 1, 1, 4, 4, 0],
                [0, 1, -1, 8, -8, 1]], dtype=np.float64)
MATRICES = {2: (BT, G, AT), 4: (BT4, G4, AT4)}  # output tile side m -> (B^T, G, A^T)
TILE_SIZES = tuple(MATRICES)

# GEMM tiles as conv_gemm's reference variant (GPU) and its CPU default (PoCL vectorises 16 work-items wide;
# 128x256 tiles, 32x16 per work-item: 2-2.3x conv_gemm's CPU default on the 56..14 layers at batch 4, where
# 64x128 with 16x8 gave 1.2-1.5x); XWG = work-group size of the two transform kernels
GPU_DEFAULT = {"ALGO": ALGO, "TM": 64, "TN": 64, "TK": 16, "WM": 4, "WN": 4, "LPAD": 1, "XWG": 256}
CPU_DEFAULT = {"ALGO": ALGO, "TM": 128, "TN": 256, "TK": 16, "WM": 32, "WN": 16, "LPAD": 0, "XWG": 16}
# F(4x4) on GPUs: 128x128x8 tiles, 8x8 per work-item (the H100's tuned F(2x2) winner at batch 64; on the H100 at
# batch 256 F(4x4) with it takes 7.7 ms on 512x512 28x28, 10.8 ms with 64x64x16 / 4x4); CPUs: CPU_DEFAULT's tiles
GPU_DEFAULT4 = {"ALGO": ALGO, "TM": 128, "TN": 128, "TK": 8, "WM": 8, "WN": 8, "LPAD": 1, "XWG": 256, "WINO_M": 4}
TUNABLES = ("TM", "TN", "TK", "WM", "WN", "LPAD", "XWG", "WINO_M")


def tile_size(params: dict) -> int:
    """m of F(m x m, 3x3): params["WINO_M"], 2 when absent."""
    return int(params.get("WINO_M", 2))


def points(m: int) -> int:
    """a*a, a = m + 2: points of the transformed domain = GEMMs per layer (16 for F(2x2), 36 for F(4x4))."""
    return (m + 2) * (m + 2)


def default_params(kind: str, m: int = 2) -> dict:
    """Winograd parameters for a device kind ("gpu", "cpu", other -> gpu) and output tile side m (2 or 4).
    F(2x2) params carry no "WINO_M" key (as in the tables written before F(4x4)); F(4x4) ones carry "WINO_M": 4."""
    if m == 4 and kind != "cpu":
        p = dict(GPU_DEFAULT4)
    else:
        p = dict(CPU_DEFAULT if kind == "cpu" else GPU_DEFAULT)
        if m != 2:
            p["WINO_M"] = m
    check_params(p)
    return p


# GEMM tiles (TM, TN, TK, WM, WN) that `candidates` proposes, per device kind and tile size. CPUs: 16 work-items
# wide in N (PoCL vectorises across them), tall WM blocks; F(4x4) has 4x fewer tiles per image than F(2x2), so a
# narrower N tile too. GPUs, F(4x4): on the H100 at batch 256 (256x512x28 / 512x512x28 / 512x512x14, ms)
# 128x128x8 8x8 4.17 / 7.67 / 2.53, 128x128x4 8x8 4.47 / 8.27 / 2.72, 128x64x8 8x8 4.68 / 8.66 / 2.85,
# 64x128x8 4x8 5.21 / 9.80 / 3.22, 64x64x16 4x4 5.70 / 10.81 / 3.55, 128x128x16 8x8 5.30 / 9.79 / 3.22.
CANDIDATE_TILES = {
    ("cpu", 2): [(128, 256, 16, 32, 16), (64, 256, 16, 16, 16), (128, 256, 32, 32, 16), (64, 128, 32, 16, 8)],
    ("cpu", 4): [(128, 256, 16, 32, 16), (64, 128, 32, 16, 8)],
    ("gpu", 2): [(64, 64, 16, 4, 4), (128, 64, 16, 8, 4), (64, 128, 16, 4, 8), (128, 128, 16, 8, 8),
                 (128, 128, 8, 8, 8), (32, 64, 16, 4, 4)],
    ("gpu", 4): [(128, 128, 8, 8, 8), (128, 128, 4, 8, 8), (128, 64, 8, 8, 8), (64, 128, 8, 4, 8),
                 (64, 64, 16, 4, 4)],
}


def candidates(kind: str, local_mem: int = 1 << 30, max_wg: int = 1 << 30) -> list[dict]:
    """A few Winograd parameter sets for `vggserve tune` to time beside the conv_gemm candidates: F(2x2) ones
    (its default first), then F(4x4) ones ("WINO_M": 4); only those that fit local_mem and max_wg."""
    out = []
    for m in TILE_SIZES:
        base = default_params(kind, m)
        for tm, tn, tk, wm, wn in CANDIDATE_TILES["cpu" if kind == "cpu" else "gpu", m]:
            p = {**base, "TM": tm, "TN": tn, "TK": tk, "WM": wm, "WN": wn}
            check_params(p)
            if work_group_size(p) <= max_wg and gemm_local_mem(p) <= local_mem and base["XWG"] <= max_wg:
                out.append(p)
    return out


def is_winograd(params: dict) -> bool:
    return params.get("ALGO") == ALGO


def defines(params: dict, relu: int = 1) -> dict:
    """The #defines for conv_winograd.cl: the tunables with "ALGO" (and anything non-numeric) stripped; WINO_M
    always present (2 when absent), so F(2x2) params with and without the key build one program."""
    out = {k: v for k, v in params.items() if k != "ALGO"}
    out.setdefault("XWG", GPU_DEFAULT["XWG"])
    out["WINO_M"] = tile_size(params)
    out["RELU"] = relu
    return out


def check_params(p: dict) -> None:
    """The shape rules conv_winograd.cl relies on; ValueError naming the broken one."""
    check_tile_params(p, "winograd")
    if p.get("XWG", 1) < 1:
        raise ValueError(f"winograd params {p}: XWG must be positive")
    if tile_size(p) not in TILE_SIZES:
        raise ValueError(f"winograd params {p}: WINO_M must be one of {TILE_SIZES}")


def tiles(h: int, w: int, m: int = 2) -> tuple[int, int]:
    """(TH, TW): m x m-output tiles covering an h x w image."""
    return -(-h // m), -(-w // m)


def transform_weights(weight: np.ndarray, m: int = 2) -> np.ndarray:
    """(M, C, 3, 3) -> U (a*a, C, M) float64, U[a*i+j, c, k] = (G g[k, c] G^T)[i, j], a = m + 2."""
    g = np.asarray(weight, dtype=np.float64)
    if g.ndim != 4 or g.shape[2:] != (3, 3):
        raise ValueError(f"Winograd F({m}x{m},3x3) needs (M, C, 3, 3) weights, got {g.shape}")
    gm = MATRICES[m][1]
    u = np.einsum("ik,mckl,jl->ijcm", gm, g, gm)  # (a, a, C, M)
    return u.reshape(points(m), g.shape[1], g.shape[0])


def relayout_u(u: np.ndarray, tk: int, tm: int) -> np.ndarray:
    """U (a*a, C, M) -> zero-padded (a*a, Cpad, Mpad) float32 (the kernel's A operand, one matrix per xi)."""
    nxi, c, m = u.shape
    out = np.zeros((nxi, round_up(c, tk), round_up(m, tm)), dtype=np.float32)
    out[:, :c, :m] = u
    return out


def winograd_numpy(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, relu: bool = True,
                   dtype=np.float64, m: int = 2) -> np.ndarray:
    """The same algorithm in numpy (for tests and docs): NCHW x, (M, C, 3, 3) weight -> NCHW output, by
    F(m x m, 3x3) with the arithmetic done in `dtype`."""
    n, c, h, w = x.shape
    a = m + 2
    th, tw = tiles(h, w, m)
    xp = np.zeros((n, c, m * th + 2, m * tw + 2), dtype=dtype)
    xp[:, :, 1:h + 1, 1:w + 1] = x
    s = xp.strides
    d = np.lib.stride_tricks.as_strided(xp, (n, c, th, tw, a, a), (s[0], s[1], m * s[2], m * s[3], s[2], s[3]))
    bt_, _, at_ = (mat.astype(dtype) for mat in MATRICES[m])
    v = np.einsum("ik,nctukl,jl->ijcntu", bt_, d, bt_)                  # (a, a, C, N, TH, TW)
    u = transform_weights(weight, m).astype(dtype).reshape(a, a, c, -1)  # (a, a, C, M)
    mm = np.einsum("ijcm,ijcntu->ijmntu", u, v)                         # (a, a, M, N, TH, TW)
    y = np.einsum("ai,ijmntu,bj->nmtaub", at_, mm, at_)                 # (N, M, TH, m, TW, m)
    y = y.reshape(n, -1, m * th, m * tw)[:, :, :h, :w] + np.asarray(bias, dtype).reshape(1, -1, 1, 1)
    return np.maximum(y, 0) if relu else y


class WinogradWorkspace:
    """Device buffers for V and M, shared by layers that run one after another on a lane's in-order queue.

    `reserve` (called by each layer's constructor) grows them to the largest request; layers take `.v`/`.m` of
    their queue (`PerQueue`) at enqueue time: made on a lane's first batch, never per call.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.v, self.m = PerQueue(ctx), PerQueue(ctx)  # one of each per lane

    def reserve(self, v_floats: int, m_floats: int) -> None:
        self.v.reserve(4 * v_floats)
        self.m.reserve(4 * m_floats)

    @property
    def v_floats(self) -> int:
        return self.v.nbytes // 4

    @property
    def m_floats(self) -> int:
        return self.m.nbytes // 4

    @property
    def nbytes(self) -> int:
        return self.v.nbytes + self.m.nbytes


class WinogradLayer:
    """conv_winograd.cl: a 3x3 convolution (padding 1) + bias + ReLU for up to `max_batch` images per chunk, by
    F(2x2, 3x3) or, with params["WINO_M"] == 4, F(4x4, 3x3) (the program must be built with `defines(params)`).

    Same construction and call shape as GemmLayer. `enqueue` returns (first event, last event) of the layer's
    launches, as GemvLayer does, so that profiling (VGG16.layer_times) spans the whole layer; `events` holds
    every launch of the last call. Workspace: a*a*Cin (V) + a*a*Cout (M) floats per tile (a*a = 16 or 36) for
    max_batch images of tiles(max_h, max_w, m) tiles, own or a shared `workspace`; each buffer is capped at
    `max_buffer_bytes` (default: the device's largest allocation), fewer images per chunk if need be.
    """

    def __init__(self, ctx, program, params: dict, weight: np.ndarray, bias: np.ndarray, max_batch: int = 1,
                 max_h: int = 224, max_w: int = 224, workspace: WinogradWorkspace | None = None,
                 max_buffer_bytes: int | None = None, device_relayout=None):
        check_params(params)
        if max_batch < 1 or max_h < 1 or max_w < 1:
            raise ValueError(f"max_batch, max_h, max_w must be positive, got {max_batch}, {max_h}, {max_w}")
        self.p = dict(params)
        self.m, self.cin = weight.shape[0], weight.shape[1]
        self.tile = tile_size(params)      # m of F(m x m, 3x3)
        self.nxi = points(self.tile)       # GEMMs per chunk (16 or 36)
        if device_relayout is not None:  # layers.DeviceRelayout: transformed on the device, in float32
            self.u, (self.cpad, self.mpad) = device_relayout.winograd(weight, params["TK"], params["TM"], self.tile)
        else:
            u = relayout_u(transform_weights(weight, self.tile), params["TK"], params["TM"])
            self.cpad, self.mpad = u.shape[1], u.shape[2]
            self.u = upload(ctx, u)
        self.bias = upload(ctx, bias)
        self.k_in = Launch(cl.Kernel(program, "wino_input"))
        self.k_gemm = Launch(cl.Kernel(program, "wino_gemm"))
        self.k_out = Launch(cl.Kernel(program, "wino_output"))
        self.local = (params["TN"] // params["WN"], params["TM"] // params["WM"], 1)
        self.xwg = params.get("XWG", GPU_DEFAULT["XWG"])
        th, tw = tiles(max_h, max_w, self.tile)
        # V or M for max_batch images may exceed what one buffer can hold (CL_DEVICE_MAX_MEM_ALLOC_SIZE, a quarter
        # of the memory on NVIDIA): then fewer images per chunk, but at least one
        limit = max_buffer_bytes or min(d.max_mem_alloc_size for d in ctx.devices)
        self.max_tiles = max(th * tw, min(max_batch * th * tw, limit // (4 * self.nxi * max(self.cin, self.m))))
        self.ws = workspace if workspace is not None else WinogradWorkspace(ctx)
        self.ws.reserve(self.nxi * self.cin * self.max_tiles, self.nxi * self.m * self.max_tiles)
        self.events: list = []

    def enqueue(self, queue, src, dst, n: int, h: int, w: int):
        """3 launches per chunk of images; returns (first event, last event)."""
        th, tw = tiles(h, w, self.tile)
        t = th * tw
        per_chunk = self.max_tiles // t
        if per_chunk < 1:
            raise ValueError(f"a {h}x{w} image needs {t} tiles; this layer's workspace holds {self.max_tiles}")
        p = self.p
        self.events = []
        v, m = self.ws.v.get(queue), self.ws.m.get(queue)
        for b0 in range(0, n, per_chunk):
            nb = min(per_chunk, n - b0)
            ptiles = nb * t
            xgrid = round_up(ptiles, self.xwg)
            self.events.append(self.k_in(queue, (xgrid, self.cin), (self.xwg, 1), src, v, self.cin, h, w,
                                         tw, t, ptiles, b0))
            grid = (round_up(ptiles, p["TN"]) // p["TN"] * self.local[0], self.mpad // p["TM"] * self.local[1], self.nxi)
            self.events.append(self.k_gemm(queue, grid, self.local, self.u, v, m, self.cin, self.cpad,
                                           self.m, self.mpad, ptiles))
            self.events.append(self.k_out(queue, (xgrid, self.m), (self.xwg, 1), m, self.bias, dst, self.m,
                                          h, w, tw, t, ptiles, b0))
        if not self.events:
            return None
        return self.events[0], self.events[-1]

    def flops(self, n: int, h: int = 1, w: int = 1, ks: int = 3) -> float:
        """The DIRECT convolution's flops (so TFLOP/s compare with GemmLayer and cuDNN figures)."""
        return 2.0 * n * h * w * self.m * self.cin * ks * ks

    def gemm_flops(self, n: int, h: int, w: int) -> float:
        """Flops the a*a GEMMs actually execute (2.25x (F(2x2)) or 4x (F(4x4)) fewer than direct when m divides
        h and w)."""
        th, tw = tiles(h, w, self.tile)
        return 2.0 * self.nxi * n * th * tw * self.m * self.cin

    def describe(self) -> str:
        p = self.p
        return f"winograd F({self.tile}x{self.tile},3x3) {p['TM']}x{p['TN']}x{p['TK']} blocks {p['WM']}x{p['WN']}"


class Winograd(Algorithm):
    """conv_winograd.cl: 3x3 convolutions by F(2x2,3x3) or F(4x4,3x3), FP32 (its transforms and workspaces are
    FP32; under FP16 storage the tuner and the tables keep to conv_gemm.cl)."""

    name = ALGO
    family = "portable"
    kinds = ("conv3x3",)
    precisions = ("fp32",)
    tunables = TUNABLES
    kernel_file = KERNEL_FILE

    def default(self, caps, precision):
        return default_params(caps.kind)

    def candidates(self, caps, precision, layer):
        return candidates(caps.kind, caps.local_mem, caps.max_work_group)

    def local_mem(self, params, precision):
        return gemm_local_mem(params)

    def work_group_size(self, params):
        return max(work_group_size(params), params.get("XWG", 1))

    def make(self, ctx, cache, params, precision, layer, weight, bias, env, first: bool = False):
        workspace = env.workspace("winograd", lambda: WinogradWorkspace(ctx))
        size = layer.size
        return WinogradLayer(ctx, cache.build(KERNEL_FILE, defines(params, int(layer.relu))), params, weight, bias,
                             max_batch=env.max_batch, max_h=size, max_w=size, workspace=workspace,
                             device_relayout=env.relayout)


ALGORITHM = register(Winograd())
