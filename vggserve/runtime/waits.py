"""Waiting for an OpenCL command without keeping a core busy.

NVIDIA's OpenCL spins in `clWaitForEvents`: a thread waiting for its batch's results, or for a device decode's
statuses, keeps a core at 100% for as long as it waits. The service's completer and the batch job's rank wait most
of the time, so each engine process and each rank kept about a core spinning (py-spy saw these threads running, not
sleeping, in `Pending.result` and `Run.keep`). On a host whose cores are shared (a VM's vCPUs), every busy core slows
the others' threads: one Python thread ran 1.6-1.9 times slower with 8-16 of 32 vCPUs busy (BENCHMARKS.md,
thirty-first session).

`wait(event)` instead asks for the command's status and sleeps between asks, 50 us at first and at most POLL_MAX_S,
then calls `event.wait()` once the command is complete, which returns at once there (and raises as before for a
command that failed). The cost is latency: a wait ends up to POLL_MAX_S after its command does.

$VGGSERVE_EVENT_WAIT=block restores the blocking wait (to measure the difference); `poll` is the default.
"""

from __future__ import annotations

import os
import time

import pyopencl as cl

POLL_FIRST_S = 50e-6
POLL_MAX_S = 200e-6
MODES = ("poll", "block")


def mode() -> str:
    """$VGGSERVE_EVENT_WAIT, or poll when it is unset or not one of MODES."""
    value = os.environ.get("VGGSERVE_EVENT_WAIT", "poll").strip().lower()
    return value if value in MODES else "poll"


_MODE = mode()


def wait(event) -> None:
    """Return once `event`'s command is complete; raise as `event.wait()` does if it failed."""
    if _MODE == "poll":
        complete = cl.command_execution_status.COMPLETE
        status = event.command_execution_status
        if status == cl.command_execution_status.QUEUED:
            event.command_queue.flush()  # clWaitForEvents would flush it; a status query does not
        nap = POLL_FIRST_S
        while status > complete:  # QUEUED, SUBMITTED, RUNNING; a failed command's status is negative
            time.sleep(nap)
            nap = min(2 * nap, POLL_MAX_S)
            status = event.command_execution_status
    event.wait()
