"""runtime.waits: a command waited for by sleeping between status checks returns once it is complete, with its
result, and a failed one raises as a blocking wait does."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyopencl as cl
import pytest

from vggserve.runtime import devices as devs
from vggserve.runtime import waits


@pytest.fixture(scope="module")
def context(test_device):
    dev = devs.cl_device(devs.resolve(test_device))
    return cl.Context([dev])


def test_a_copy_waited_for_has_its_bytes(context):
    queue = cl.CommandQueue(context)
    data = np.arange(1 << 20, dtype=np.uint8)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, data.nbytes)
    cl.enqueue_copy(queue, buf, data)
    out = np.zeros_like(data)
    event = cl.enqueue_copy(queue, out, buf, is_blocking=False)  # not flushed: wait flushes it
    waits.wait(event)
    assert event.command_execution_status == cl.command_execution_status.COMPLETE
    assert np.array_equal(out, data)


def test_the_wait_lasts_until_the_command_it_waits_for_completes(context):
    queue = cl.CommandQueue(context)
    gate = cl.UserEvent(context)
    out = np.zeros(16, np.uint8)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.full(16, 7, np.uint8))
    event = cl.enqueue_copy(queue, out, buf, is_blocking=False, wait_for=[gate])
    opened = []

    def open_gate():
        time.sleep(0.05)
        opened.append(time.monotonic())
        gate.set_status(cl.command_execution_status.COMPLETE)

    threading.Thread(target=open_gate).start()
    waits.wait(event)
    assert opened and time.monotonic() >= opened[0] and (out == 7).all()


def test_a_failed_command_raises_as_a_blocking_wait_does(context):
    gate = cl.UserEvent(context)
    threading.Timer(0.02, lambda: gate.set_status(-1)).start()
    with pytest.raises(cl.Error):
        waits.wait(gate)


@pytest.mark.parametrize("value, expected", [(None, "poll"), ("block", "block"), (" POLL ", "poll"),
                                             ("spin", "poll")])
def test_the_mode_comes_from_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("VGGSERVE_EVENT_WAIT", raising=False)
    else:
        monkeypatch.setenv("VGGSERVE_EVENT_WAIT", value)
    assert waits.mode() == expected
