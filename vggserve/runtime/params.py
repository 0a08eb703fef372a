"""Per-device kernel parameters: the `#define`s prepended to each kernel file.

One source serves every device: the table maps a device class to overrides of the defaults documented in the
kernel banners. `vggserve tune` (when run) stores per-device winners in a JSON file that takes precedence.
"""

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

from platformdirs import user_cache_dir

from ..errors import VggserveError
from ..tempfiles import replace_atomically

log = logging.getLogger("vggserve.runtime")

# the design card's reference variant: 64x64 work-group tiles, 4x4 per work-item, TK-deep double buffer
GPU_DEFAULT = {"conv": {"TM": 64, "TN": 64, "TK": 16, "WM": 4, "WN": 4, "LPAD": 1},
               "gemv": {"GEMV_LM": 64, "GEMV_LK": 4, "GEMV_WM": 1, "GEMV_NB": 4, "ksplit_target": 1024}}
# CPUs (PoCL): one work-group runs on one core; fewer, fatter work-items vectorise better
# (`vggserve tune` through PoCL 3.1 on a 2-core AVX-512 EPYC picked this for 10 of 12 VGG16 shapes at batch 1:
#  16 work-items wide in N vectorise, 32x16 register blocks per work-item; 2-5x faster than 64x64/4x4)
CPU_DEFAULT = {"conv": {"TM": 128, "TN": 256, "TK": 16, "WM": 32, "WN": 16, "LPAD": 0},
               # 32 consecutive outputs per work-item: fc1 at batch 1 in 60-90 ms (5-7 GB/s) instead of 530 ms
               "gemv": {"GEMV_LM": 8, "GEMV_LK": 1, "GEMV_WM": 32, "GEMV_NB": 4, "ksplit_target": 16}}

TABLE = {"gpu": GPU_DEFAULT, "cpu": CPU_DEFAULT}


def table_key(precision: str = "fp32") -> str:
    """Where a precision's tuned winners live in a device's entry: "conv_by_batch" for FP32 (as every table
    written before precisions existed), "conv_by_batch_fp16" / "conv_by_batch_tf32" for the others."""
    return "conv_by_batch" if str(precision) == "fp32" else f"conv_by_batch_{precision}"


def conv_params_for(params: dict, cin: int, cout: int, size: int, batch: int = 1, precision: str = "fp32",
                    default: dict | None = None, pool: bool = False) -> dict:
    """The parameters for one layer: tuned winners for its shape if any, else `default` (else the device's
    portable default).

    Tuned tables are stored per precision and batch size ("conv_by_batch": {"64": {"CINxCOUTxSIZE": params}}); the
    table tuned at the batch nearest (in ratio) to `batch` is used, because the best tiles for 1 image and for 64
    differ. Shape keys are "CINxCOUTxSIZE" (size = image side; 1 for fully connected layers). A winner carries
    "ALGO" when it is not the portable GEMM (ops/registry.py).

    pool: the layer is followed by a 2x2 max-pool. A table may hold a separate winner for that case under
    "CINxCOUTxSIZE+pool" (`vggserve tune` writes one where an algorithm can fuse the pooling into its store; it says
    "FUSE_POOL": 1 or 0); without one, the shape's own entry applies, fused where its algorithm can
    (`registry.pool_fused`).
    """
    fallback = dict(default if default is not None else params["conv"])
    table = nearest_table(params, batch, precision)
    if pool and shape_key(cin, cout, size, pool=True) in table:
        return dict(table[shape_key(cin, cout, size, pool=True)])
    return dict(table.get(shape_key(cin, cout, size), fallback))


def nearest_table(params: dict, batch: int, precision: str = "fp32") -> dict:
    """{shape key: winner} of the precision's table tuned at the batch nearest (in ratio) to `batch`; {} if none."""
    tables = params.get(table_key(precision), {})
    if not tables:
        return {}
    return tables[min(tables, key=lambda b: abs(math.log(int(b)) - math.log(max(batch, 1))))]


POOL_SUFFIX = "+pool"  # a tuned-table key's suffix: the winner for the shape when a 2x2 max-pool follows it


def shape_key(cin: int, cout: int, size: int, pool: bool = False) -> str:
    return f"{cin}x{cout}x{size}{POOL_SUFFIX if pool else ''}"


def tuned_file() -> Path:
    return Path(os.environ.get("VGGSERVE_CACHE_DIR") or user_cache_dir("vggserve")) / "tuned.json"


def shipped_file() -> Path:
    """Winners of `vggserve tune` on the devices we measured, shipped with the package."""
    return Path(__file__).resolve().parent.parent / "data" / "tuned_params.json"


def read_table(path: Path) -> dict:
    """A tuned-parameter file: {device name: entry}, {} when there is none. ValueError when it is not JSON or not a
    table `params_for` can merge (an entry that is not an object, a batch that is not a positive integer, ...)."""
    if not path.is_file():
        return {}
    table = json.loads(path.read_text())
    if not isinstance(table, dict):
        raise ValueError("not a JSON object of device entries")
    for device_name, entry in table.items():
        try:
            _merge({}, entry)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"entry {device_name!r}: {exc}") from None
    return table


def _stored(path: Path, device_name: str) -> dict:
    try:
        return read_table(path).get(device_name, {})
    except (OSError, ValueError) as exc:
        log.warning("vggserve: ignoring the tuned parameters in %s (%s)", path, exc)
        return {}


def _merge(params: dict, stored: dict) -> None:
    """Add one file's entry for a device to `params` (see `params_for`)."""
    for role, values in stored.items():
        if not isinstance(values, dict):  # notes such as "tuned_on"
            continue
        if role.startswith("conv_by_batch"):
            for batch, table in values.items():
                if not (batch.isdigit() and int(batch) > 0 and isinstance(table, dict)
                        and all(isinstance(v, dict) for v in table.values())):
                    raise ValueError(f"{role}: batch {batch!r} is not a positive integer with a table of shapes")
                params.setdefault(role, {}).setdefault(batch, {}).update(table)
        elif role == "sparse":  # curves per batch and shape: the user's measurements add to the shipped ones
            merged = params.setdefault(role, {})
            for key, value in values.items():
                if key == "curves":
                    for batch, shapes in value.items():
                        for shape, algos in shapes.items():  # per kernel: 2:4 and FP32 curves coexist
                            merged.setdefault(key, {}).setdefault(batch, {}).setdefault(shape, {}).update(algos)
                elif isinstance(value, dict):
                    merged.setdefault(key, {}).update(value)
                else:
                    merged[key] = value
        else:
            params.setdefault(role, {}).update(values)


def params_for(kind: str, device_name: str) -> dict:
    """Kernel parameters for a device: the table row for its kind, overridden by the shipped tuned table for this
    device, overridden in turn by the user's own `vggserve tune` results. A file that is not such a table is
    ignored, with a warning on the "vggserve.runtime" log."""
    base = TABLE.get(kind, GPU_DEFAULT)
    params = {role: dict(values) for role, values in base.items()}
    for path in (shipped_file(), tuned_file()):
        _merge(params, _stored(path, device_name))
    return params


def update_tuned(device_name: str, change) -> Path:
    """`change(entry)` on this device's entry of the user's tuned-parameter file, dated, and the file written whole
    (readers never see half of it); returns its path. A file there that is not a table (`read_table`) is kept
    aside as "<name>.unreadable" and a new one begun. VggserveError, in one line, when the file cannot be written.
    Two tuners at once (one per GPU of a host) take turns through a lock file beside it, so neither loses the
    other's entry (an flock on the cache folder: no lock file is left)."""
    path = tuned_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.parent):
            _update_table(path, device_name, change)
    except OSError as exc:
        raise VggserveError(f"cannot store the tuned parameters in {path}: {exc.strerror or exc} (set "
                            "VGGSERVE_CACHE_DIR to a folder you can write)") from None
    return path


@contextmanager
def _locked(folder: Path):
    """An exclusive advisory lock (flock) on `folder`, held for the block; other processes and threads that take
    it wait."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # lets go of the lock


def _update_table(path: Path, device_name: str, change) -> None:
    """update_tuned's read, change and write, under its lock."""
    try:
        table = read_table(path)
    except ValueError as exc:
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        log.warning("vggserve: %s is not a tuned-parameter table (%s); kept as %s", path, exc, aside)
        table = {}
    entry = table.setdefault(device_name, {})
    change(entry)
    entry["tuned_on"] = time.strftime("%Y-%m-%d")
    replace_atomically(path, json.dumps(table, indent=1, sort_keys=True).encode())
