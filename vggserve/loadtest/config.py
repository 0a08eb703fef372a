"""Load-test settings and the parsing of user input (URL, level lists) into them.

Every parser raises VggserveError with a one-line message naming the bad value, so the CLI never shows a
traceback for a typo.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..errors import VggserveError

CLASSIFY_PATH = "/classify"
V2_INFER_PATH = "/v2/models/vgg16/infer"
PROTOCOLS = ("classify", "v2")
METRICS_PATH = "/metrics"
READY_PATH = "/health/ready"

# a single level may not ask for more than this, whatever the flags say: every loop stays bounded
HARD_REQUEST_CAP = 10_000_000


@dataclass
class LoadTestConfig:
    """Everything one `vggserve loadtest` run needs; `levels` are concurrencies (closed) or rates/s (open)."""

    url: str
    images: Path
    mode: str = "closed"
    levels: list[float] = field(default_factory=lambda: [1, 4, 16, 64])
    duration_s: float = 10.0
    warmup_s: float = 2.0
    output: Path = Path("loadtest-out")
    max_requests: int = 100_000
    timeout_s: float = 30.0
    max_inflight: int = 512
    overflow: str = "wait"
    lag_threshold_ms: float = 10.0
    multipart: bool = False
    protocol: str = "classify"  # classify: POST /classify; v2: the Open Inference Protocol's infer, binary
    scrape_metrics: bool = True
    progress: bool = True
    api_key: str | None = field(default=None, repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """Headers sent with every request (the API key, when the service needs one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def classify_url(self) -> str:
        """Where images are posted."""
        return self.url + (V2_INFER_PATH if self.protocol == "v2" else CLASSIFY_PATH)

    @property
    def metrics_url(self) -> str:
        """The Prometheus text endpoint scraped before and after each level."""
        return self.url + METRICS_PATH

    @property
    def ready_url(self) -> str:
        """The readiness probe checked once before the first level."""
        return self.url + READY_PATH

    def level_label(self, level: float) -> str:
        """`c16` for 16 closed-loop clients, `r12.5` for 12.5 requests/s offered."""
        return f"c{int(level)}" if self.mode == "closed" else f"r{format_number(level)}"

    def to_json(self) -> dict:
        """The settings as plain JSON values, for summary.json."""
        data = asdict(self)
        data["images"] = str(self.images)
        data["output"] = str(self.output)
        data["api_key"] = "(set)" if self.api_key else None  # never written out
        return data


def format_number(value: float) -> str:
    """12.0 -> '12', 12.5 -> '12.5': level labels and file names without trailing zeros."""
    return f"{value:g}"


def normalise_url(url: str) -> str:
    """The service's base URL (scheme://host:port[/prefix]) from what the user typed.

    A URL ending in /classify is accepted too; /metrics and /health/ready are found next to it.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError on a non-numeric port
    except ValueError as exc:
        raise VggserveError(f"bad --url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise VggserveError(f"bad --url {url!r}: expected http://HOST:PORT (e.g. http://127.0.0.1:8000)")
    if parts.query or parts.fragment:
        raise VggserveError(f"bad --url {url!r}: give the service's base URL, without ?query or #fragment")
    del port
    path = parts.path.rstrip("/")
    if path.endswith(CLASSIFY_PATH):
        path = path[: -len(CLASSIFY_PATH)]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


MAX_CONCURRENCY = 10_000  # closed-loop clients at one level: each holds a connection, and a typo would build millions


def parse_levels(text: str, mode: str) -> list[float]:
    """'1,4,16' -> [1, 4, 16]: positive integers for closed-loop concurrency, positive numbers for rates."""
    option = "--concurrency" if mode == "closed" else "--rate"
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(item == "" for item in items):
        raise VggserveError(f"bad {option} {text!r}: expected a comma-separated list such as 1,4,16")
    levels = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            raise VggserveError(f"bad {option} {text!r}: {item!r} is not a number") from None
        if not value > 0 or value == float("inf"):
            raise VggserveError(f"bad {option} {text!r}: every value must be a positive number")
        if mode == "closed" and value != int(value):
            raise VggserveError(f"bad {option} {text!r}: concurrency must be a whole number of clients")
        if mode == "closed" and value > MAX_CONCURRENCY:
            raise VggserveError(f"bad {option} {text!r}: at most {MAX_CONCURRENCY} clients (each one a connection "
                                f"of its own); for more load than that, run an open loop (--mode open --rate)")
        levels.append(float(int(value)) if mode == "closed" else value)
    return levels


def check_positive(name: str, value: float, allow_zero: bool = False) -> float:
    """A duration, cap or timeout: positive (or zero where allowed), else a one-line error."""
    ok = value >= 0 if allow_zero else value > 0
    if not ok or value != value or value == float("inf"):
        kind = "zero or more" if allow_zero else "greater than zero"
        raise VggserveError(f"bad {name} {value!r}: must be {kind}")
    return value
