"""Uploads decoded on the engine's device (`vggserve serve --decode gpu|auto`, auto the default), and where each
file goes instead.

    front end (LocalBackend, or a front-end process's RemoteBackend), per upload, in a decoding thread:
        encoded_or_decoded(data, ...)   a JPEG the device decoder takes -> ModelInput.encoded(data), its bytes queued
                                        as they came; any other file -> decoded here as under exact
        encoded_here(data, ...)         first, on the event loop: the JPEGs the device takes go without
                                        the hop to a thread; for the others it says why, and
                                        encoded_or_decoded takes that reason instead of parsing again
    device worker, per decode group, before its first batch is prepared (while the device computes the previous one):
        DeviceDecoding.decode_group(model, batches, on_device, preprocessing)
                                        one `decode_for_model` call for the encoded images of up to --decode-group
                                        batches (GROUP_BYTES of files at most: `decoding.groups`), answers split
                                        back per batch; one whose stream the device flags is decoded on the CPU,
                                        with the CPU path's pixels or its ImageError, which answers that image
                                        alone; `decode(model, batch, ...)` is a group of one batch

A group forms only from batches already waiting when the worker takes its next batch (`BatchQueue.take_more`: full
batches, claimed; `inflight` runs them through the network one by one), so a lone request is never held back for
one. The decoder's synchronisation rounds are bound by latency, not work: four batches of 64 in one launch sequence
cost the device far less than four decodes (`decoding.groups`). vggserve_device_decode_batches (a histogram)
counts the batches of each device decode.

Which files the device takes is `decoding.device.prepare` with the service's pixel limit and the format allowlist,
the same checks as the CPU path, so a file over the limit (or of a refused format) still gets the CPU path's 413 or
415. A worker decodes on its device only where its model is the engine (it has `jpeg_decoder` and `submit`), resizes
bit for bit as Pillow there, and, under `auto`, its device is a GPU (`decodes_on_device`); the worker tells the front
ends so in its info (`decodes_on_device`), and they decode everything on the CPU otherwise. An encoded image that
reaches a worker that does not decode on its device (several workers of which only some do) is decoded there, on
the CPU.

vggserve_decoded_images_total{path, reason} counts, under gpu and auto, where each upload was decoded and why:
    path=device  baseline_jpeg   decoded on the engine's device
    path=cpu     other_format    not a JPEG (PNG, WebP, GIF, ...)
                 jpeg_kind       a JPEG the device decoder does not take (progressive, arithmetic, CMYK, 12-bit, ...)
                 header          its header refused: the pixel limit, the format allowlist, a header Pillow refuses
                 stream          the device flagged its stream (corrupt or unusual): decoded, or refused, on the CPU
                 device_error    the device decoder failed on its batch (logged): the batch decoded on the CPU
                 no_device       the worker does not decode on its device (--decode auto off a GPU, a stand-in model)
                 tensor_batch    its batch also holds v2 FP32 tensors, which run as tensors prepared on the CPU
"""

from __future__ import annotations

import logging
import time
from collections import deque

from ...decoding import DEVICE_MODES, asks_device_decoding, decoder_builds
from ...decoding.groups import GROUP, GROUP_BYTES, check, take
from ...errors import ImageError
from ...images import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS
from ...modelinput import ENCODED, TENSOR, ModelInput, uses_device_resize
from ...wording import count

log = logging.getLogger("vggserve.serving")

DEVICE, CPU = "device", "cpu"
ON_DEVICE = "baseline_jpeg"
CPU_REASONS = ("other_format", "jpeg_kind", "header", "stream", "device_error", "no_device", "tensor_batch")
_HEADER_REFUSALS = ("header refused", "JPEG is not an accepted format", "more pixels than the limit")


def refusal_reason(reason: str) -> str:
    """The metric's reason for a `decoding.device.Refusal`'s text."""
    if reason == "not a JPEG":
        return "other_format"
    if reason.startswith(_HEADER_REFUSALS):
        return "header"
    return "jpeg_kind"


def route(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, formats=ALLOWED_FORMATS) -> str:
    """ON_DEVICE when the device decoder takes `data` under these limits, else the CPU path's reason."""
    from ...decoding.device import Refusal, prepare

    prepared = prepare(data, max_pixels, formats)
    return refusal_reason(prepared.reason) if isinstance(prepared, Refusal) else ON_DEVICE


def encoded_or_decoded(data: bytes, mode: str, max_pixels: int, formats=ALLOWED_FORMATS, *, task,
                       decode: str = "exact", note=None, why: str | None = None) -> tuple[ModelInput, float]:
    """In a front end's decoding thread: (the encoded input, seconds) for a file the device decodes, else `task`'s
    answer for it, `task` being the CPU path it takes today (imaging.prepare_image, decode_and_crop,
    decode_for_engine), with its errors; `note(reason)` is told why first (`note_cpu`). `why`: the route that
    `encoded_here` found on the event loop (None: found here)."""
    from ...preprocessing import check_mode

    started = time.perf_counter()
    if why is None:  # else encoded_here has checked the mode and found the route
        check_mode(mode)  # as the CPU path does first
        why = route(data, max_pixels, formats)
    if why == ON_DEVICE:
        return ModelInput.encoded(data), time.perf_counter() - started
    if note is not None:
        note(why)
    image, seconds = task(data, mode, max_pixels, formats, decode=decode)
    return image, time.perf_counter() - started


def encoded_here(data: bytes, mode: str, max_pixels: int,
                 formats=ALLOWED_FORMATS) -> tuple[ModelInput, float] | str | None:
    """Under --decode gpu or auto, on the caller's thread (a front end's event loop): (the encoded input, seconds)
    when the device decoder takes `data`; else the CPU path's reason (`route`), for `encoded_or_decoded` in a
    decoding thread to note and decode it there; None where deciding raised, for that thread to decide again and
    raise what the CPU path raises. Deciding costs a parse of the file's markers, less than the hop to a thread and
    back (the pool's queue and wake-up, the GIL handed over twice, the loop woken)."""
    started = time.perf_counter()
    try:
        from ...preprocessing import check_mode

        check_mode(mode)
        why = route(data, max_pixels, formats)
    except Exception:  # noqa: BLE001 - the thread's encoded_or_decoded raises it again, as the CPU path's error
        return None
    return (ModelInput.encoded(data), time.perf_counter() - started) if why == ON_DEVICE else why


def note_cpu(metrics):
    """`note(reason)`: counts one upload decoded on the CPU for `reason` (the device worker counts its own)."""

    def note(reason: str) -> None:
        metrics.decoded.labels(path=CPU, reason=reason).inc()

    return note


def decodes_on_device(model, mode: str) -> bool:
    """Whether a worker with `model` decodes encoded uploads on its device under --decode `mode` (and its decoder's
    kernels are built, now, before it reports ready)."""
    if not asks_device_decoding(model, mode) or not hasattr(model, "submit"):
        return False
    if not uses_device_resize(model):  # a device-decoded image is resized there: only where that is Pillow's
        return False
    return decoder_builds(model, log)


class DeviceDecoding:
    """A device worker's side: its batches' encoded images decoded, on its device or on the CPU. `group`: batches
    per device decode at most (--decode-group; 1: one batch each), `group_bytes`: their encoded bytes at most,
    `hold_s`: how long a worker whose device is busy may wait for a full batch to join a group (`take_more`)."""

    def __init__(self, metrics, mode: str = "exact", max_pixels: int = DEFAULT_MAX_PIXELS,
                 formats=ALLOWED_FORMATS, group: int = GROUP, group_bytes: int = GROUP_BYTES,
                 hold_s: float | None = None):
        check(group, group_bytes)
        self.metrics, self.mode, self.max_pixels, self.formats = metrics, mode, max_pixels, formats
        self.group, self.group_bytes = group, group_bytes
        self.hold_s = hold_from_environment() if hold_s is None else hold_s

    def note(self, path: str, reason: str, n: int = 1) -> None:
        if n and self.mode in DEVICE_MODES:
            self.metrics.decoded.labels(path=path, reason=reason).inc(n)

    def decode(self, model, batch: list, on_device: bool, preprocessing: str) -> tuple[list, list]:
        """(the items of `batch` still to compute, their inputs): each encoded input decoded, on `model`'s device
        when `on_device` (a DeviceImage, or the CPU path's image or crop), else on the CPU (a crop); an item whose
        file the CPU path refuses is answered with that ImageError and leaves the batch."""
        return self.decode_group(model, [batch], on_device, preprocessing)[0]

    def decode_group(self, model, batches: list[list], on_device: bool, preprocessing: str,
                     settle=None) -> list[tuple[list, list]]:
        """`decode` for each of `batches` (its answer, in order), the encoded images of all of them decoded on the
        device by one `decode_for_model` call (or one per `group_bytes` of files: `groups.take`). A batch that also
        holds tensors decodes its JPEGs on the CPU, as alone. `settle(k, items)`: of batches[k]'s items about to be
        answered with their ImageError, those this call answers (the others' requests were answered meanwhile:
        claimed images withdrawn); default all."""
        inputs = [[item.input for item in batch] for batch in batches]
        waiting: deque = deque()  # (batch index, positions of its encoded inputs, their bytes) for the device
        for k, xs in enumerate(inputs):
            where = [i for i, x in enumerate(xs) if x.form == ENCODED]
            if not where:
                continue
            tensors = any(x.form == TENSOR for x in xs)
            if on_device and not tensors:
                waiting.append((k, where, sum(xs[i].array.nbytes for i in where)))
                continue
            self._decode_on_cpu(xs, where, preprocessing, "tensor_batch" if on_device else "no_device")
        while waiting:
            part = take(waiting, self.group, self.group_bytes)
            datas = [inputs[k][i].array for k, where, _ in part for i in where]  # as they came (prepare copies heads)
            decoded = self._on_device(model, datas, len(part))
            at = 0
            for k, where, _ in part:
                if decoded is None:
                    self._decode_on_cpu(inputs[k], where, preprocessing, "device_error")
                    continue
                for i, x in zip(where, decoded[at:at + len(where)]):
                    inputs[k][i] = x
                at += len(where)
        return [self._split(k, batch, xs, settle) for k, (batch, xs) in enumerate(zip(batches, inputs))]

    @staticmethod
    def _split(k: int, batch: list, inputs: list, settle) -> tuple[list, list]:
        """(the items to compute, their inputs); the others answered with their ImageError."""
        failed = [item for item, x in zip(batch, inputs) if isinstance(x, ImageError)]
        if not failed:
            return batch, inputs
        errors = {id(item): x for item, x in zip(batch, inputs) if isinstance(x, ImageError)}
        for item in (failed if settle is None else settle(k, failed)):
            item.future.set_exception(errors[id(item)])
        kept = [(item, x) for item, x in zip(batch, inputs) if not isinstance(x, ImageError)]
        return [item for item, _ in kept], [x for _, x in kept]

    def _decode_on_cpu(self, inputs: list, where: list[int], preprocessing: str, reason: str) -> None:
        """inputs[i] for i in `where` decoded on the CPU (a crop, or its ImageError), counted with `reason`."""
        for i in where:
            inputs[i] = self._on_cpu(inputs[i].array.tobytes(), preprocessing)
        self.note(CPU, reason, len(where))

    def _on_device(self, model, datas: list, batches: int = 1) -> list | None:
        """decode_for_model's answer (None when the decoder failed on the group: logged), for `batches` batches'
        files."""
        from ...decoding.device.onmodel import decode_for_model
        from .imaging import open_upload

        def cpu(data):
            return open_upload(bytes(data), self.max_pixels, self.formats)

        try:
            decoded = decode_for_model(model, datas, max_pixels=self.max_pixels, formats=self.formats, cpu=cpu)
        except Exception:  # noqa: BLE001 - the CPU decodes them instead; the device's own failure shows in its batch
            log.exception("the device JPEG decoder failed on %s of %s; decoded on the CPU instead",
                          "a batch" if batches == 1 else f"a group of {batches} batches", count(len(datas), "image"))
            return None
        self.metrics.device_decode_batches.observe(batches)
        on_device = sum(getattr(x, "form", None) == DEVICE for x in decoded)
        self.note(DEVICE, ON_DEVICE, on_device)
        self.note(CPU, "stream", len(decoded) - on_device)
        return decoded

    @staticmethod
    def encoded_bytes(batch: list) -> int:
        """The encoded files' bytes of a batch's items (what `groups.GROUP_BYTES` bounds)."""
        return sum(item.input.array.nbytes for item in batch if item.input.form == ENCODED)

    @staticmethod
    def for_device(batch: list, on_device: bool) -> bool:
        """Whether `batch`'s JPEGs go to the device decoder: the worker decodes on its device, and the batch has
        JPEGs and no tensors (which keep its JPEGs on the CPU)."""
        if not on_device:
            return False
        forms = {item.input.form for item in batch}
        return ENCODED in forms and TENSOR not in forms

    def _on_cpu(self, data: bytes, preprocessing: str):
        """The CPU path's crop of `data` (modelinput prepares it as the batch needs), or its ImageError."""
        from .imaging import decode_and_crop

        try:
            return decode_and_crop(data, preprocessing, self.max_pixels, self.formats)[0]
        except ImageError as exc:
            return exc


HOLD_ENV = "VGGSERVE_DECODE_HOLD_MS"


def hold_from_environment() -> float:
    """`hold_s` from $VGGSERVE_DECODE_HOLD_MS (milliseconds, for measurements), else 0: a worker whose device is busy
    does not wait for a full batch to join its group. Under load the queue holds full batches whenever the worker
    takes one (groups form without waiting); when it does not, the device has time to spare and a group saves
    little, while the wait would delay the batch taken whenever the device finishes first."""
    import os

    text = os.environ.get(HOLD_ENV, "").strip()
    try:
        return max(0.0, float(text) / 1000.0) if text else 0.0
    except ValueError:
        log.warning("$%s=%r is not a number of milliseconds; no hold", HOLD_ENV, text)
        return 0.0
