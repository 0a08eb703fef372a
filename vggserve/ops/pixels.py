"""pixels.cl's host: uint8 RGB crops normalised on the device into the model's float32 NCHW input."""

import numpy as np
import pyopencl as cl

from .launch import Launch, round_up, upload

KERNEL_FILE = "pixels.cl"


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
