"""launches.Launches: device decodes' launches handed from decode threads to the rank's thread, which runs them
before its submits; a launch nobody takes in time is run by its own thread. No OpenCL needed."""

from __future__ import annotations

import threading
import time

import pytest

from vggserve.decoding.device.launches import Launches

WAIT = 10.0


def handed(launches, launch, out: dict, key: str) -> threading.Thread:
    """A decode thread handing `launch` over; its answer (or exception) lands in out[key]."""

    def run():
        try:
            out[key] = launches(launch)
        except Exception as exc:
            out[key] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def until(predicate) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_the_rank_thread_runs_launches_handed_over_in_order_and_each_thread_gets_its_own_answer():
    launches, ran, out = Launches(handoff_s=WAIT), [], {}
    threads = []
    for name in ("a", "b"):
        threads.append(handed(launches, lambda name=name: ran.append((name, threading.get_ident())) or name.upper(),
                              out, name))
        until(lambda: len(launches._waiting) == len(threads))
    assert ran == [] and out == {}  # nothing runs until the rank's thread takes them
    assert launches.run_waiting() == 2
    for thread in threads:
        thread.join(WAIT)
    assert [name for name, _ in ran] == ["a", "b"] and {ident for _, ident in ran} == {threading.get_ident()}
    assert out == {"a": "A", "b": "B"} and (launches.taken, launches.own) == (2, 0)
    assert launches.run_waiting() == 0


def test_a_launchs_exception_is_raised_on_the_thread_that_handed_it_over():
    launches, out = Launches(handoff_s=WAIT), {}

    def broken():
        raise RuntimeError("the device said no")

    thread = handed(launches, broken, out, "x")
    until(lambda: launches._waiting)
    launches.run_waiting()  # the rank's thread is not hurt by it
    thread.join(WAIT)
    assert isinstance(out["x"], RuntimeError) and str(out["x"]) == "the device said no"


def test_a_launch_nobody_takes_in_time_runs_on_its_own_thread_once():
    launches, ran, out = Launches(handoff_s=0.05), [], {}
    thread = handed(launches, lambda: ran.append(threading.get_ident()) or 7, out, "x")
    thread.join(WAIT)
    assert out == {"x": 7} and ran == [thread.ident] and (launches.taken, launches.own) == (0, 1)
    assert launches.run_waiting() == 0  # not run a second time


def test_wait_runs_launches_until_what_it_waits_for_is_done_and_a_wake_ends_it():
    launches, out, done = Launches(handoff_s=WAIT), {}, threading.Event()

    def decode_thread():  # hands its launch over, then finishes "decoding" and wakes the waiter
        out["run"] = launches(lambda: "launched")
        done.set()
        launches.wake()

    thread = threading.Thread(target=decode_thread)
    thread.start()
    started = time.monotonic()
    launches.wait(done.is_set)  # this thread takes the launch, then sleeps until the wake
    thread.join(WAIT)
    assert out == {"run": "launched"} and launches.taken == 1 and time.monotonic() - started < WAIT


@pytest.mark.parametrize("decoders", [1, 3])
def test_every_launch_is_run_exactly_once_whoever_runs_it(decoders):
    launches, ran, lock = Launches(handoff_s=0.002), [], threading.Lock()
    out, threads = {}, []

    def launch(key):
        with lock:
            ran.append(key)
        return key

    for d in range(decoders):
        def loop(d=d):
            for i in range(40):
                out[(d, i)] = launches(lambda key=(d, i): launch(key))
        threads.append(threading.Thread(target=loop))
        threads[-1].start()
    while any(t.is_alive() for t in threads):  # a rank thread that takes some, not all
        launches.run_waiting()
        time.sleep(0.003)
    assert sorted(ran) == sorted(out) and all(out[k] == k for k in out) and len(out) == 40 * decoders
    assert launches.taken + launches.own == 40 * decoders
