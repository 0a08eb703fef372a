"""The link between an HTTP front-end process and the engine process (`--http-workers N`), and the front end's side
of it: `RemoteQueue`, which the request pipeline uses in place of the engine's BatchQueue.

A link is one authenticated Unix-socket connection (`multiprocessing.connection`). Each side sends lists of
messages, written by the thread that sends them (`DirectLink`): a front end's event loop those of one turn of the
loop, the engine each batch's answers from the device worker's completer thread; a writer thread only takes over
what the socket cannot take at once. A message is a tuple whose first element names it:

    front end -> engine
        ("hello", index, pid, arena)               who is connecting, and the name of its shared-memory arena
                                                   (None: pixels come inline)
        ("submit", image_id, input, seconds_left, want_logits)
                                                   a ModelInput (crop, image, tensor, or a JPEG's bytes to decode
                                                   on the engine's device), or where its array lies
                                                   in the arena (shm.Shared), its remaining deadline, and whether
                                                   its answer needs the logits
        ("withdraw", image_id, error)              drop it if it still waits (DeadlineExceeded or ClientGone)
        ("call", call_id, "metadata")              ask for the engine's /metadata
    engine -> front end
        ("arena", mapped)                          answer to a hello naming an arena: whether the engine mapped it
                                                   (the front end uses it only then)
        ("state", state)                           readiness, liveness, model info: on connect and on every change
        ("results", image_ids, probabilities, logits, asked, queue_s, inference_s, batch_size, device)
                                                   the Outcomes of this front end's images of one computed batch:
                                                   image_ids[i]'s probabilities are row i of an (n, classes)
                                                   float32 array sent as its bytes (a numpy array pickles ten
                                                   times slower), its queue time queue_s[i]; `logits` the bytes of
                                                   the logits rows of the images at positions `asked` (None when
                                                   none asked)
        ("result", image_id, outcome)              one image's Outcome
        ("error", image_id, error)                 a scheduling.errors.SchedulingError for that image, or the
                                                   ImageError of a file the engine's device passed to the CPU path
        ("reply", call_id, value)

Every submitted image gets exactly one answer ("results", "result" or "error"), withdrawn or not. A list the engine
receives is handled in order, its runs of submits queued together (`BatchQueue.submit_many`); the engine answers a
computed batch with one "results" message per front end, the per-image cost of its answers being a few list items
and no Python object per image.
"""

import asyncio
import itertools
import logging
import os
import pickle
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection
from typing import Callable

import numpy as np

from ...modelinput import ModelInput
from ..scheduling.batcher import Admission, Outcome
from ..scheduling.errors import SchedulingError, Unavailable, shutting_down
from ..metrics import Metrics
from .admission import SharedCount
from ...ipc.shm import Arena, Shared, make_arena
from ..threadnames import name_this_thread

log = logging.getLogger("vggserve.serving")

AUTHKEY_BYTES = 32
PROTOCOL = pickle.HIGHEST_PROTOCOL  # 5: arrays (inline pixels) pickle without an extra copy


class DirectLink:
    """One end of a connection. Messages are written by the thread that sends them, without a writer thread's
    wake-up: pickled and handed to the socket at once without waiting (MSG_DONTWAIT). What the socket cannot take at
    once (the other side is behind) is left to the writer thread, and later messages queue behind it, in order. The
    frames are `multiprocessing.connection`'s, as the other end reads. The reader thread hands each list of messages
    received to `on_messages`, and calls `on_close` once when the connection ends (either side)."""

    def __init__(self, conn: Connection, on_messages: Callable[[list], None], on_close: Callable[[], None],
                 name: str):
        self.conn = conn
        self.on_messages = on_messages
        self.on_close = on_close
        self.name = name
        self._closed = threading.Event()
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._backlog: deque = deque()  # frames (or what is left of one) for the writer thread, in order
        self._wake = threading.Condition(threading.Lock())
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name=f"{name}-writer", daemon=True)

    def start(self) -> None:
        self._writer.start()
        self._reader.start()

    def send(self, message: tuple) -> None:
        self.send_many([message])

    def send_many(self, messages: list) -> None:
        """Send these messages as one list (one frame, one system call)."""
        frame = _frame(pickle.dumps(messages, PROTOCOL))
        with self._wake:
            if self._closed.is_set():
                return
            sent = 0
            if not self._backlog:  # else behind what waits
                try:
                    sent = self._sock.send(frame, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                except OSError:
                    sent = None
            if sent is not None:
                if sent < len(frame):
                    self._backlog.append(memoryview(frame)[sent:] if sent else frame)
                    self._wake.notify()
                return
        self.close()

    def close(self) -> None:
        """End the connection: the other side sees it closed, and so do this side's reader and writer."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:  # shutdown (not close) wakes a reader blocked in recv
            with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._wake:  # the writer, waiting for a backlog, sees the link closed
            self._wake.notify()

    def _write(self) -> None:
        name_this_thread()
        try:
            while True:
                with self._wake:
                    while not self._backlog and not self._closed.is_set():
                        self._wake.wait()
                    if self._closed.is_set():
                        return
                    chunk = self._backlog[0]
                try:
                    self._sock.sendall(chunk)
                except OSError:
                    self.close()
                    return
                with self._wake:
                    self._backlog.popleft()
        finally:
            with self._wake:  # not while a sender holds the socket
                self._sock.close()

    def _read(self) -> None:
        name_this_thread()
        try:
            while True:
                self.on_messages(pickle.loads(self.conn.recv_bytes()))
        except (EOFError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a bad message ends the link, loudly
            log.exception("%s: unexpected failure reading the link", self.name)
        finally:
            self.close()
            self._writer.join(5)
            self.conn.close()
            self.on_close()


def _frame(payload: bytes) -> bytes:
    """`payload` framed as Connection.send_bytes frames it (a big-endian length first; -1 and 8 bytes past 2 GiB)."""
    n = len(payload)
    if n > 0x7FFFFFFF:
        return b"\xff\xff\xff\xff" + n.to_bytes(8, "big") + payload
    return n.to_bytes(4, "big") + payload


@dataclass(eq=False)
class RemoteItem:
    """One image sent to the engine; its future gets an Outcome or a SchedulingError from the engine. Submitted on
    an event loop (a front end's requests), the future is that loop's asyncio future, settled on the loop together
    with the other answers of the same message (`settle`); from any other thread, a concurrent Future."""

    id: int
    deadline: float
    future: "asyncio.Future | Future"
    enqueued: float = field(default_factory=time.monotonic)
    shared: Shared | None = None  # its pixels' block in the arena, freed when the engine answers
    image: ModelInput | None = None  # with several engines, held until answered: another may take it (`reroute`)
    want_logits: bool = False
    engine: int = 0  # which engine has it, among several (routing.RoutedQueue)


def _new_future() -> "asyncio.Future | Future":
    try:
        return asyncio.get_running_loop().create_future()
    except RuntimeError:
        return Future()


def settle(answers: list[tuple[RemoteItem, object, bool]]) -> None:
    """Set each (item, value, is_error)'s future: concurrent ones here, asyncio ones with one call_soon_threadsafe
    per loop for all of them (a wake-up of the loop per message, not per image)."""
    on_loops: dict = {}
    for answer in answers:
        future = answer[0].future
        if isinstance(future, Future):
            _set(future, answer[1], answer[2])
        else:
            on_loops.setdefault(future.get_loop(), []).append(answer)
    for loop, theirs in on_loops.items():
        try:
            loop.call_soon_threadsafe(_settle_here, theirs)
        except RuntimeError:  # the loop is closed: nobody waits for these any more
            pass


def _settle_here(answers: list[tuple[RemoteItem, object, bool]]) -> None:
    for item, value, is_error in answers:
        if not item.future.done():
            _set(item.future, value, is_error)


def _set(future, value, is_error: bool) -> None:
    if is_error:
        future.set_exception(value)
        future.exception()  # seen: as with a concurrent Future, an answer nobody waits for any more is not logged
    else:
        future.set_result(value)


class RemoteQueue(Admission):
    """The front end's queue: admission against --max-queue, counted with the other front ends' images when
    `shared` (an image holds its place from admission until the engine answers it), images sent to the engine,
    answers matched back to them.

    With several engines (`routing.RoutedQueue`), `room` is the Admission they all count in (its lock guards every
    queue), and `reroute(items, error)` is offered the images an engine failed or lost: it returns those it could
    not hand to another engine, which are then answered with the error."""

    def __init__(self, capacity: int, metrics: Metrics, send: Callable[[tuple], None],
                 shared: SharedCount | None = None, room: Admission | None = None):
        """`shared`: the server's admission count (`admission.SharedCount`); with `room`, that room's."""
        self._lock = room._guard if room is not None else threading.Lock()
        super().__init__(capacity, metrics, self._lock, shared)
        self._room = room if room is not None else self
        self._send = send
        self._pending: dict[int, RemoteItem] = {}
        self._ids = itertools.count()
        self.arena: Arena | None = None  # set on connect when shared memory is available
        self.reroute: Callable[[list[RemoteItem], SchedulingError], list[RemoteItem]] | None = None

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, image: ModelInput, deadline: float, want_logits: bool = False) -> RemoteItem:
        """Send one admitted image to the engine."""
        with self._lock:
            if self._closed is not None:
                self._room.count_held(-1)
                raise self._closed
            item = RemoteItem(next(self._ids), deadline, _new_future(), image=image, want_logits=want_logits)
            self._pending[item.id] = item
        self._send_item(item)
        if self.reroute is None:  # one engine: nothing can take the image over, so it need not be held
            item.image = None
        return item

    def _send_item(self, item: RemoteItem) -> None:
        if self.arena is not None:
            item.shared = self.arena.put_image(item.image)
        self._send(("submit", item.id, item.shared or item.image, item.deadline - time.monotonic(),
                    item.want_logits))

    def take_over(self, item: RemoteItem, engine: int) -> bool:
        """Send an image another engine failed or lost to this one (it keeps its future and its room); False when
        this queue is closed."""
        with self._lock:
            if self._closed is not None:
                return False
            self._room.count_held(1)
            item.id, item.engine = next(self._ids), engine
            self._pending[item.id] = item
        self._send_item(item)
        return True

    def _offer(self, items: list[RemoteItem], error: SchedulingError) -> list[RemoteItem]:
        """The items (answered by `error`, their room given back) that no other engine takes."""
        for item in items:
            if item.shared is not None:
                self.arena.free(item.shared)
                item.shared = None
        if self.reroute is None or not items:
            return items
        return self.reroute(items, error)

    def withdraw(self, item: RemoteItem, error: SchedulingError) -> bool:
        """Ask the engine to drop the image if it still waits; its answer (this error, or its result if a device
        has it already) arrives as for any image. False: not known yet."""
        self._send(("withdraw", item.id, error))
        return False

    def resolve(self, image_id: int, outcome=None, error: SchedulingError | None = None) -> None:
        """The engine's answer for one image."""
        with self._lock:
            item = self._pending.pop(image_id, None)
            if item is None:
                return
            self._room.count_held(-1)
        if error is not None:
            settle([(item, error, True) for item in self._offer([item], error)])
            return
        if item.shared is not None:
            self.arena.free(item.shared)
        settle([(item, outcome, False)])

    def resolve_rows(self, image_ids: list[int], probabilities, logits, asked: list[int], queue_s: list[float],
                     inference_s: float, batch_size: int, device: str) -> None:
        """The engine's "results" for several images of one batch (the message's fields): each its Outcome."""
        with self._lock:
            items = [self._pending.pop(image_id, None) for image_id in image_ids]
            self._room.count_held(-sum(item is not None for item in items))
        probabilities = rows_of(probabilities, len(image_ids))
        rows = dict(zip(asked, rows_of(logits, len(asked)))) if asked else {}
        answers = []
        for i, item in enumerate(items):
            if item is None:
                continue
            if item.shared is not None:
                self.arena.free(item.shared)
            answers.append((item, Outcome(probabilities[i], queue_s[i], inference_s, batch_size, device,
                                          rows.get(i)), False))
        settle(answers)

    def close(self, error: SchedulingError) -> None:
        """Refuse further images with `error` and fail those still waiting for the engine with it."""
        with self._lock:
            self._closed = error
            left = list(self._pending.values())
            self._pending.clear()
            self._room.count_held(-len(left))
        settle([(item, error, True) for item in self._offer(left, error)])


def rows_of(data: bytes, n: int) -> np.ndarray:
    """The (n, classes) float32 array a "results" message carries as its bytes (a writable copy, as unpickled)."""
    return np.frombuffer(data, np.float32).reshape(n, -1).copy()


class EngineClient:
    """A front end's connection to the engine: the link, the remote queue, the engine's last state, calls."""

    def __init__(self, address: str, authkey: bytes, capacity: int, metrics: Metrics, index: int,
                 shared: SharedCount | None = None, room: Admission | None = None):
        self.address = address
        self.authkey = authkey
        self.index = index
        self.state: dict | None = None  # the engine's last "state" message
        self.on_lost: Callable[[str], None] | None = None  # the engine went away
        self.on_state: Callable[[], None] | None = None  # a new "state" message arrived
        self._first_state = threading.Event()
        self._calls: dict[int, Future] = {}
        self._call_ids = itertools.count()
        self.link: DirectLink | None = None
        self._outgoing: list = []  # messages of this turn of the event loop, sent together at its end
        self.queue = RemoteQueue(capacity, metrics, self._send, shared, room)
        self._arena: Arena | None = None
        self._stopping = False

    def _send(self, message: tuple) -> None:
        """Send now from a plain thread; on an event loop, with the others of this turn of the loop, in one list."""
        if self.link is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.link.send(message)
            return
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.append(message)

    def _flush(self) -> None:
        messages, self._outgoing = self._outgoing, []
        if messages and self.link is not None:
            self.link.send_many(messages)

    def connect(self, wait_state_s: float = 5.0, arena: bool = True) -> None:
        """Connect and say hello; wait (bounded) for the engine's first state, so readiness is known at once.
        `arena`: offer a shared-memory arena for the pixels (a link that sends none, a supervisor's, needs none)."""
        conn = Client(self.address, family="AF_UNIX", authkey=self.authkey)
        if arena:  # inputs through shared memory (shm.py) once the engine says it mapped it
            self._arena = make_arena()
        self.link = DirectLink(conn, self._received_all, self._closed, f"vggserve-frontend{self.index}-link")
        self.link.start()
        self.link.send(("hello", self.index, os.getpid(), self._arena and self._arena.name))
        self._first_state.wait(wait_state_s)

    def close(self) -> None:
        self._stopping = True
        self.queue.close(shutting_down())
        if self.link is not None:
            self.link.close()
        if self._arena is not None:
            self._arena.close()  # unlinked now; the engine's mapping lasts until it lets go

    async def call(self, what: str, timeout_s: float = 5.0):
        """The engine's answer to a call ("metadata"); Unavailable if it does not come in time."""
        call_id = next(self._call_ids)
        future: Future = Future()
        self._calls[call_id] = future
        self._send(("call", call_id, what))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except asyncio.TimeoutError:
            raise Unavailable("unavailable", f"the engine process did not answer within {timeout_s:.0f} s") from None
        finally:
            self._calls.pop(call_id, None)

    def _received_all(self, messages: list) -> None:
        for message in messages:
            self._received(message)

    def _received(self, message: tuple) -> None:
        kind = message[0]
        if kind == "results":
            self.queue.resolve_rows(*message[1:])
        elif kind == "result":
            self.queue.resolve(message[1], outcome=message[2])
        elif kind == "error":
            self.queue.resolve(message[1], error=message[2])
        elif kind == "state":
            self.state = message[1]
            self._first_state.set()
            if self.on_state is not None:
                self.on_state()
        elif kind == "arena":
            if message[1] and self._arena is not None:
                self.queue.arena = self._arena
        elif kind == "reply":
            future = self._calls.get(message[1])
            if future is not None and not future.done():
                future.set_result(message[2])
        else:
            log.warning("front end %d: unknown message %r from the engine", self.index, kind)

    def _closed(self) -> None:
        self.queue.close(shutting_down("the engine process went away; retry"))
        for future in list(self._calls.values()):
            if not future.done():
                future.set_exception(shutting_down())
        if not self._stopping:
            log.error("front end %d: lost the link to the engine process (%s)", self.index,
                      os.path.basename(self.address))
            if self.on_lost is not None:
                self.on_lost("the engine process went away")
