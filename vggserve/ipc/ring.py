"""Decoded images from decode processes to the process that started them, through shared memory: each process
writes an image's pixels into a block of its own region and sends only where they lie; nothing is pickled.

One segment, made and owned by the consumer (`Ring`), holds one region per decode process, after a header with
one 64-byte line per region. The segment has no name (shm.anonymous_segment): the writers get its descriptor when
they are started (Popen's pass_fds), so nothing is left in /dev/shm whichever way the processes end, a kill -9
included.

    [ line 0 | line 1 | ... ][ region 0 ............ ][ region 1 ............ ] ...
    line: released (int64, written by the consumer), begun (int64) and began_at (float64, written by the writer)

Positions in a region are counted in bytes since the region was made, and only grow; position p lies at byte
p % size of the region. The region's writer (`RegionWriter`, in the decode process) takes blocks one after the
other, jumping to the region's start when a block would not fit before its end, and reports each block's
(start, end) with its answer. The consumer frees blocks in any order (`Ring.free`); once the oldest blocks of a
region are free, it moves the region's `released` counter in the header past them. The writer may overwrite
only positions below `released` + size: it never waits for a message, and when the region is full it says so
(`allocate` returns None) and the caller sends the pixels another way. Only the consumer writes `released`, only
the writer writes pixels, and the consumer reads a block only after the writer's answer for it has arrived.

A writer that dies is replaced by a new one on the same region, starting after the last block the consumer was
told about (`Ring.writer_spec`): blocks the consumer still holds stay intact.

The writer also says what it is doing without a message: before each image it stores the time
(`time.monotonic()`, one clock for every process of the machine) and then counts the image in `begun`
(`RegionWriter.begin`); `Ring.progress` reads both. A process that answers several images in one message can so be
told which image it died or hung on.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .shm import anonymous_segment, map_descriptor

LINE = 64  # header bytes per region, and the alignment of every block


@dataclass(frozen=True)
class RegionSpec:
    """What a writer needs to write into region `index` of the segment open as descriptor `fd` (in the writer's
    process: the consumer passes it to the child under the same number), from position `start` on."""

    fd: int
    index: int
    counter_offset: int
    data_offset: int
    size: int
    start: int


class Block(NamedTuple):
    """Positions [start, end) of region `region` (a tuple: made and compared for every image)."""

    region: int
    start: int
    end: int


def _aligned(nbytes: int) -> int:
    return -(-nbytes // LINE) * LINE


def _nbytes(shape: tuple, dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


class Ring:
    """The consumer's side: the segment, each region's live blocks, the `released` counters, the writers'
    progress."""

    def __init__(self, regions: int, region_bytes: int):
        if regions < 1:
            raise ValueError(f"a ring needs at least one region, got {regions}")
        self.regions = regions
        self.region_bytes = _aligned(max(LINE, region_bytes))
        self.fd = anonymous_segment(regions * (LINE + self.region_bytes))  # for the writers (pass_fds)
        # views are made on a mapping that is never closed: it is unmapped when the last view is gone (numpy holds
        # no buffer export, so closing a mapping would not wait for the views)
        self.mapping = map_descriptor(self.fd)
        self._released = np.ndarray((regions,), np.int64, self.mapping, 0, (LINE,))
        self._released[:] = 0
        self._begun = np.ndarray((regions,), np.int64, self.mapping, 8, (LINE,))
        self._began_at = np.ndarray((regions,), np.float64, self.mapping, 16, (LINE,))
        self._live: list[deque] = [deque() for _ in range(regions)]  # [block, freed], in allocation order
        self._reported = [0] * regions  # end of the last block reported per region
        self._lock = threading.Lock()

    def _data_offset(self, region: int) -> int:
        return self.regions * LINE + region * self.region_bytes

    def writer_spec(self, region: int) -> RegionSpec:
        """For a (new) writer of `region`: it continues after the last block reported."""
        with self._lock:
            start = self._reported[region]
        return RegionSpec(self.fd, region, region * LINE, self._data_offset(region), self.region_bytes, start)

    def take(self, block: Block, shape: tuple, dtype) -> np.ndarray:
        """Note a block a writer reported and return a view of its array (valid until `free(block)`)."""
        with self._lock:
            self._live[block.region].append([block, False])
            self._reported[block.region] = block.end
        offset = self._data_offset(block.region) + block.start % self.region_bytes
        return np.ndarray(shape, dtype, self.mapping, offset)

    def free(self, block: Block) -> None:
        """The consumer is done with the block's pixels; the writer may reuse them once the older ones are free."""
        self.free_many((block,))

    def free_many(self, blocks) -> None:
        """`free` for several blocks at once (a chunk's)."""
        by_region: dict[int, set] = {}
        for block in blocks:
            by_region.setdefault(block.region, set()).add(block)
        with self._lock:
            touched = []
            for region, wanted in by_region.items():
                for entry in self._live[region]:  # one walk from the oldest (a chunk's blocks are mostly there)
                    if entry[0] in wanted:
                        entry[1] = True
                        wanted.discard(entry[0])
                        if not wanted:
                            break
                touched.append(region)
            for region in touched:
                live, released = self._live[region], None
                while live and live[0][1]:
                    released = live.popleft()[0].end
                if released is not None:
                    self._released[region] = released

    def progress(self, region: int) -> tuple[int, float]:
        """(images the region's current writer has begun, time.monotonic() when it began the latest)."""
        return int(self._begun[region]), float(self._began_at[region])

    def live_blocks(self) -> int:
        with self._lock:
            return sum(len(live) for live in self._live)

    def close(self) -> None:
        """Close the descriptor (no new writer can be started); the memory goes when no view of it is left here
        and no writer maps it."""
        self._released = self._begun = self._began_at = None
        self.mapping = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RegionWriter:
    """A decode process's side: blocks of its region, taken one after the other."""

    def __init__(self, spec: RegionSpec):
        self.spec = spec
        self.memory = map_descriptor(spec.fd)
        self._released = np.ndarray((1,), np.int64, self.memory, spec.counter_offset)
        self._begun = np.ndarray((1,), np.int64, self.memory, spec.counter_offset + 8)
        self._began_at = np.ndarray((1,), np.float64, self.memory, spec.counter_offset + 16)
        self._begun[0] = 0  # a new writer: nothing begun yet (before it says it is ready)
        self.head = spec.start
        self._last: tuple[Block, int] | None = None  # the latest block and the head before it

    def allocate(self, shape: tuple, dtype) -> tuple[Block, np.ndarray] | None:
        """A block for an array of `shape` and `dtype` and a view of it, or None when the region has no room."""
        nbytes, size = _aligned(_nbytes(shape, dtype)), self.spec.size
        position = self.head % size
        start = self.head if position + nbytes <= size else self.head + size - position
        end = start + nbytes
        if end - int(self._released[0]) > size:
            return None
        block = Block(self.spec.index, start, end)
        self._last, self.head = (block, self.head), end
        offset = self.spec.data_offset + start % size
        return block, np.ndarray(shape, dtype, self.memory, offset)

    def begin(self) -> None:
        """Note that the next image starts now (for `Ring.progress`)."""
        self._began_at[0] = time.monotonic()
        self._begun[0] += 1

    def undo(self, block: Block) -> None:
        """Give back the latest block (its answer will not mention it)."""
        if self._last is not None and self._last[0] == block:
            self.head = self._last[1]
            self._last = None

    def close(self) -> None:
        self._released = self._begun = self._began_at = None
        self.memory = None  # unmapped once no view is left
