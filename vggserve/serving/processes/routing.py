"""A front end's links to several engine processes (`--engine-processes per-device`), used as one: `EngineRouter`
offers what `RemoteBackend` takes from an `EngineClient` (the queue, the state, calls, `on_lost`).

Each image goes to the ready engine with the fewest images outstanding from this front end (join the shortest
queue). An engine that is not ready, refuses images or whose link is gone gets none. Images an engine failed (its
device died: no_workers, inference_failed) or lost (its process went away) go to another ready engine while this
front end still holds them, else they are answered with that error (a 503). The front end's admitted images
count the images of every engine together (`RoutedQueue`, the room its engines' RemoteQueues count in), and with
the other front ends' in --max-queue (`admission`). Readiness
is ready while any engine is; the front end gives up (`on_lost`) only when every link is gone.
"""

import asyncio
import logging
import threading
from typing import Callable

from ...wording import count
from ..metrics import Metrics
from ..scheduling.batcher import Admission
from ..scheduling.errors import SchedulingError, Unavailable
from .admission import SharedCount
from .engine_link import EngineClient, RemoteItem

log = logging.getLogger("vggserve.serving")

# what an engine answers for images it will not compute because its device (or itself) is out
RETRY_CODES = frozenset({"no_workers", "inference_failed", "shutting_down"})


class RoutedQueue(Admission):
    """The front end's queue over several engines: one room (--max-queue, shared with the other front ends when
    `shared`), each image sent to the shortest usable engine queue."""

    def __init__(self, capacity: int, metrics: Metrics, shared: SharedCount | None = None, index: int = 0):
        super().__init__(capacity, metrics, threading.Lock(), shared)
        self.index = index  # the front end's, for the log
        self.queues = []  # the engines' RemoteQueues, counting in this room
        self.usable: list[bool] = []  # which engines take images now (`EngineRouter._merge`)
        self.stopping = False

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)

    def pick(self, exclude: int | None = None) -> int | None:
        """The usable engine (not `exclude`) with the fewest images outstanding from this front end."""
        best, fewest = None, None
        for index, (queue, usable) in enumerate(zip(self.queues, self.usable)):
            if usable and index != exclude and (fewest is None or len(queue) < fewest):
                best, fewest = index, len(queue)
        return best

    def submit(self, image, deadline: float, want_logits: bool = False) -> RemoteItem:
        index = self.pick()
        if index is None:
            with self._guard:
                self.count_held(-1)
            raise Unavailable("no_workers", "no engine process can take images now; retry in a moment")
        item = self.queues[index].submit(image, deadline, want_logits)
        item.engine = index
        return item

    def withdraw(self, item: RemoteItem, error: SchedulingError) -> bool:
        return self.queues[item.engine].withdraw(item, error)

    def reroute(self, origin: int, items: list[RemoteItem], error: SchedulingError) -> list[RemoteItem]:
        """Hand images engine `origin` failed or lost to the others; those no other engine takes."""
        if self.stopping or error.code not in RETRY_CODES:
            return items
        self.usable[origin] = False  # until its next state says otherwise
        left = []
        for item in items:
            target = self.pick(exclude=origin)
            if target is None or not self.queues[target].take_over(item, target):
                left.append(item)
        moved = len(items) - len(left)
        if moved:
            log.warning("front end %d: engine %d gave back %s (%s); sent to the other engines", self.index, origin,
                        count(moved, "image"), error.code)
        return left

    def close(self, error: SchedulingError) -> None:
        self.stopping = True
        for queue in self.queues:
            queue.close(error)


class EngineRouter:
    """Links to every engine process (`addresses`, one per device, `devices` naming them), used as one
    EngineClient: `queue`, `state` (merged), `connect`, `close`, `call`, `on_lost`."""

    def __init__(self, addresses: list[str], authkey: bytes, capacity: int, metrics: Metrics, index: int,
                 shared: SharedCount | None = None, devices: tuple[str, ...] = ()):
        self.index = index
        self.devices = devices or tuple(str(i) for i in range(len(addresses)))
        self.queue = RoutedQueue(capacity, metrics, shared, index)
        self.clients = [EngineClient(a, authkey, capacity, metrics, index, room=self.queue) for a in addresses]
        self.up = [False] * len(addresses)  # linked, and the link not lost
        self.queue.queues = [c.queue for c in self.clients]
        self.queue.usable = [False] * len(addresses)
        self.state: dict | None = None
        self.on_lost: Callable[[str], None] | None = None
        for number, client in enumerate(self.clients):
            client.queue.reroute = lambda items, error, n=number: self.queue.reroute(n, items, error)
            client.on_state = self._merge
            client.on_lost = lambda why, n=number: self._lost(n, why)

    def connect(self, wait_state_s: float = 5.0) -> None:
        """Connect to every engine; those that cannot be reached are left out (an error only if none can)."""
        failure = None
        for number, client in enumerate(self.clients):
            try:
                client.connect(wait_state_s)
                self.up[number] = True
            except OSError as exc:
                failure = exc
                log.warning("front end %d: engine %d (%s) cannot be reached (%s); serving through the others",
                            self.index, number, self.devices[number], exc)
        if not any(self.up):
            raise failure
        self._merge()

    def close(self) -> None:
        self.queue.stopping = True
        for client in self.clients:
            client.close()

    def _lost(self, number: int, why: str) -> None:
        self.up[number] = False
        self._merge()
        if not any(self.up) and self.on_lost is not None:
            self.on_lost("every engine process went away")

    def _merge(self) -> None:
        """The engines' states as one: ready while any is (the detail names the others), live while any is,
        accepting while any does; which engines take images."""
        states = {n: c.state for n, c in enumerate(self.clients) if self.up[n] and c.state is not None}
        self.queue.usable = [n in states and states[n]["ready"][0] and states[n]["refusal"] is None
                             for n in range(len(self.clients))]
        if not states:
            self.state = None
            return
        ready = [n for n, s in states.items() if s["ready"][0]]
        first = states[(ready or list(states))[0]]
        others = "; ".join(f"engine {n} ({self.devices[n]}): " + (states[n]["ready"][2] if n in states else "gone")
                           for n in range(len(self.clients)) if n not in ready)
        readiness = tuple(first["ready"])
        if ready:
            readiness = (True, "ready", f"{len(ready)} of {len(self.clients)} engine processes ready"
                         + (f"; {others}" if others else ""))
        live = next((tuple(s["live"]) for s in states.values() if s["live"][0]), tuple(first["live"]))
        refusal = None if any(s["refusal"] is None for s in states.values()) else first["refusal"]
        self.state = {"ready": readiness, "live": live, "refusal": refusal, "info": first["info"]}

    async def call(self, what: str, timeout_s: float = 5.0):
        """Ask every linked engine; for "metadata", the first answer with every engine's devices."""
        linked = [c for n, c in enumerate(self.clients) if self.up[n]]
        answers = await asyncio.gather(*(c.call(what, timeout_s) for c in linked), return_exceptions=True)
        good = [a for a in answers if not isinstance(a, BaseException)]
        if not good:
            raise next((a for a in answers if isinstance(a, BaseException)),
                       Unavailable("unavailable", "no engine process is linked"))
        merged = dict(good[0])
        if what == "metadata":
            merged["devices"] = [d for answer in good for d in answer.get("devices", [])]
            merged["engine_processes"] = len(self.clients)
        return merged
