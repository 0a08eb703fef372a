"""The server's side of a level, from two scrapes of its Prometheus `/metrics` text.

Histograms are cumulative, so the average over a window is delta(_sum) / delta(_count) between the scrape
before and the scrape after the level. Seconds are turned into milliseconds here.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# summary key -> histogram family (seconds unless noted)
SPLIT_HISTOGRAMS = {
    "server_queue_ms": "vggserve_queue_seconds",
    "server_preprocess_ms": "vggserve_preprocess_seconds",
    "server_inference_ms": "vggserve_inference_seconds",
    "server_request_ms": "vggserve_request_seconds",
}
BATCH_SIZE = "vggserve_batch_size"
CLASSIFY_ENDPOINT_LABELS = ("/classify", "classify", "/v2/models/vgg16/infer")  # the endpoints a run drives
SERVER_KEYS = tuple(SPLIT_HISTOGRAMS) + ("server_batch_size", "server_requests", "server_rejected",
                                         "server_timeouts")


class Snapshot:
    """One scrape: every sample as (name, sorted label pairs) -> value."""

    def __init__(self, samples: dict[tuple[str, tuple], float], families: frozenset[str] = frozenset()):
        self.samples = samples
        self.families = families  # the names of the metrics exported, with or without samples

    @classmethod
    def parse(cls, text: str) -> "Snapshot":
        """Parse Prometheus text exposition format (raises ValueError on malformed text)."""
        samples, families = {}, set()
        for family in text_string_to_metric_families(text):
            families.add(family.name)
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
        return cls(samples, frozenset(families))

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of the samples called `name` whose labels include `labels`; None if the server does not export
        `name`, 0 if it does without such a sample (a labelled counter shows no sample before its first event)."""
        values = [v for (n, pairs), v in self.samples.items()
                  if n == name and all(dict(pairs).get(k) == want for k, want in labels.items())]
        if values:
            return sum(values)
        return 0.0 if name.removesuffix("_total") in self.families or name in self.families else None


def _delta(before: Snapshot, after: Snapshot, name: str, **labels: str) -> float | None:
    a, b = after.total(name, **labels), before.total(name, **labels)
    if a is None:
        return None
    return a - (b or 0.0)


def _mean(before: Snapshot, after: Snapshot, family: str, scale: float = 1.0) -> float | None:
    total, count = _delta(before, after, family + "_sum"), _delta(before, after, family + "_count")
    if total is None or not count:
        return None
    return total / count * scale


def _classify_requests(before: Snapshot, after: Snapshot) -> float | None:
    """Delta of vggserve_requests_total{endpoint="/classify" or v2 infer} over statuses (/classify/batch excluded)."""
    deltas = [_delta(before, after, "vggserve_requests_total", endpoint=e) for e in CLASSIFY_ENDPOINT_LABELS]
    deltas = [d for d in deltas if d is not None]
    return sum(deltas) if deltas else None


def server_split(before: Snapshot | None, after: Snapshot | None) -> dict[str, float | None]:
    """Mean queue/preprocess/inference/request time (ms), mean batch size and counter deltas over a window.

    Every key of SERVER_KEYS is present; a value is None where the server does not export that metric or saw
    no event in the window.
    """
    result: dict[str, float | None] = dict.fromkeys(SERVER_KEYS)
    if before is None or after is None:
        return result
    for key, family in SPLIT_HISTOGRAMS.items():
        result[key] = _mean(before, after, family, scale=1000.0)
    result["server_batch_size"] = _mean(before, after, BATCH_SIZE)
    result["server_requests"] = _classify_requests(before, after)
    result["server_rejected"] = _delta(before, after, "vggserve_rejected_total")
    result["server_timeouts"] = _delta(before, after, "vggserve_timeouts_total")
    return result


async def scrape(client: httpx.AsyncClient, url: str) -> tuple[Snapshot | None, str | None]:
    """(snapshot, None), or (None, why) when /metrics cannot be fetched or parsed: the run goes on without it."""
    try:
        response = await client.get(url)
    except httpx.HTTPError as exc:
        return None, f"cannot scrape {url}: {type(exc).__name__}"
    if response.status_code != 200:
        return None, f"cannot scrape {url}: HTTP {response.status_code}"
    try:
        return Snapshot.parse(response.text), None
    except ValueError as exc:
        return None, f"cannot parse {url}: {exc}"
