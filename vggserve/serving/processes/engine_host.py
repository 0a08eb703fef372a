"""The engine process's side of the front-end links (`--http-workers N`): it accepts each front end's connection,
queues the model inputs it sends in the service's BatchQueue (the device workers batch them with everyone else's),
answers every image, withdraws images on request, and pushes the service's readiness to every front end on
connect and whenever it changes. The messages are listed in vggserve.serving.processes.engine_link."""

import logging
import threading
import time
from concurrent.futures import InvalidStateError
from multiprocessing.connection import Listener

import numpy as np

from ...errors import ImageError
from ..scheduling.batcher import Item, Outcome
from ..scheduling.errors import ClientGone, InternalError, SchedulingError
from .engine_link import DirectLink
from ...ipc.shm import Mapped, Shared
from ..service import Service

log = logging.getLogger("vggserve.serving")


def engine_state(service: Service) -> dict:
    """What a front end needs to answer health checks and admit requests without asking: the "state" message."""
    try:
        service.ensure_accepting()
        refusal = None
    except SchedulingError as exc:
        refusal = exc
    return {"ready": service.readiness(), "refusal": refusal, "live": service.liveness(),
            "info": service.model_info()}


class LinkItem(Item):
    """An image a front end sent: its Outcome goes back with those of its batch-mates from the same front end in
    one "results" message (`FrontEndPeer.answer_rows`), an error in an "error" message (`future`: its `Answer`)."""

    def __init__(self, peer: "FrontEndPeer", image_id: int, image, deadline: float, want_logits: bool):
        self.input, self.deadline, self.want_logits = image, deadline, want_logits
        self.enqueued = time.monotonic()
        self.image_id = image_id
        self.group = peer
        self.future = Answer(peer, image_id)


class Answer:
    """A LinkItem's stand-in for a Future, for the queue and the device workers: setting it sends the answer to the
    front end. Set once only (InvalidStateError after, as a Future)."""

    __slots__ = ("peer", "image_id", "_done")

    def __init__(self, peer: "FrontEndPeer", image_id: int):
        self.peer, self.image_id, self._done = peer, image_id, False

    def done(self) -> bool:
        return self._done

    def set_result(self, outcome: Outcome) -> None:
        self.peer.settle([self])
        self.peer.link.send(("result", self.image_id, outcome))

    def set_exception(self, error: BaseException) -> None:
        self.peer.settle([self])
        if not isinstance(error, (SchedulingError, ImageError)):  # an ImageError: a file the device decoder passed
            error = InternalError(f"{type(error).__name__}: {error}")  # on to the CPU path, which refused it
        self.peer.link.send(("error", self.image_id, error))


class FrontEndPeer:
    """One connected front end: its link, and its images still in the engine's queue or on a device."""

    def __init__(self, host: "EngineHost", link_conn, number: int):
        self.host = host
        self.service = host.service
        self.index: int | None = None
        self.pid: int | None = None
        self.arena: Mapped | None = None  # the front end's shared pixels, once it has said hello
        self._items: dict[int, LinkItem] = {}  # not answered yet
        self._lock = threading.Lock()
        # its answers written by the thread that computes them (the device worker's completer, for results), not by
        # a writer thread woken for each: one thread less taking the engine process's GIL per front end and batch
        self.link = DirectLink(link_conn, self._received, self._closed, f"vggserve-engine-link{number}")

    def _received(self, messages: list) -> None:
        """A list of messages from the front end, handled in order; its runs of submits are queued together."""
        submits = []
        for message in messages:
            if message[0] == "submit":
                submits.append(message)
                continue
            if submits:
                self._submit(submits)
                submits = []
            self._other(message)
        if submits:
            self._submit(submits)

    def _other(self, message: tuple) -> None:
        kind = message[0]
        if kind == "withdraw":
            with self._lock:
                item = self._items.get(message[1])
            if item is not None:
                self.service.backend.queue.withdraw(item, message[2])
        elif kind == "call":
            self.link.send(("reply", message[1], self._call(message[2])))
        elif kind == "hello":
            self.index, self.pid = message[1], message[2]
            if len(message) > 3 and message[3]:
                try:
                    self.arena = Mapped(message[3])
                except OSError as exc:  # the front end then sends its pixels inline
                    log.warning("front end %s: cannot map its pixel arena (%s)", self.index, exc)
                self.link.send(("arena", self.arena is not None))
            who = "the supervisor" if self.index < 0 else f"front end {self.index}"  # engines.Watch: index -1
            log.info("%s (pid %s) connected%s", who, self.pid, ", pixels through shared memory" if self.arena else "")
        else:
            log.warning("unknown message %r from front end %s", kind, self.index)

    def _submit(self, submits: list[tuple]) -> None:
        """("submit", image_id, input, seconds_left, want_logits) messages: their images queued, each refused one
        answered with its error."""
        now = time.monotonic()
        items = []
        for _, image_id, image, seconds_left, *want_logits in submits:
            if isinstance(image, Shared):  # a view of the front end's block: read before the image is answered
                image = self.arena.image(image)
            items.append(LinkItem(self, image_id, image, now + seconds_left, bool(want_logits and want_logits[0])))
        with self._lock:  # known before a device can answer them
            for item in items:
                self._items[item.image_id] = item
        for item, error in self.service.backend.queue.submit_many(items):
            item.future.set_exception(error)

    def settle(self, answers: list[Answer]) -> None:
        """Mark these images answered (once each: InvalidStateError for one answered already)."""
        with self._lock:
            for answer in answers:
                if answer._done:
                    raise InvalidStateError(f"image {answer.image_id} of front end {self.index} is answered already")
                answer._done = True
                self._items.pop(answer.image_id, None)

    def answer_rows(self, items: list[LinkItem], probabilities: np.ndarray, logits: np.ndarray | None,
                    queue_s: list[float], inference_s: float, batch_size: int, device: str) -> None:
        """The Outcomes of this front end's images of one computed batch, in one "results" message (`batcher.answer`
        calls it)."""
        self.settle([item.future for item in items])
        asked = [i for i, item in enumerate(items) if item.want_logits] if logits is not None else []
        self.link.send(("results", [item.image_id for item in items], as_bytes(probabilities),
                        as_bytes(logits[asked]) if asked else None, asked, queue_s, inference_s, batch_size,
                        device))

    def _call(self, what: str):
        if what == "metadata":
            return self.service.metadata()
        return None

    def _closed(self) -> None:
        """The front end went away: its images still waiting are not computed (nobody would read them)."""
        with self._lock:
            left = list(self._items.values())
        for item in left:
            self.service.backend.queue.withdraw(item, ClientGone())
        if self.arena is not None:
            self.arena.close()
        self.host.forget(self)
        if not self.host.closing:
            log.info("front end %s (pid %s) disconnected", self.index, self.pid)


def as_bytes(rows: np.ndarray) -> bytes:
    """A "results" message's float32 rows, as bytes (`engine_link.rows_of` undoes it)."""
    return np.ascontiguousarray(rows, np.float32).tobytes()


class EngineHost:
    """Listens on a Unix socket for front ends (authenticated with `authkey`) and serves each in its own threads."""

    def __init__(self, service: Service, address: str, authkey: bytes):
        self.service = service
        self.address = address
        self.authkey = authkey
        self.closing = False
        self._peers: list[FrontEndPeer] = []
        self._lock = threading.Lock()
        self._listener: Listener | None = None
        self._accepted = 0

    def start(self) -> None:
        """Listen (front ends may connect from now on) and push every state change of the service to them."""
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self.service.on_state_change = self.push_state
        threading.Thread(target=self._accept_loop, name="vggserve-engine-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self.closing:
            try:
                conn = self._listener.accept()
            except Exception as exc:  # noqa: BLE001 - closed, or a connection that failed the handshake
                if not self.closing:
                    log.warning("a front-end connection failed: %s", exc)
                continue
            self._accepted += 1
            peer = FrontEndPeer(self, conn, self._accepted)
            with self._lock:
                self._peers.append(peer)
            peer.link.start()
            peer.link.send(("state", engine_state(self.service)))

    def push_state(self) -> None:
        state = engine_state(self.service)
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            peer.link.send(("state", state))

    def forget(self, peer: FrontEndPeer) -> None:
        with self._lock:
            if peer in self._peers:
                self._peers.remove(peer)

    def close(self) -> None:
        """Stop listening and end every link (after the front ends have exited)."""
        self.closing = True
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            peer.link.close()
