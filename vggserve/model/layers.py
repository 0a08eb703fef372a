"""Host-side wrappers of the kernels: each owns its device weights and enqueues one layer.

Every wrapper is built once (weights re-laid out and uploaded at load) and enqueued many times with no
allocation: `enqueue(queue, src, dst, n)` returns the OpenCL event of its last kernel.
"""

import os

import numpy as np
import pyopencl as cl

MF = cl.mem_flags


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def relayout(weight: np.ndarray, tk: int, tm: int) -> np.ndarray:
    """(M, K...) weights -> zero-padded (Kpad, Mpad) float32, k-major: wt[k, m] = W[m, k] (kernels' A layout)."""
    m = weight.shape[0]
    w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(m, -1)
    k = w2.shape[1]
    out = np.zeros((round_up(k, tk), round_up(m, tm)), dtype=np.float32)
    out[:k, :m] = w2.T
    return out


class Launch:
    """A kernel whose arguments are set only when they change.

    pyopencl's set_args costs about 25 us a call, as much as a small layer's kernel on a GPU; with this, a forward
    pass at an unchanged batch size sets no argument at all. Python ints become int32 kernel arguments.
    """

    __slots__ = ("kernel", "key", "args")

    def __init__(self, kernel):
        self.kernel, self.key, self.args = kernel, None, None

    def __call__(self, queue, grid, local, *args):
        key = tuple(a if isinstance(a, int) else id(a) for a in args)
        if key != self.key:
            self.kernel.set_args(*(np.int32(a) if isinstance(a, int) else a for a in args))
            self.key, self.args = key, args  # holding args keeps every id in the key alive
        return cl.enqueue_nd_range_kernel(queue, self.kernel, grid, local)


class DeviceRelayout:
    """relayout.cl: `relayout` done by the device. Uploads W as it is and transposes it there, which for VGG16's
    528 MB takes milliseconds instead of the seconds numpy's strided transpose takes on the host."""

    TILE, ROWS = 32, 8
    STAGE_FLOATS = 4 << 20  # two halves of 8 MB of pinned memory that the raw weights pass through
    COPY_THREADS = 4  # host copies into the pinned halves: one core copies at 7 GB/s on the H100's host

    def __init__(self, ctx, queue, program):
        self.ctx, self.queue = ctx, queue
        self.kernel = cl.Kernel(program, "transpose_pad")
        self.wino_kernels = {2: cl.Kernel(program, "winograd_weights"), 4: cl.Kernel(program, "winograd4_weights")}
        self._stage = None  # (buffer, pinned array), made on first use
        self._copies = [None, None]  # the last upload from each half
        self._pool = None  # copying threads (numpy lets go of the GIL while it copies), made on first use
        self._threads = max(1, min(self.COPY_THREADS, os.cpu_count() or 1))

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:] = src, split over the copying threads."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="vggserve-upload")
        step = -(-src.size // self._threads)
        list(self._pool.map(lambda s: np.copyto(dst[s:s + step], src[s:s + step]), range(0, src.size, step)))

    def upload(self, array: np.ndarray):
        """A device copy of `array` (float32) made through pinned memory: chunk i+1 is copied into one half while
        chunk i travels from the other, so the upload runs at DMA speed instead of a pageable copy's."""
        from .staging import pinned

        flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        dst = cl.Buffer(self.ctx, MF.READ_ONLY, 4 * max(flat.size, 1))
        if self._stage is None:
            self._stage = pinned(self.ctx, self.queue, (self.STAGE_FLOATS,), np.float32)
        half = self.STAGE_FLOATS // 2
        for i, start in enumerate(range(0, flat.size, half)):
            part = flat[start:start + half]
            side = i % 2
            if self._copies[side] is not None:
                self._copies[side].wait()  # that half's previous chunk has left
            host = self._stage[1][side * half:side * half + part.size]
            self._copy(host, part)
            self._copies[side] = cl.enqueue_copy(self.queue, dst, host, dst_offset=4 * start, is_blocking=False)
        return dst

    def close(self) -> None:
        """Wait for every upload and give the pinned memory and the copying threads back."""
        self.queue.finish()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._stage is not None:
            buf, array = self._stage
            array.base.release(self.queue)
            buf.release()
            self._stage, self._copies = None, [None, None]

    def __call__(self, weight: np.ndarray, tk: int, tm: int):
        """(M, K...) weights -> a device buffer holding `relayout(weight, tk, tm)`, and (Kpad, Mpad)."""
        m = weight.shape[0]
        w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(m, -1)
        k = w2.shape[1]
        kpad, mpad = round_up(k, tk), round_up(m, tm)
        src = self.upload(w2)
        dst = cl.Buffer(self.ctx, MF.READ_ONLY, 4 * kpad * mpad)
        t, rows = self.TILE, self.ROWS
        grid = (round_up(kpad, t), round_up(mpad, t) // t * rows)
        self.kernel(self.queue, grid, (t, rows), src, dst, np.int32(m), np.int32(k), np.int32(mpad), np.int32(kpad))
        src.release()  # freed by the runtime once the transpose that reads it has run
        return dst, (kpad, mpad)

    def winograd(self, weight: np.ndarray, tk: int, tm: int, tile: int = 2):
        """(M, C, 3, 3) weights -> a device buffer holding winograd.relayout_u(transform_weights(weight, tile)) for
        F(tile x tile, 3x3) (tile 2 or 4), in float32 arithmetic, and (Cpad, Mpad)."""
        m, c = weight.shape[:2]
        cpad, mpad = round_up(c, tk), round_up(m, tm)
        src = self.upload(weight)
        dst = cl.Buffer(self.ctx, MF.READ_ONLY, 4 * (tile + 2) ** 2 * cpad * mpad)
        wg = 64  # RL_WG, relayout.cl's default (its program is built with no defines)
        self.wino_kernels[tile](self.queue, (round_up(mpad, wg), cpad), (wg, 1), src, dst, np.int32(m), np.int32(c),
                                np.int32(mpad), np.int32(cpad))
        src.release()  # freed by the runtime once the kernel that reads it has run
        return dst, (cpad, mpad)


def upload(ctx, array: np.ndarray):
    return cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(array, dtype=np.float32))


def check_tile_params(p: dict, what: str) -> int:
    """Rules every register-blocked, local-memory-tiled GEMM here relies on; returns the work-group size."""
    tm, tn, tk, wm, wn = (p[k] for k in ("TM", "TN", "TK", "WM", "WN"))
    if tm % wm or tn % wn:
        raise ValueError(f"{what} params {p}: TM must be a multiple of WM and TN of WN")
    nt = (tm // wm) * (tn // wn)
    if (tk * tm) % nt or (tk * tn) % nt:
        raise ValueError(f"{what} params {p}: TK*TM and TK*TN must be multiples of the work-group size {nt}")
    return nt


def check_conv_params(p: dict) -> None:
    """The shape rules conv_gemm.cl relies on; ValueError naming the broken one."""
    tn, tk = p["TN"], p["TK"]
    nt = check_tile_params(p, "conv")
    if nt % tn and tn % nt:
        raise ValueError(f"conv params {p}: work-group size {nt} and TN must divide one another")
    if nt >= tn and tk % (nt // tn):
        raise ValueError(f"conv params {p}: TK must be a multiple of work-group size / TN = {nt // tn}")


def gemm_defines(params: dict, ks: int, relu: int, splitk: int = 0) -> dict:
    """conv_gemm.cl's #defines for a layer: its tile parameters, kernel size (3: padding 1; 1: a fully connected
    layer), fused ReLU, and SPLITK for the split-K variant."""
    return {**params, "KS": ks, "PAD": 1 if ks == 3 else 0, "RELU": relu, **({"SPLITK": 1} if splitk else {})}


class GemmLayer:
    """conv_gemm.cl: a 3x3 convolution (ks=3, pad=1) or a fully connected layer over the batch (ks=1, pad=0)."""

    def __init__(self, ctx, program, params: dict, weight: np.ndarray, bias: np.ndarray, m_multiple: int = 1,
                 device_relayout: DeviceRelayout | None = None):
        """device_relayout: re-lay the weights out on the device (else numpy `relayout` on the host)."""
        check_conv_params(params)
        self.p = params
        self.m = weight.shape[0]
        self.cin = weight.shape[1]
        tk, tm = params["TK"], max(params["TM"], m_multiple)
        if device_relayout is not None:
            self.wt, (_, self.mpad) = device_relayout(weight, tk, tm)
        else:
            wt = relayout(weight, tk, tm)
            self.mpad, self.wt = wt.shape[1], upload(ctx, wt)
        self.bias = upload(ctx, bias)
        self.kernel = Launch(cl.Kernel(program, "conv_gemm"))
        self.local = (params["TN"] // params["WN"], params["TM"] // params["WM"])

    def enqueue(self, queue, src, dst, n: int, h: int = 1, w: int = 1):
        """One launch; returns its event."""
        npix = n * h * w
        p = self.p
        grid = (round_up(npix, p["TN"]) // p["TN"] * self.local[0], self.mpad // p["TM"] * self.local[1])
        return self.kernel(queue, grid, self.local, src, self.wt, self.bias, dst, self.cin, h, w, self.m, self.mpad, npix)

    def flops(self, n: int, h: int = 1, w: int = 1, ks: int = 3) -> float:
        return 2.0 * n * h * w * self.m * self.cin * ks * ks


def split_for(k: int, align: int, groups: int, target: int, max_split: int) -> tuple[int, int]:
    """(splits, K per split) so that `groups` work-groups per split times the splits reach about `target`, with at
    most `max_split` splits and K per split a multiple of `align`. (1, K) when the groups alone are enough."""
    want = max(1, min(max_split, -(-target // max(groups, 1))))
    if want == 1:
        return 1, k
    kchunk = round_up(-(-k // want), align)
    return -(-k // kchunk), kchunk


def enqueue_reduce(launch: "Launch", queue, part, gemm: "GemmLayer", dst, n: int, splits: int):
    """fc_gemv.cl's fc_reduce: dst = activation(bias + the `splits` partial sums in `part`), n rows of gemm.m."""
    return launch(queue, (round_up(n * gemm.m, 64),), None, part, gemm.bias, dst, gemm.m, gemm.mpad, n, splits)


class SplitKGemm:
    """conv_gemm.cl with SPLITK = 1 for a fully connected layer: K split over work-groups, partial sums reduced by
    fc_gemv.cl's fc_reduce (bias + activation). Shares GemmLayer's weights. Used where the layer's M x N tiles
    are too few to fill the device (batch 8..64 on a GPU with 100+ compute units)."""

    def __init__(self, ctx, program, reduce_program, gemm: GemmLayer, max_n: int, target_groups: int):
        """program: conv_gemm.cl built with `gemm_defines(gemm.p, 1, 0, splitk=1)`."""
        self.g = gemm
        self.splits = self.plan(gemm, max_n, target_groups)
        floats = max(s * n for n, (s, _) in self.splits.items()) * gemm.mpad
        self.part = cl.Buffer(ctx, MF.READ_WRITE, 4 * floats)
        self.kernel = Launch(cl.Kernel(program, "conv_gemm"))
        self.reduce = Launch(cl.Kernel(reduce_program, "fc_reduce"))

    @staticmethod
    def plan(gemm: GemmLayer, max_n: int, target_groups: int) -> dict:
        """{n: (splits, K per split)} for batches 1..max_n; worth building only if some n has splits > 1."""
        p = gemm.p
        most = min(64, gemm.cin // (8 * p["TK"]))  # each split keeps at least 8 TK-deep slices
        tiles_m = gemm.mpad // p["TM"]
        return {n: split_for(gemm.cin, p["TK"], round_up(n, p["TN"]) // p["TN"] * tiles_m, target_groups, most)
                for n in range(1, max_n + 1)}

    def used_for(self, n: int) -> bool:
        return self.splits.get(n, (1, 0))[0] > 1

    def enqueue(self, queue, src, dst, n: int):
        """Two launches (partial sums, then reduce + bias + activation); returns both events."""
        g, p = self.g, self.g.p
        splits, kchunk = self.splits[n]
        grid = (round_up(n, p["TN"]) // p["TN"] * g.local[0], g.mpad // p["TM"] * g.local[1], splits)
        first = self.kernel(queue, grid, (*g.local, 1), src, g.wt, g.bias, self.part, g.cin, 1, 1, g.m, g.mpad, n,
                            kchunk)
        return first, enqueue_reduce(self.reduce, queue, self.part, g, dst, n, splits)


def gemv_span(params: dict) -> int:
    """Outputs one fc_gemv work-group covers; FC weights are padded to a multiple of it."""
    return params["GEMV_LM"] * params.get("GEMV_WM", 1)


class GemvLayer:
    """fc_gemv.cl: a fully connected layer at batch <= GEMV_NB, split over K, sharing GemmLayer's weights."""

    def __init__(self, ctx, program, params: dict, gemm: GemmLayer):
        self.p, self.g = params, gemm
        self.k = gemm.cin
        lm, lk, span = params["GEMV_LM"], params["GEMV_LK"], gemv_span(params)
        assert gemm.mpad % span == 0, "Mpad must be a multiple of GEMV_LM * GEMV_WM"
        groups_m = gemm.mpad // span
        self.ksplit, self.kchunk = split_for(self.k, 1, groups_m, params["ksplit_target"], -(-self.k // (lk * 16)))
        self.part = cl.Buffer(ctx, MF.READ_WRITE, 4 * self.ksplit * params["GEMV_NB"] * gemm.mpad)
        self.gemv = Launch(cl.Kernel(program, "fc_gemv"))
        self.reduce = Launch(cl.Kernel(program, "fc_reduce"))
        self.local = (lm, lk)
        self.grid = (groups_m * lm, self.ksplit * lk)

    def enqueue(self, queue, src, dst, n: int):
        """Two launches (partial sums, then reduce + bias + activation); returns both events."""
        g = self.g
        first = self.gemv(queue, self.grid, self.local, src, g.wt, self.part, self.k, g.mpad, n, self.kchunk)
        return first, enqueue_reduce(self.reduce, queue, self.part, g, dst, n, self.ksplit)


def pixel_table(mode: str) -> np.ndarray:
    """pixels.cl's table: (3, 256) float32, row c = the model input of output channel c for each byte value,
    computed by `normalize_pixels` itself, so the device's conversion is the host's arithmetic bit for bit."""
    from ..preprocessing import normalize_pixels

    ramp = np.repeat(np.arange(256, dtype=np.uint8).reshape(1, 256, 1), 3, axis=2)  # (1, 256, 3): v in every channel
    return np.ascontiguousarray(normalize_pixels(ramp, mode).reshape(3, 256), dtype=np.float32)


class PixelInput:
    """pixels.cl: uint8 (N, H, W, 3) RGB crops -> the model's normalised float32 (N, 3, H, W) input."""

    def __init__(self, ctx, program, mode: str, params: dict | None = None):
        self.lut = upload(ctx, pixel_table(mode))
        self.kernel = Launch(cl.Kernel(program, "pixels_to_input"))
        self.wg = (params or {}).get("PX_WG", 256)

    @staticmethod
    def defines(mode: str) -> dict:
        return {"SWAP_RB": int(mode == "caffe")}

    def enqueue(self, queue, pixels, dst, n: int, hw: int):
        return self.kernel(queue, (round_up(n * hw, self.wg),), (self.wg,), pixels, self.lut, dst, n, hw)


class MaxPool:
    def __init__(self, program, params: dict):
        self.kernel = Launch(cl.Kernel(program, "maxpool2x2"))
        self.wg = params.get("POOL_WG", 256)

    def enqueue(self, queue, src, dst, n: int, c: int, h: int, w: int):
        total = n * c * (h // 2) * (w // 2)
        return self.kernel(queue, (round_up(total, self.wg),), (self.wg,), src, dst, n * c, h, w)


class Softmax:
    def __init__(self, program, params: dict):
        self.kernel = Launch(cl.Kernel(program, "softmax"))
        self.wg = params.get("SOFTMAX_WG", 256)

    def enqueue(self, queue, src, dst, n: int, ncls: int):
        return self.kernel(queue, (n * self.wg,), (self.wg,), src, dst, ncls)
