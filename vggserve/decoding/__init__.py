"""Decoding images for the model, shared by `classify`, the batch job and the service's front ends.

Modules:
    decode   one image: bytes -> upright RGB pixels -> the model's input; the exact and fast decode modes
    jpeg     JPEGs through libjpeg-turbo directly (simplejpeg), only where its pixels are Pillow's, bit for bit
    pool     DecodePool: decode processes writing into shared memory (vggserve.ipc.ring), replaced when they die
             or hang
    worker   one decode process
    threads  ThreadDecoder: the same interface on threads of this process
    stages   CPU time per image by stage (read, decode, copy, link, stage, result)
    device   JPEGs decoded on the OpenCL device, bit for bit as here (decode_on_device)

    decoder = make_decoder(DecodeJob(mode="torchvision", on_device=True), procs=7)
    decoding = decoder.start(["a.jpg", "b.jpg"])
    for pixels, problem in decoding.result(): ...
    decoder.release(decoding)
"""

from .decode import DECODE_MODES, check_decode, decode_input, decode_pixels, model_input
from .worker import DecodeJob

__all__ = ["DECODE_MODES", "DEVICE_MODES", "DecodeJob", "check_decode", "decode_input", "decode_on_device",
           "decode_pixels", "decodes_on_device", "make_decoder", "model_input"]

DEVICE_MODES = ("gpu", "auto")  # the --decode modes that may decode JPEGs on the model's device


def decodes_on_device(model, mode: str) -> bool:
    """Whether --decode `mode` decodes JPEGs on `model`'s device: `gpu`, or `auto` where the model runs on a GPU,
    and the model has a device JPEG decoder. The batch job's rule (distributed.pipeline); the service adds its own
    conditions (serving.scheduling.devicedecode.decodes_on_device)."""
    if mode not in DEVICE_MODES or not hasattr(model, "jpeg_decoder"):
        return False
    return mode == "gpu" or getattr(getattr(model, "device_info", None), "kind", None) == "gpu"


def decode_on_device(datas, device: str = "auto", **limits):
    """JPEGs decoded on the OpenCL device, bit for bit as `decode_pixels` (vggserve.decoding.device); other inputs
    through `decode_pixels` on the CPU. Per input a uint8 (h, w, 3) array or the ImageError, with `.paths`."""
    from .device import decode_on_device as run

    return run(datas, device, **limits)


def make_decoder(job: DecodeJob, procs: int = 0, threads: int = 2, timeout_s: float | None = None,
                 in_flight: int = 64):
    """A DecodePool of `procs` processes, or with procs=0 a ThreadDecoder of `threads` threads.
    `timeout_s`: a process's longest decode of one image (None: pool.DEFAULT_TIMEOUT_S); `in_flight`: how many
    decoded images the consumer holds at most (sizes the shared memory)."""
    if procs <= 0:
        from .threads import ThreadDecoder

        return ThreadDecoder(threads, job)
    from .pool import DEFAULT_TIMEOUT_S, DecodePool

    return DecodePool(procs, job, timeout_s=timeout_s or DEFAULT_TIMEOUT_S, in_flight=in_flight)
