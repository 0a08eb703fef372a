"""Load-test harness for the classification service: `vggserve loadtest` (see docs/loadtest.md).

Closed loop (N clients back to back) or open loop (a fixed schedule, latency from each request's due time),
one level after another; per level the client view (images/s, latency percentiles, errors by status) and the
server's split scraped from /metrics (queue, preprocess, inference, batch size). Results go to CSV, JSON and
PNG files in an output folder.
"""

from .config import LoadTestConfig
from .runner import RunResult, run_loadtest

__all__ = ["LoadTestConfig", "RunResult", "run_loadtest"]
