"""Prometheus metrics in a registry of our own (one per app, so several apps in one process do not collide),
and the middleware that counts requests by endpoint and status.

The names are agreed with the load-test harness, which scrapes them; change them only together.
"""

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# endpoints counted under their own name; any other path is counted as "other" to bound label cardinality
KNOWN_ENDPOINTS = ("/classify", "/classify/batch", "/health/live", "/health/ready", "/metadata", "/metrics",
                   "/docs", "/openapi.json")
TIMED_ENDPOINTS = ("/classify", "/classify/batch")


class Metrics:
    """Every metric the service exports."""

    def __init__(self):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("vggserve_requests_total", "HTTP requests by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.queue_seconds = Histogram("vggserve_queue_seconds", "Time from admission to the device queue to the "
                                       "start of the image's batch on a device.", buckets=LATENCY_BUCKETS, registry=r)
        self.preprocess_seconds = Histogram("vggserve_preprocess_seconds", "Decode and preprocess time per image.",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.inference_seconds = Histogram("vggserve_inference_seconds", "Device time per batch.",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.request_seconds = Histogram("vggserve_request_seconds", "Total time per /classify and /classify/batch "
                                         "request as the server sees it.", buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("vggserve_batch_size", "Images per device batch.", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.queue_length = Gauge("vggserve_queue_length", "Images waiting for a device.", registry=r)
        self.rejected = Counter("vggserve_rejected_total", "Requests refused at admission, by reason.", ["reason"],
                                registry=r)
        self.timeouts = Counter("vggserve_timeouts_total", "Images dropped because their deadline passed (504).",
                                registry=r)
        self.abandoned = Counter("vggserve_abandoned_total", "Images not computed because their client went away.",
                                 registry=r)
        self.ready = Gauge("vggserve_ready", "1 when the service is ready to classify, else 0.", registry=r)
        self.workers_ready = Gauge("vggserve_workers_ready", "Device workers that are ready.", registry=r)

    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def endpoint_label(path: str) -> str:
    return path if path in KNOWN_ENDPOINTS else "other"


class RequestMetricsMiddleware:
    """Pure ASGI middleware: counts every HTTP response by endpoint and status, times the classify endpoints."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = {"code": 500}

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            endpoint = endpoint_label(scope.get("path", ""))
            self.metrics.requests.labels(endpoint=endpoint, status=str(status["code"])).inc()
            if endpoint in TIMED_ENDPOINTS:
                self.metrics.request_seconds.observe(time.perf_counter() - start)
