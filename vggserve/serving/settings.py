"""Service settings, validated when built: a bad value fails at start-up with a message that says how to fix it."""

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ..decoding.groups import GROUP
from ..engine.lanes import MAX_LANES
from ..errors import VggserveError
from ..weights.spec import NUM_CLASSES
from ..wording import count

API_KEY_ENV = "VGGSERVE_API_KEY"
DECODE_MODES = ("exact", "fast", "gpu", "auto")
ENGINE_PROCESSES = ("auto", "1", "per-device")  # --engine-processes
MAX_TOP_K = NUM_CLASSES  # `top_k` is 1..MAX_TOP_K, as the CLI's --top-k and v2's `classification`
MAX_TIMEOUT_MS = 600_000  # the largest deadline a request header may ask for (10 minutes)


class SettingsError(VggserveError):
    """A service setting is out of range or malformed; the message names the flag and a valid example."""

    exit_code = 2


def default_preprocess_threads(http_workers: int = 1, cpus: int | None = None) -> int:
    """Decode/preprocess threads of each serving process: one per core, at least 2, at most 16; with HTTP front-end
    processes (`http_workers` > 1, each with threads of its own), twice each one's share of the cores, at least 2.

    Every front end with a thread per core oversubscribed the host (8 front ends x 16 threads on 16 cores): the
    front ends then spent 7 to 17% more CPU per image switching between threads (BENCHMARKS.md)."""
    cpus = cpus if cpus is not None else os.cpu_count() or 2
    share = 2 * cpus // http_workers if http_workers > 1 else cpus
    return max(2, min(16, share))


def default_preprocess_procs() -> int:
    """Decode/preprocess worker processes by default: none (threads only), on every machine, whatever its cores.

    Measured on a 16-core H100 machine (BENCHMARKS.md): threads 790 images/s at batch 32; 14 worker processes 384,
    8 processes 403, because images then reach the batcher one by one (mean batch 4.8 instead of 32). Processes
    stay available with --preprocess-procs N for hosts where decoding, not batching, is the limit.
    """
    return 0


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_cpu_limit(root: str = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in cores (`docker run --cpus 4`, a Kubernetes CPU limit): cgroup v2's
    cpu.max ("QUOTA PERIOD"), else v1's cpu.cfs_quota_us / cpu.cfs_period_us; None when there is none (quota "max"
    or -1) or it cannot be read."""
    root_path = Path(root)
    for read in (lambda: (root_path / "cpu.max").read_text().split(),
                 lambda: [(root_path / "cpu" / name).read_text().strip()
                          for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us")]):
        try:
            quota, period = read()
            if quota in ("max", "-1"):
                return None
            return int(quota) / int(period)
        except (OSError, ValueError, ZeroDivisionError):
            continue
    return None


def host_cores() -> int:
    """The cores this service may use: its CPU affinity (a cpuset, `taskset`), bounded by its cgroup's CPU quota
    (rounded up), at least 1."""
    from ..distributed.cores import allowed_cpus

    cores = len(allowed_cpus())
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, -int(-limit // 1))
    return max(1, cores)


FRONTS_FIRST, FRONTS_MORE = 8, 4  # auto_http_workers' front ends for the first device and each other, device decode


def auto_http_workers(cpus: int | None = None, devices: int = 1, decode: str = "exact") -> int:
    """`--http-workers auto`: half the cores, less one for each device past the first (cores // 2 - (devices - 1)),
    at least 1 (1: one process, no front ends). The other half goes to the engine process (its link, device-worker
    and copy threads) and the front ends' decoding threads: on 32 cores with H200s, FP16, 16 front ends served
    more than 8 (5,350 against 4,516 images/s with one GPU, 5,036 against 4,763 with two, one call), and 30 front
    ends fewer than 8 (3,981 against 4,550, two calls; BENCHMARKS.md, ninth session). No fixed cap below 64 (the
    setting's bound): the front ends admit from one --max-queue together (`processes.admission`), so their number
    does not depend on the queue's. `cpus` defaults to host_cores().

    Front ends that decode nothing (`decode` gpu or auto: the JPEGs go to the devices compressed) need fewer: at most
    FRONTS_FIRST for the first device and FRONTS_MORE for each other. On 64 cores and four H100s at FP16 (BENCHMARKS.md,
    eighteenth session, one machine): 8, 12, 16, 20, 24 and 29 front ends served 15,979, 19,708, 18,662, 19,825,
    18,714 and 15,448 images/s on four GPUs, and 6,095, 6,240, 5,950, 5,955, 5,872 and 5,620 (32) on one."""
    cpus = host_cores() if cpus is None else cpus
    n = cpus // 2 - (devices - 1)
    if decode in ("gpu", "auto"):
        n = min(n, FRONTS_FIRST + FRONTS_MORE * (devices - 1))
    return max(1, min(_BOUNDS["http_workers"][1], n))


def default_http_workers(devices: tuple[str, ...], cpus: int | None = None, decode: str = "exact") -> int:
    """Front-end processes when --http-workers is not given: `auto` when every device is a GPU, else 1.

    On a GPU one Python process cannot feed the device (H100, batch 32: 0.42 of the engine's images/s with one
    process, 0.97 with 4 front ends, BENCHMARKS.md); on a CPU device the device is the limit and one process
    keeps the CPU for the model."""
    from ..runtime.devices import resolve

    try:
        kinds = {resolve(d).kind for d in devices}
    except Exception:  # noqa: BLE001 - a bad spec is reported by the device worker, with its own message
        return 1
    return auto_http_workers(cpus, len(devices), decode) if kinds == {"gpu"} else 1


def parse_http_workers(text: str | int | None, devices: tuple[str, ...] = ("auto",), decode: str = "exact") -> int:
    """`--http-workers N` or `auto` (for `devices` and `decode`) as a number of front-end processes (range checked
    by Settings)."""
    if text is None:
        return 1
    if isinstance(text, str) and text.strip().lower() == "auto":
        return auto_http_workers(None, len(devices), decode)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise SettingsError(f"--http-workers must be an integer from 1 to 64 or `auto`, got {text!r}; "
                            "pass e.g. --http-workers 4") from None


def parse_decode_group(text: str | int | None) -> int:
    """`--decode-group N` as a number (None: the default, `groups.GROUP`); its range is checked by Settings."""
    if text is None:
        return GROUP
    try:
        return int(text)
    except (TypeError, ValueError):
        low, high, flag, example = _BOUNDS["decode_group"]
        raise SettingsError(f"{flag} must be an integer from {low} to {high}, got {text!r}; pass e.g. {flag} "
                            f"{example}") from None


def device_names(devices: tuple[str, ...]) -> tuple[str, ...]:
    """A name per device entry, distinct: the spec itself, or "spec#n" for the n-th of a spec given more than once
    (`--device gpu,gpu`: gpu#1, gpu#2), so that each worker has its own series in the metrics."""
    seen: dict[str, int] = {}
    names = []
    for spec in devices:
        seen[spec] = seen.get(spec, 0) + 1
        names.append(f"{spec}#{seen[spec]}" if devices.count(spec) > 1 else spec)
    return tuple(names)


def parse_devices(text: str | None) -> tuple[str, ...]:
    """A comma list of device specs ("gpu:0,gpu:1") as a tuple, one device worker each; "all" = every GPU, and
    refused (DeviceError) where there is none: serving on the CPU instead is asked for by name, --device cpu."""
    parts = tuple(p.strip() for p in (text or "auto").split(","))
    if any(not p for p in parts):
        raise SettingsError(f"--device {text!r} has an empty entry; give specs separated by commas, e.g. gpu:0,gpu:1")
    if "all" in (p.lower() for p in parts):
        from ..errors import DeviceError
        from ..runtime.devices import usable_gpus

        gpus = usable_gpus()
        if not gpus:
            raise DeviceError("--device all means one worker per GPU, and no OpenCL GPU is usable here; pass "
                              "--device cpu to serve on the CPU (or check the GPU driver with `vggserve devices`)")
        return tuple(s for p in parts for s in ([f"gpu:{i}" for i in range(len(gpus))] if p.lower() == "all"
                                                 else [p]))
    return parts


# name: (lowest, highest, flag, example)
_BOUNDS = {
    "port": (0, 65535, "--port", "8000"),
    "max_batch_size": (1, 4096, "--max-batch-size", "16"),
    "max_wait_ms": (0, 10_000, "--max-wait-ms", "2"),
    "max_queue": (1, 1_000_000, "--max-queue", "256"),
    "request_timeout_ms": (1, MAX_TIMEOUT_MS, "--request-timeout-ms", "30000"),
    "max_body_bytes": (1024, 1 << 31, "--max-body-bytes", "20000000"),
    "max_pixels": (1, 1 << 31, "--max-pixels", "40000000"),
    "max_files": (1, 1024, "--max-files", "16"),
    "preprocess_threads": (1, 256, "--preprocess-threads", "4"),
    "preprocess_procs": (0, 256, "--preprocess-procs", "8"),
    "drain_timeout_s": (0, 3600, "--drain-timeout", "30"),
    "read_timeout_s": (0.01, 3600, "--read-timeout", "60"),
    "http_workers": (1, 64, "--http-workers", "4"),
    "decode_group": (1, 16, "--decode-group", "4"),
    "lanes": (1, MAX_LANES, "--lanes", "2"),
}

_REAL = ("max_wait_ms", "drain_timeout_s", "read_timeout_s")  # the others are integers


@dataclass(frozen=True)
class Settings:
    """Everything `vggserve serve` can be told. Times are in the unit their name says."""

    weights: str | None = None  # path of the weights file (None: the model factory knows where they are)
    host: str = "127.0.0.1"
    port: int = 8000
    devices: tuple[str, ...] = ("auto",)  # one device worker per entry
    max_batch_size: int = 16  # images per device batch
    # how long the oldest waiting image may wait for a batch to fill while a device is idle (0: none, as Triton's
    # max_queue_delay; under load a busy device's next batch fills while it computes). 2 ms measured best at 2 to 32
    # clients on an H100 (BENCHMARKS.md, sixteenth session): 5 held light loads, 0 made batches too small at 32
    max_wait_ms: float = 2.0
    max_queue: int = 256  # images admitted and not yet on a device (decoding or waiting); more get 429
    request_timeout_ms: int = 30_000  # default deadline; header X-Request-Timeout-Ms overrides it per request
    max_body_bytes: int = 20 * 1024 * 1024  # larger request bodies get 413 before they are read
    max_pixels: int = 40_000_000  # larger images (width x height from the header) get 413
    max_files: int = 16  # files per POST /classify/batch
    preprocess_threads: int | None = None  # None: default_preprocess_threads(http_workers)
    # worker processes decoding images (0: decode in the threads above); see vggserve.serving.scheduling.procpool
    preprocess_procs: int = field(default_factory=default_preprocess_procs)
    drain_timeout_s: float = 30.0  # after SIGTERM, how long in-flight requests may take before exit
    # a request's headers must all arrive within this time, and its body may pause no longer (408 and the connection
    # closed), as nginx's client_header_timeout and client_body_timeout
    read_timeout_s: float = 60.0
    api_key: str | None = None  # when set, every endpoint but /health/* needs `Authorization: Bearer <key>`
    warmup: bool = True  # each device worker runs one batch before the service reports ready
    mpi: bool = False  # set by `mpirun -n N vggserve serve`: batches are sharded over all ranks
    # HTTP front-end processes; above 1 this process only batches and computes (vggserve.serving.processes.frontends)
    http_workers: int = 1
    # where uploads are resized and centre-cropped with front ends: "device" (the engine's kernels, bit for bit as
    # the CPU, when the model can) or "cpu" (in the front ends)
    resize_on: str = "device"
    # how uploads are decoded: "exact" (every pixel) or "fast" (large JPEGs scaled down in the DCT; vggserve.decoding),
    # "gpu" (JPEGs the device decoder takes go to the engine compressed and are decoded on its device, bit for bit as
    # exact: serving.scheduling.devicedecode) or "auto" (gpu where a worker's device is a GPU, else exact; `vggserve
    # serve`'s default, not this class's: an app made in code keeps exact unless it asks)
    decode: str = "exact"
    # with --decode gpu|auto: batches whose JPEGs the engine decodes on its device at once, when that many full
    # batches are waiting (one launch sequence; 1: one batch per decode; serving.scheduling.devicedecode)
    decode_group: int = GROUP
    # forward passes each device worker's engine may run on its device at once, each on a queue of its own (engine.py's
    # lanes): 2 help small batches on a GPU, where one batch leaves most compute units idle
    lanes: int = 1
    # the engine's precision: fp32, tf32, fp16, fp8 or int8 (vggserve/ops/precision.py)
    precision: str = "fp32"
    # browser origins allowed to call the API (CORS); none by default: browsers on other origins are refused
    cors_origins: tuple[str, ...] = ()
    # with HTTP front ends and several devices: "per-device" (one engine process per device, each its own queue and
    # GIL; the front ends spread images over them: processes.engines), "1" (one engine process, one queue shared by
    # every device) or "auto" (per-device when there are several devices and several front ends)
    engine_processes: str = "auto"
    # the name of each device in the metrics and the log, entry for entry (empty: `device_names(devices)`; an
    # engine process's settings carry the name its device has among all of them)
    device_labels: tuple[str, ...] = ()

    def __post_init__(self):
        if self.preprocess_threads is None and isinstance(self.http_workers, int):
            object.__setattr__(self, "preprocess_threads", default_preprocess_threads(self.http_workers))
        for f in fields(self):
            if f.name in _BOUNDS:
                self._check_range(f.name, getattr(self, f.name))
        if not isinstance(self.devices, tuple) or not self.devices or not all(isinstance(d, str) and d.strip()
                                                                                for d in self.devices):
            raise SettingsError(f"devices must be a non-empty tuple of device specs, got {self.devices!r}; "
                                "pass e.g. --device gpu:0,gpu:1")
        if self.device_labels and len(self.device_labels) != len(self.devices):
            raise SettingsError(f"device_labels names {count(len(self.device_labels), 'device')} for "
                                f"{len(self.devices)}: give one per device, or none")
        if not isinstance(self.cors_origins, tuple) or not all(
                isinstance(o, str) and o and (o == "*" or o.startswith(("http://", "https://"))) and o.strip() == o
                for o in self.cors_origins):
            raise SettingsError(f"--cors-origin takes an origin such as https://app.example.com (or *), got "
                                f"{self.cors_origins!r}")
        if self.resize_on not in ("device", "cpu"):
            raise SettingsError(f"--resize-on must be device or cpu, got {self.resize_on!r}")
        if self.decode not in DECODE_MODES:
            raise SettingsError(f"--decode must be one of {', '.join(DECODE_MODES)}, got {self.decode!r}")
        if self.engine_processes not in ENGINE_PROCESSES:
            raise SettingsError(f"--engine-processes must be one of {', '.join(ENGINE_PROCESSES)}, got "
                                f"{self.engine_processes!r}; pass e.g. --engine-processes per-device")
        if self.engine_processes == "per-device" and self.http_workers == 1 and len(self.devices) > 1:
            raise SettingsError("--engine-processes per-device needs HTTP front-end processes to spread the images "
                                "over the engines; pass --http-workers 2 or more, or --engine-processes 1")
        from ..ops.precision import NAMES

        if self.precision not in NAMES:
            raise SettingsError(f"--precision must be one of {', '.join(NAMES)}, got {self.precision!r}")
        if not isinstance(self.host, str) or not self.host.strip():
            raise SettingsError(f"--host must be an address to bind, got {self.host!r}; pass e.g. --host 127.0.0.1")
        if self.api_key is not None and (not self.api_key.strip() or any(c.isspace() for c in self.api_key)):
            raise SettingsError(f"the API key must be non-empty and without spaces; set --api-key or {API_KEY_ENV} "
                                "to e.g. the output of `openssl rand -hex 24`")
        if self.max_files > self.max_queue:
            raise SettingsError(f"--max-files ({self.max_files}) is larger than --max-queue ({self.max_queue}), so a "
                                "full batch request could never be admitted; lower --max-files or raise --max-queue")
        if self.http_workers > 1:
            self._check_front_ends()
        if self.mpi and self.lanes > 1:
            raise SettingsError(f"--lanes {self.lanes} does not work under mpirun (rank 0 shards each batch over the "
                                "ranks, one batch at a time); drop --lanes or run without mpirun")

    def _check_front_ends(self) -> None:
        n = self.http_workers
        if self.preprocess_procs:
            raise SettingsError(f"--http-workers {n} and --preprocess-procs {self.preprocess_procs} do not combine: "
                                "each front-end process decodes its own images; pass one or the other")
        if self.mpi:
            raise SettingsError(f"--http-workers {n} does not work under mpirun (rank 0 serves HTTP in one "
                                "process); drop --http-workers or run without mpirun")

    def _check_range(self, name: str, value) -> None:
        low, high, flag, example = _BOUNDS[name]
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in _REAL:
            ok = is_number and value == value  # not NaN
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or not low <= value <= high:
            kind = "a number" if name in _REAL else "an integer"
            raise SettingsError(f"{flag} must be {kind} from {low} to {high}, got {value!r}; "
                                f"pass e.g. {flag} {example}")

    @property
    def engine_count(self) -> int:
        """Engine processes behind the front ends: one per device (`engine_processes` per-device, or auto with
        several devices and several front ends), else 1."""
        if self.http_workers < 2 or len(self.devices) < 2 or self.engine_processes == "1":
            return 1
        return len(self.devices)

    def for_engine(self, index: int) -> "Settings":
        """The settings of engine `index` of `engine_count`: its one device (all of them with one engine)."""
        if self.engine_count == 1:
            return self
        return replace(self, devices=(self.devices[index],), device_labels=(self.labels[index],))

    @property
    def labels(self) -> tuple[str, ...]:
        """Each device's name in the metrics (`vggserve_device_up{device}`) and the log: `device_labels`, or
        `device_names(devices)`."""
        return self.device_labels or device_names(self.devices)

    @property
    def cpu_decode(self) -> str:
        """The CPU decoder's mode (decoding.decode_pixels) for the files it decodes: exact under gpu and auto."""
        return "exact" if self.decode in ("gpu", "auto") else self.decode

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0

    def public(self) -> dict:
        """The settings as a dict safe to show (the API key only as set/unset)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["devices"] = list(self.devices)
        out["device_labels"] = list(self.labels)
        out["cors_origins"] = list(self.cors_origins)
        out["api_key"] = "set" if self.api_key else None
        return out
