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

import weakref

from .decode import DECODE_MODES, check_decode, decode_input, decode_pixels, model_input
from .worker import DecodeJob

__all__ = ["DECODE_MODES", "DEVICE_MODES", "DecodeJob", "asks_device_decoding", "check_decode", "decode_input",
           "decode_on_device", "decode_pixels", "decoder_builds", "decodes_on_device", "make_decoder", "model_input"]

DEVICE_MODES = ("gpu", "auto")  # the --decode modes that may decode JPEGs on the model's device


def decodes_on_device(model, mode: str) -> bool:
    """Whether --decode `mode` decodes JPEGs on `model`'s device: `gpu`, or `auto` (the default) where the model runs
    on a GPU, and the model's device JPEG decoder builds (`decoder_builds`). The batch job's and classify's rule
    (distributed.pipeline, cli.classify); the service adds its own conditions
    (serving.scheduling.devicedecode.decodes_on_device)."""
    return asks_device_decoding(model, mode) and decoder_builds(model)


def asks_device_decoding(model, mode: str) -> bool:
    """Whether --decode `mode` asks `model` to decode JPEGs on its device: `gpu`, or `auto` on a GPU, and the model
    has a device JPEG decoder (not yet whether it builds)."""
    if mode not in DEVICE_MODES or not hasattr(model, "jpeg_decoder"):
        return False
    return mode == "gpu" or getattr(getattr(model, "device_info", None), "kind", None) == "gpu"


def decoder_builds(model, log=None) -> bool:
    """Whether `model.jpeg_decoder()` builds (its kernels, now); where it does not, one line says so on `log` (default
    the "vggserve" logger), once per model, and the caller decodes on the CPU, as exact does: a default that decodes
    on the device must never make a job fail where exact works."""
    import logging

    if model in _UNBUILT:
        return False
    try:
        model.jpeg_decoder()
    except Exception as exc:  # noqa: BLE001 - decoding on the CPU is no worse than --decode exact
        text = str(exc).strip().splitlines()
        (log or logging.getLogger("vggserve")).warning(
            "the device JPEG decoder could not be built on %s (%s: %s); JPEGs are decoded on the CPU",
            getattr(model, "device_name", "the device"), type(exc).__name__, text[0] if text else "no message")
        try:
            _UNBUILT.add(model)
        except TypeError:  # a model that takes no weak reference (a stand-in): asked again, it logs again
            pass
        return False
    return True


_UNBUILT: "weakref.WeakSet" = weakref.WeakSet()  # models whose device JPEG decoder failed to build


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
