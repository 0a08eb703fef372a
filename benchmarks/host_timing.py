"""The host's cost of an enqueueing call, timed as launch_cost.py and command_buffer_probe.py time it."""

import time


def per_call_us(queue, body, iterations: int) -> tuple[float, float]:
    """(host microseconds per call of `body`, microseconds per call until the queue has finished them), the queue
    drained first."""
    queue.finish()
    t = time.perf_counter()
    for _ in range(iterations):
        body()
    host = (time.perf_counter() - t) / iterations * 1e6
    queue.finish()
    return round(host, 2), round((time.perf_counter() - t) / iterations * 1e6, 2)
