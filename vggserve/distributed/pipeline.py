"""One rank's work on chunks of image paths: decode ahead (in decode processes or threads), classify in order on the
rank's model.

    runner = ChunkRunner(model, top_k=5, decode_procs=7)
    runner.submit(paths)              # starts decoding this chunk (vggserve.decoding: processes or threads)
    outcome = runner.run_next()       # oldest submitted chunk: waits for its pixels, runs the model

An image that cannot be opened or decoded becomes an error line and never reaches the model (so does one whose
decode process died or hung on it); an exception from the model itself propagates (the job aborts: that is a
device or engine failure, not a bad image). Decoded pixels from decode processes lie in shared memory until the
model has copied them (`model.submit` copies into its staging before it returns); then their memory is released.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..decoding import DecodeJob, decodes_on_device, make_decoder
from ..decoding.stages import StageClock
from ..predictions import result_lines, top_k as top_k_predictions
from .store import error_line

IDLE_POLL_S = 0.0005  # while `idle` has work, how often a wait checks what it waits for (and calls `idle` again)
IN_FLIGHT_CHUNKS = 6  # chunks a rank holds decoded at most (workqueue.TOKENS, and one more: sizes shared memory)


@dataclass
class ChunkOutcome:
    """What a chunk produced: JSON lines for the results and the errors file."""

    results: list[str]
    errors: list[str]

    @property
    def images(self) -> int:
        return len(self.results) + len(self.errors)


@dataclass
class RankStats:
    """Work done by one rank in this run; `active_seconds` spans its first chunk's start to its last's end.
    `clock`: the rank's CPU time by stage (its decoder's and its runner's), reported per image; `waits`: the
    runner's wall time waiting for its device and for decodes (ChunkRunner.waits), per image; `decoder`: the
    runner's, for its counts (and its decode groups, on the device)."""

    rank: int
    device: str
    images: int = 0
    errors: int = 0
    active_seconds: float = 0.0
    clock: StageClock | None = field(default=None, repr=False)
    waits: StageClock | None = field(default=None, repr=False)
    decoder: object = field(default=None, repr=False)  # the runner's decoder: processes, restarts, inline answers
    host_share: dict = field(default_factory=dict)  # what the rank sized from its share of the host (cores.HostShare)
    starved_s: float = 0.0  # wall seconds with nothing to classify, waiting for rank 0's next chunk (workqueue.Worker)
    _started: float | None = field(default=None, repr=False)
    _cpu_started: float = field(default=0.0, repr=False)
    _cpu: float = field(default=0.0, repr=False)

    def record(self, outcome: ChunkOutcome, started: float, ended: float) -> None:
        if self._started is None:
            self._started, self._cpu_started = started, time.process_time()
        self.images += outcome.images
        self.errors += len(outcome.errors)
        self.active_seconds = ended - self._started
        self._cpu = time.process_time() - self._cpu_started

    @property
    def images_per_second(self) -> float:
        return self.images / self.active_seconds if self.active_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "rank": self.rank,
            "device": self.device,
            "images": self.images,
            "errors": self.errors,
            "active_seconds": round(self.active_seconds, 3),
            "images_per_second": round(self.images_per_second, 3),
            "cpu_ms_per_image": self.cpu_ms_per_image(),
            "wait_ms_per_image": self.wait_ms_per_image(),
            "decode_processes": getattr(self.decoder, "procs", 0),
            "decode_restarts": getattr(self.decoder, "restarts", 0),
            "decode_groups": self.decode_groups(),
            "host_share": self.host_share,
        }

    def decode_groups(self) -> dict:
        """The device decoder's groups (DeviceChunkDecoder.group_stats: decodes, chunks per decode, decodes by the
        rule that made them due); {} for decoders that take each chunk as it comes."""
        stats = getattr(self.decoder, "group_stats", None)
        return stats() if stats is not None else {}

    def cpu_ms_per_image(self) -> dict[str, float]:
        """CPU milliseconds per image: each stage (decoding.stages), and `rank_process`: every thread of the rank's
        own process (not its decode processes) from its first chunk to its last (the first chunk's time excluded)."""
        if self.clock is None or self.images == 0:
            return {}
        out = self.clock.per_image_ms(self.images)
        out["rank_process"] = round(1000.0 * self._cpu / self.images, 3)
        return out

    def wait_ms_per_image(self) -> dict[str, float]:
        """Wall milliseconds per image that the rank's runner thread waited: "device" for the model's results (about
        0 when the host side is the limit), "decode" for its decodes (ChunkRunner.waits), "chunks" for rank 0's next
        chunk with nothing left to classify (the coordinator is behind)."""
        if self.waits is None or self.images == 0:
            return {}
        waits = {stage: self.waits.per_image_ms(self.images).get(stage, 0.0) for stage in ("device", "decode")}
        return {**waits, "chunks": round(1000.0 * self.starved_s / self.images, 3)}


def decode_group(model, decode: str) -> int:
    """Chunks per decode at most of a ChunkRunner with `decode` on `model`, known before the runner is made (the
    batch job sizes its tokens, and with them the runner's shared memory, by it): decoding.groups.GROUP on the
    device, else 1."""
    from ..decoding.groups import GROUP

    return GROUP if decodes_on_device(model, decode) else 1


def probabilities_of(model, inputs: list) -> np.ndarray:
    """(N, 1000) probabilities of decoded `ModelInput`s: tensors in one call, or device inputs (images and crops)
    through `submit`, max_batch_size at a time with two batches in flight."""
    if inputs[0].form == "tensor":
        return model.probabilities(np.stack([x.array for x in inputs]))
    return _rows(_submit_in_batches(model, inputs))


def _batches(model, inputs: list) -> list[list]:
    """inputs in runs of the model's max_batch_size (none for no inputs)."""
    step = model.max_batch_size
    return [inputs[i:i + step] for i in range(0, len(inputs), step)]


def _submit_in_batches(model, inputs: list) -> list:
    """The model's Pendings for device inputs, max_batch_size at a time (none for no inputs)."""
    return [model.submit(batch, "probabilities") for batch in _batches(model, inputs)]


def _rows(pending: list, wait=lambda p: p.result()) -> np.ndarray:
    return np.concatenate([wait(p) for p in pending])


def split_decoded(paths: list[str], decoded) -> tuple[list[str], list, list]:
    """(readable paths, their pixels, [(path, (reason, exception type))]) from `decode`'s answer for each path."""
    good_paths, pixels, failed = [], [], []
    for path, (array, problem) in zip(paths, decoded, strict=True):
        if problem is None:
            good_paths.append(path)
            pixels.append(array)
        else:
            failed.append((path, problem))
    return good_paths, pixels, failed


def classify_decoded(model, paths: list[str], decoded, k: int):
    """([(path, top-k predictions)], [(path, (reason, exception type))]): `decoded` is `decode`'s answer for each
    of `paths`, in order (any iterable; taken one at a time). The readable images go to the model in one batch."""
    good_paths, pixels, failed = split_decoded(paths, decoded)
    if not pixels:
        return [], failed
    predictions = top_k_predictions(probabilities_of(model, pixels), k)
    return list(zip(good_paths, predictions, strict=True)), failed


@dataclass
class _Chunk:
    """A submitted chunk: its paths and decoding; once started, its readable paths, its failures and the model's
    Pendings (or the exception that starting it raised, kept until its turn)."""

    paths: list[str]
    decoding: object
    started: bool = False
    good_paths: list[str] = field(default_factory=list)
    failed: list = field(default_factory=list)
    pending: list = field(default_factory=list)
    error: Exception | None = None


class ChunkRunner:
    """Decode-ahead classification of chunks on one model (which only this runner's thread may call).

    Decoding runs in `decode_procs` decode processes (vggserve.decoding.pool; the batch job's default), or with
    decode_procs=0 on `decode_threads` threads of this process. `decode`: "exact" or "fast" (decoding.decode), or
    "gpu" (JPEGs decoded on the model's device, decoding.device.chunks; "auto": gpu on a GPU, else exact);
    `max_pixels`: larger images are errors (None: open_image's default).
    `on_device`: whether to hand the model image inputs to resize on its device (default: when the model can).

    With a model that resizes on its device, the device always has the next chunk queued behind the one it
    computes (the engine's two staging slots): `run_next` first makes sure the chunk after the current one is on
    the device (waiting for its decoding if need be), waits for the current chunk's rows, then at once puts the
    next chunk that is already decoded into the slot those rows freed, and only then formats the current chunk's
    result lines. So between "chunk N done" and "chunk N+2 enqueued" the host only stages N+2; N's lines, the
    store, the progress bar and the coordinator's messages happen while the device computes N+1 with N+2 queued.
    A chunk whose decoding is not finished when the slot frees is not waited for there (N's lines would wait
    behind it, and with them the report that hands the decode processes their next chunk); it goes on the
    device at the start of the next `run_next`, before that chunk's rows are waited for.

    `waits`: wall time this runner's thread spent waiting, by stage: "device" (for the model's results) and
    "decode" (for a chunk's decoding). Near-zero device waits mean the rank's host side is the limit.

    `idle`: None, or a function this runner's thread calls while it waits (for its device or a decoding), every
    IDLE_POLL_S for as long as it returns True (it has work left); then the wait blocks as usual. A worker rank
    sets it to push its reports through MPI: a report larger than the MPI library's eager limit (a chunk's result
    lines) moves only while its sender calls into MPI, and a worker's thread otherwise spends most of its time in
    these waits, holding its report, and with it rank 0's answer and the worker's next chunks, back.
    """

    DEPTH = 2  # chunks kept on the device: the current one and the next; once its rows are in, the next two
    SLOTS = 2  # the engine's staging slots: a submit waits for the batch submitted SLOTS submits before it

    def __init__(self, model, top_k: int = 5, decode_threads: int = 2, *, decode_procs: int = 0,
                 decode: str = "exact", decode_timeout_s: float | None = None, on_device: bool | None = None,
                 max_pixels: int | None = None, chunks_held: int = IN_FLIGHT_CHUNKS):
        from ..modelinput import uses_device_resize

        self.model = model
        self.top_k = top_k
        self.on_device = uses_device_resize(model) if on_device is None else on_device
        in_flight = max(IN_FLIGHT_CHUNKS, chunks_held) * int(getattr(model, "max_batch_size", 16))
        job = DecodeJob(model.preprocessing, self.on_device, "exact" if decode in ("gpu", "auto") else decode,
                        max_pixels=max_pixels)
        if decodes_on_device(model, decode):
            from ..decoding.device.chunks import DeviceChunkDecoder

            self.decoder = DeviceChunkDecoder(model, job)  # JPEGs on the model's device; the rest on its thread
        else:
            self.decoder = make_decoder(job, decode_procs, decode_threads, decode_timeout_s, in_flight)
        self.clock = self.decoder.clock  # the decoder's stages, and this runner's "stage" and "result"
        self.waits = StageClock(time.perf_counter)  # wall time waiting: "device", "decode"
        self._queue: deque[_Chunk] = deque()  # submitted and not yet run, oldest first; the first ones started
        self._broken: Exception | None = None  # what a chunk's start raised: nothing is started after it
        self._slots: deque = deque(maxlen=self.SLOTS)  # Pendings of the last SLOTS submits, less those collected
        self.idle = None  # see the class docstring

    @property
    def pending(self) -> int:
        """Chunks submitted and not yet run."""
        return len(self._queue)

    def last_chunks(self) -> None:
        """No more chunks will be submitted (rank 0 has none left for this rank): a device decoder decodes the ones
        it holds back to form a group now (DeviceChunkDecoder.finish); other decoders hold none back."""
        finish = getattr(self.decoder, "finish", None)
        if finish is not None:
            finish()

    def _tell_ahead(self) -> None:
        """Tell a device decoder how many decoded chunks are queued ahead of the device (DeviceChunkDecoder.ahead:
        below three, it decodes what it holds back at once, so the device never waits for a group being formed)."""
        ahead = getattr(self.decoder, "ahead", None)
        if ahead is not None:
            ahead(sum(1 for chunk in self._queue if chunk.decoding.done()))

    def submit(self, paths: list[str]) -> None:
        self._queue.append(_Chunk(list(paths), self.decoder.start(paths)))

    def run_next(self) -> ChunkOutcome:
        """Classify the oldest submitted chunk: result lines in the chunk's order, error lines for the rest."""
        if not self.on_device:
            chunk = self._queue.popleft()
            try:
                decoded = self._decoded(chunk)
                self._tell_ahead()
                good_paths, pixels, failed = split_decoded(chunk.paths, decoded)
                with self.clock("stage"), self.waits("device"):
                    rows = probabilities_of(self.model, pixels) if pixels else None
            finally:
                self.decoder.release(chunk.decoding)
        else:
            self._start_ahead(self.DEPTH, wait=True)  # this chunk and the next one are on the device
            chunk = self._queue.popleft()
            self._tell_ahead()
            if chunk.error is not None or not chunk.started:  # its start failed, or one before it did
                raise chunk.error or self._broken
            good_paths, failed = chunk.good_paths, chunk.failed
            with self.waits("device"):
                rows = _rows(chunk.pending, self._wait) if chunk.pending else None
            for pending in chunk.pending:  # collected: their slots are free (the oldest submits, in order)
                if self._slots and self._slots[0] is pending:
                    self._slots.popleft()
            self._start_ahead(self.DEPTH, wait=False)  # into the slot this chunk freed, before its lines
        with self.clock("result"):
            return ChunkOutcome(result_lines(good_paths, rows, self.top_k) if good_paths else [],
                                [error_line(path, *problem) for path, problem in failed])

    def _start_ahead(self, count: int, wait: bool) -> None:
        """Start the first `count` queued chunks, in order, that are not yet started. wait=False: stop at the
        first whose decoding is not finished (and waits for none)."""
        for i in range(min(count, len(self._queue))):
            chunk = self._queue[i]
            if chunk.started:
                continue
            if self._broken is not None or not (wait or chunk.decoding.done()):
                return
            self._start(chunk)

    def _start(self, chunk: _Chunk) -> None:
        """Wait for a chunk's decoding and start its readable images on the device (one Pending per max_batch_size
        images, none when nothing is readable). The decoded pixels are released once the model has copied them.
        An exception is kept in the chunk and raised when its turn comes, so that the chunks before it are still
        answered; nothing is started after it."""
        chunk.started = True
        try:
            chunk.good_paths, pixels, chunk.failed = split_decoded(chunk.paths, self._decoded(chunk))
            with self.clock("stage"):
                chunk.pending = self._submit_in_slots(pixels)
        except Exception as exc:
            chunk.error = self._broken = exc
        finally:
            self.decoder.release(chunk.decoding)

    def _submit_in_slots(self, pixels: list) -> list:
        """_submit_in_batches, except that the batch whose staging slot a submit takes (SLOTS submits back: in a
        chunk larger than max_batch_size, one of its own) is waited for here, so that the wait counts as one for
        the device (`waits`) rather than vanishing into the submit."""
        pending = []
        for batch in _batches(self.model, pixels):
            if len(self._slots) == self.SLOTS:
                with self.waits("device"):
                    self._wait(self._slots[0])
            pending.append(self.model.submit(batch, "probabilities"))
            self._slots.append(pending[-1])
        return pending

    def _decoded(self, chunk: _Chunk) -> list:
        with self.waits("decode"):
            return self._wait(chunk.decoding)

    def _wait(self, thing):
        """`thing.result()` (a Pending or a decoding), calling `idle` while it is not done and `idle` has work."""
        idle = self.idle
        if idle is not None:
            while not thing.done() and idle():
                time.sleep(IDLE_POLL_S)
        return thing.result()

    def run_timed(self, stats: RankStats) -> ChunkOutcome:
        """run_next, recorded in `stats`."""
        started = time.perf_counter()
        outcome = self.run_next()
        stats.record(outcome, started, time.perf_counter())
        return outcome

    def close(self) -> None:
        self.decoder.close()
