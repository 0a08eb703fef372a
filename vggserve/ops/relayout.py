"""Weights from the file's layout to the portable kernels' A layout (k-major, zero-padded): on the host
(`relayout`) or on the device (`DeviceRelayout`, kernels/relayout.cl)."""


import numpy as np
import pyopencl as cl

from ..runtime.hostcopy import copy_into
from .launch import MF, round_up

KERNEL_FILE = "relayout.cl"


def defines(storage=np.float32) -> dict:
    """relayout.cl's #defines: transposed weights stored as float32 or float16 (Winograd weights stay float32)."""
    return {"OUT_HALF": int(np.dtype(storage) == np.float16)}


def relayout(weight: np.ndarray, tk: int, tm: int, storage=np.float32) -> np.ndarray:
    """(M, K...) weights -> zero-padded (Kpad, Mpad) `storage`, k-major: wt[k, m] = W[m, k] (kernels' A layout)."""
    m = weight.shape[0]
    w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(m, -1)
    k = w2.shape[1]
    out = np.zeros((round_up(k, tk), round_up(m, tm)), dtype=np.float32)
    out[:k, :m] = w2.T
    return out.astype(storage, copy=False)


class DeviceRelayout:
    """relayout.cl: `relayout` done by the device. Uploads W as it is and transposes it there, which for VGG16's
    528 MB takes milliseconds instead of the seconds numpy's strided transpose takes on the host."""

    TILE, ROWS = 32, 8
    STAGE_FLOATS = 4 << 20  # two halves of 8 MB of pinned memory that the raw weights pass through

    def __init__(self, ctx, queue, program, storage=np.float32):
        """program: relayout.cl built with `defines(storage)`; transposed weights are stored as `storage`."""
        self.ctx, self.queue = ctx, queue
        self.itemsize = np.dtype(storage).itemsize
        self.kernel = cl.Kernel(program, "transpose_pad")
        self.wino_kernels = {2: cl.Kernel(program, "winograd_weights"), 4: cl.Kernel(program, "winograd4_weights")}
        self._stage = None  # (buffer, pinned array), made on first use
        self._copies = [None, None]  # the last upload from each half

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:] = src, split over the copying threads."""
        copy_into(dst, src)

    def upload(self, array: np.ndarray):
        """A device copy of `array` (float32) made through pinned memory: chunk i+1 is copied into one half while
        chunk i travels from the other, so the upload runs at DMA speed instead of a pageable copy's."""
        from ..engine.staging import pinned

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
        """Wait for every upload and give the pinned memory back (the copying threads are shared: runtime/hostcopy.py)."""
        self.queue.finish()
        if self._stage is not None:
            buf, array = self._stage
            array.base.release(self.queue)
            buf.release()
            self._stage, self._copies = None, [None, None]

    def __call__(self, weight: np.ndarray, tk: int, tm: int):
        """(M, K...) weights -> a device buffer holding `relayout(weight, tk, tm)` in the storage type, and
        (Kpad, Mpad)."""
        m = weight.shape[0]
        w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(m, -1)
        k = w2.shape[1]
        kpad, mpad = round_up(k, tk), round_up(m, tm)
        src = self.upload(w2)
        dst = cl.Buffer(self.ctx, MF.READ_ONLY, self.itemsize * kpad * mpad)
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
