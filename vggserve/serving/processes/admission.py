"""One admission limit for the whole server with HTTP front ends (`--http-workers N`): --max-queue counts the images
admitted by every front end together, whichever front end a request arrives on.

The engine process makes a small block of shared memory before it starts the front ends (`AdmissionBlock`): one
64-bit slot per front end, holding the images that front end has admitted and not yet had answered. A front end
writes only its own slot (`SharedCount`, under its queue's lock) and reads all of them; the supervisor clears the
slot of a front end that exited before it starts the one that replaces it, so whatever the dead one held is given
back, however it died (its images' answers went with it). The block is a descriptor with no name
(`ipc.shm.anonymous_segment`), handed to each front end like its listening socket: the kernel frees it with the
last process.

Admission takes no lock across processes, so no front end can stall the others (a lock held by a process that
dies, or by a thread waiting for its GIL, would): a front end first publishes its reservation in its slot, then
sums every slot; past --max-queue it takes the reservation back and answers 429. Of two front ends admitting at
once, the later sum sees both reservations, so together they never pass the limit. The price is on the edge: two
front ends reaching for the last free places at the same instant may both see the other's reservation and both
refuse (each then looks once more, `ATTEMPTS`). A front end's release is one store to its own slot.

Python has no memory fence; CPU store buffers could in principle let a sum read a slot before the same thread's
store is visible to others, admitting the racing images of that nanosecond window past the limit (at most one
request per front end). The engine's queue still bounds the images waiting in all at --max-queue.
"""

import mmap
import os

from ...ipc.shm import anonymous_segment, map_descriptor

SLOT_BYTES = 8
ATTEMPTS = 2  # a refusal looks again once when the sum without this front end's reservation shows room


class AdmissionBlock:
    """The engine process's side: the block, a slot per front end; `fd` goes to each front end (Popen pass_fds)."""

    def __init__(self, front_ends: int):
        self.front_ends = front_ends
        self.fd = anonymous_segment(max(mmap.PAGESIZE, front_ends * SLOT_BYTES))
        self._memory = map_descriptor(self.fd)
        self._slots = memoryview(self._memory).cast("q")

    def held(self) -> int:
        """Images admitted by every front end and not answered yet."""
        return sum(self._slots[:self.front_ends])

    def holding(self, index: int) -> int:
        return self._slots[index]

    def clear(self, index: int) -> None:
        """Give back what front end `index` held: it has exited (call only once it has been reaped)."""
        self._slots[index] = 0

    def count(self, index: int, capacity: int) -> "SharedCount":
        """Front end `index`'s count over this block (in this process: tests, benchmarks)."""
        return SharedCount(self._memory, index, self.front_ends, capacity)

    def close(self) -> None:
        self._slots.release()
        self._memory.close()
        os.close(self.fd)


class SharedCount:
    """A front end's side: `admit(held, n)` publishes `held` (its images with the n new ones) and says whether the
    server stays within `capacity`; `set(held)` publishes a change that needs no check (images answered)."""

    __slots__ = ("_slots", "index", "capacity", "_memory")

    def __init__(self, memory, index: int, front_ends: int, capacity: int):
        self._memory = memory
        self._slots = memoryview(memory).cast("q")[:front_ends]
        self.index = index
        self.capacity = capacity

    @classmethod
    def attach(cls, fd: int, index: int, front_ends: int, capacity: int) -> "SharedCount":
        """Map the block a front end inherited as descriptor `fd` (closed here: the mapping keeps the memory)."""
        try:
            memory = map_descriptor(fd)
        finally:
            os.close(fd)
        return cls(memory, index, front_ends, capacity)

    def admit(self, held: int, n: int) -> bool:
        """Publish `held` (n of them new); False, with `held - n` published again, when that passes the limit. No
        images (a request whose every file failed before admission) always fit, as in a front end of its own."""
        if not n:
            return True
        slots, index = self._slots, self.index
        for _ in range(ATTEMPTS):
            slots[index] = held
            if sum(slots) <= self.capacity:
                return True
            slots[index] = held - n
            if sum(slots) + n > self.capacity:  # no room even without this reservation: refuse without looking again
                return False
        return False

    def set(self, held: int) -> None:
        self._slots[self.index] = held

    def total(self) -> int:
        return sum(self._slots)
