"""Decode groups: several batches' JPEGs decoded on the device by one sequence of launches.

The device decoder's synchronisation rounds are bound by latency, not by work (in most rounds few chunks of the
scan are still moving), so a group of k batches costs the device much less than k decodes. The batch job
(`decoding.device.chunks`) and the service's engine (`serving.scheduling.devicedecode`) form groups by the same
rule: up to GROUP batches, oldest first, GROUP_BYTES of encoded files at most, and the first batch always goes.
"""

from __future__ import annotations

import os
from collections import deque

# Batches per device decode at most: four 500x375 batches of 64 in one launch sequence pay the ~14 latency-bound
# synchronisation rounds once instead of four times. A batch-job rank holds a group's chunks more than it would
# without groups (workqueue.rank_tokens), so that a group can form while the device works on the chunks before it;
# the service's engine groups full batches already waiting (`serve --decode-group`).
GROUP = 4
# The group's encoded bytes at most: the decoder's scratch (coefficients, samples) and the group's output buffer
# grow with the group. 24 MB takes four batches of 64 typical 70 KB photos (4.6 MB each) and leaves a batch of
# phone photos (64 x 544 KB of serve_saturation's mix, 35 MB) alone.
GROUP_BYTES = 24 << 20


def check(group: int, group_bytes: int) -> None:
    if group < 1 or group_bytes < 0:
        raise ValueError(f"a decode group is 1 batch or more and 0 bytes or more; got {group}, {group_bytes}")


def take(waiting: deque, group: int = GROUP, group_bytes: int = GROUP_BYTES) -> list:
    """Pop the next group off `waiting` (items whose last element is their encoded size in bytes), oldest first:
    at most `group` items and `group_bytes` bytes, except that the first item always goes. The caller holds the
    lock that guards `waiting`."""
    taken, size = [], 0
    while waiting and len(taken) < group:
        more = waiting[0][-1]
        if taken and size + more > group_bytes:
            break
        taken.append(waiting.popleft())
        size += more
    return taken


def source_bytes(source) -> int:
    """A source's encoded size: its length (bytes), or its file's size (a path; 0 where it cannot be read: its
    decode answers the error)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    try:
        return os.stat(source).st_size
    except (OSError, TypeError, ValueError):
        return 0
