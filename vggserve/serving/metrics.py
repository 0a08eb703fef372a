"""Prometheus metrics in a registry of our own (one per app, so several apps in one process do not collide),
and the middleware that counts requests by endpoint and status.

With HTTP front-end processes (`--http-workers N`) every process writes its metrics to files in one directory
(prometheus_client's multiprocess mode, `multiprocess_metrics`) and a scrape of any front end reads them all, so
/metrics shows the whole server. The names are agreed with the load-test harness, which scrapes them; change them
only together.
"""

import bisect
import os
import time
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from .modelcard import VGG16_CARD

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)  # batches per device decode: --decode-group is 1..16
# endpoints counted under their own name; any other path is counted as "other" to bound label cardinality
_V2_MODEL = [f"/v2/models/{VGG16_CARD.name}{v}" for v in ("", f"/versions/{VGG16_CARD.version}")]
V2_INFER = tuple(m + "/infer" for m in _V2_MODEL)
KNOWN_ENDPOINTS = frozenset({
    "/classify", "/classify/batch", "/health/live", "/health/ready", "/metadata", "/metrics", "/docs", "/openapi.json",
    "/v2", "/v2/health/live", "/v2/health/ready", *_V2_MODEL, *V2_INFER, *(m + "/ready" for m in _V2_MODEL),
    *(m + "/config" for m in _V2_MODEL), "/v2/models/stats", *(m + "/stats" for m in _V2_MODEL)})
TIMED_ENDPOINTS = frozenset({"/classify", "/classify/batch", *V2_INFER})


@contextmanager
def multiprocess_metrics(directory: str):
    """While inside: this process writes every metric created to files in `directory`, as the processes it starts
    will (they inherit the environment variable and read it when prometheus_client is imported)."""
    before = os.environ.get(MULTIPROC_ENV), values.ValueClass
    os.environ[MULTIPROC_ENV] = directory
    values.ValueClass = values.MultiProcessValue()
    try:
        yield
    finally:
        if before[0] is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = before[0]
        values.ValueClass = before[1]


def forget_process(pid: int) -> None:
    """Drop the live gauges of a process that has exited (its counters and histograms stay in the totals)."""
    if os.environ.get(MULTIPROC_ENV):
        mark_process_dead(pid)


class Metrics:
    """Every metric the service exports. `multiprocess`: values live in files shared by the server's processes
    (gauges are then set explicitly, not computed at scrape time)."""

    def __init__(self, multiprocess: bool = False):
        self.multiprocess = multiprocess
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("vggserve_requests_total", "HTTP requests by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.queue_seconds = Histogram("vggserve_queue_seconds", "Time from admission to the device queue to the "
                                       "start of the image's batch on a device.", buckets=LATENCY_BUCKETS, registry=r)
        self.preprocess_seconds = Histogram("vggserve_preprocess_seconds", "Decode and preprocess time per image.",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.inference_seconds = Histogram("vggserve_inference_seconds", "Device time per batch.",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.request_seconds = Histogram("vggserve_request_seconds", "Total time per /classify, /classify/batch "
                                         "and v2 infer request as the server sees it.", buckets=LATENCY_BUCKETS,
                                         registry=r)
        self.batch_size = Histogram("vggserve_batch_size", "Images per device batch.", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.queue_length = Gauge("vggserve_queue_length", "Images waiting for a device.", registry=r,
                                  multiprocess_mode="livesum")
        self.admitted = Gauge("vggserve_admitted_images", "Images counted against --max-queue: being decoded or "
                              "waiting; with HTTP front ends, until answered (on a device too), every front end's "
                              "together, sampled every 0.1 s.", registry=r, multiprocess_mode="livemax")
        self.rejected = Counter("vggserve_rejected_total", "Requests refused at admission, by reason.", ["reason"],
                                registry=r)
        self.timeouts = Counter("vggserve_timeouts_total", "Images dropped because their deadline passed (504).",
                                registry=r)
        self.device_resized = Counter("vggserve_device_resized_images_total", "Images that the HTTP front ends sent "
                                      "decoded and the device resized and cropped.", registry=r)
        self.decoded = Counter("vggserve_decoded_images_total", "With --decode gpu or auto: uploads decoded on the "
                               "engine's device (path=device) or on the CPU (path=cpu), and why (reason; "
                               "serving/scheduling/devicedecode.py lists them).", ["path", "reason"], registry=r)
        self.device_decode_batches = Histogram("vggserve_device_decode_batches", "With --decode gpu or auto: "
                                               "batches whose JPEGs one device decode decoded together (its decode "
                                               "group, at most --decode-group).", buckets=GROUP_BUCKETS, registry=r)
        self.abandoned = Counter("vggserve_abandoned_total", "Images not computed because their client went away.",
                                 registry=r)
        self.ready = Gauge("vggserve_ready", "1 when the service is ready to classify, else 0.", registry=r,
                           multiprocess_mode="livemax")
        # what OpenCL tells about each device worker's device, set once its model is loaded
        self.device_memory = Gauge("vggserve_device_global_memory_bytes", "Global memory of the worker's OpenCL "
                                   "device.", ["device"], registry=r, multiprocess_mode="livemax")
        self.device_engine_bytes = Gauge("vggserve_device_engine_bytes", "Bytes of OpenCL buffers the engine holds on "
                                         "the worker's device (weights, activations, staging).", ["device"],
                                         registry=r, multiprocess_mode="livemax")
        self.device_compute_units = Gauge("vggserve_device_compute_units", "Compute units of the worker's OpenCL "
                                          "device.", ["device"], registry=r, multiprocess_mode="livemax")
        self.workers_ready = Gauge("vggserve_workers_ready", "Device workers that are ready.", registry=r,
                                   multiprocess_mode="livesum")
        self.device_up = Gauge("vggserve_device_up", "1 while the device's worker is ready to compute, else 0 "
                               "(loading, failed or stopped).", ["device"], registry=r, multiprocess_mode="livemax")
        self.device_failures = Counter("vggserve_device_failures_total", "Device workers failed, by device (a failed "
                                       "device is not used again; its images go to the other devices).", ["device"],
                                       registry=r)
        # what v2's statistics extension reports (protocols.v2_stats)
        self.request_outcomes = Summary("vggserve_request_outcome_seconds", "Time per /classify, /classify/batch "
                                        "and v2 infer request by outcome: success (status 200) or fail.",
                                        ["outcome"], registry=r)
        self.batches = Summary("vggserve_batch_inference_seconds", "Device time per batch, by the batch's size.",
                               ["size"], registry=r)
        self.last_inference = Gauge("vggserve_last_inference_timestamp_seconds", "When the last batch was "
                                    "computed (Unix time).", registry=r, multiprocess_mode="max")

    def batch_done(self, size: int, seconds: float) -> None:
        """A device batch of `size` images computed in `seconds`."""
        self.inference_seconds.observe(seconds)
        self.batches.labels(size=str(size)).observe(seconds)
        self.last_inference.set(time.time())

    def samples(self) -> dict[tuple, float]:
        """{(sample name, *sorted label items): value} of every metric (in multiprocess mode: of every process)."""
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        else:
            registry = self.registry
        return {(s.name, *sorted(s.labels.items())): s.value for family in registry.collect()
                for s in family.samples}

    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type (in multiprocess mode: every process's values)."""
        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST


def observe_all(histogram: Histogram, amounts: list[float]) -> None:
    """`histogram.observe(a)` for each of `amounts` (a batch's queue times), with one update of each bucket it
    touches and of the sum instead of two per amount: in multiprocess mode every update takes prometheus_client's
    process-wide lock and writes the metrics file, a cost the engine process would pay per image under its GIL."""
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:  # a prometheus_client unlike the one this was written for
        for amount in amounts:
            histogram.observe(amount)
        return
    if not amounts:
        return
    histogram._raise_if_not_observable()
    counts: dict[int, int] = {}
    for amount in amounts:
        if amount == amount:  # observe counts a NaN in no bucket
            i = bisect.bisect_left(bounds, amount)  # the first bucket with amount <= its bound, as observe finds
            counts[i] = counts.get(i, 0) + 1
    total.inc(sum(amounts))
    for i, n in counts.items():
        buckets[i].inc(n)


def endpoint_label(path: str) -> str:
    return path if path in KNOWN_ENDPOINTS else "other"


class RequestMetricsMiddleware:
    """Pure ASGI middleware: counts every HTTP response by endpoint and status, times the classify endpoints. The
    labelled children are looked up once per (endpoint, status), not per request (prometheus_client's `labels`
    costs about as much as the increments themselves)."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics
        self._counts: dict[tuple[str, int], object] = {}  # (endpoint, status) -> vggserve_requests_total's child
        self._outcomes: dict[bool, object] = {}  # succeeded -> vggserve_request_outcome_seconds's child

    def _count(self, endpoint: str, status: int):
        child = self._counts.get((endpoint, status))
        if child is None:
            child = self._counts[endpoint, status] = self.metrics.requests.labels(endpoint=endpoint,
                                                                                 status=str(status))
        return child

    def _outcome(self, succeeded: bool):
        child = self._outcomes.get(succeeded)
        if child is None:
            child = self._outcomes[succeeded] = self.metrics.request_outcomes.labels(
                outcome="success" if succeeded else "fail")
        return child

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            endpoint = endpoint_label(scope.get("path", ""))
            self._count(endpoint, status).inc()
            if endpoint in TIMED_ENDPOINTS:
                seconds = time.perf_counter() - start
                self.metrics.request_seconds.observe(seconds)
                self._outcome(status == 200).observe(seconds)
