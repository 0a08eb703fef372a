"""Which device each rank uses: one device per rank, chosen by the rank's index on its node.

`--device` (SPEC) values, for a rank with local rank L on a node running S ranks:

    gpu              -> "gpu:L"    (GPU number L of the node)
    cpu              -> "cpu"      (every rank on the CPU device)
    auto             -> the engine's "auto" when S == 1; with several ranks per node "gpu:L" if the node
                        has an OpenCL GPU, else "cpu"
    gpu:0,gpu:2,...  -> entry L of the list (a list needs at least S entries)
    anything else    -> passed to the engine unchanged, for every rank ("gpu:1", "0:1", ...)
"""

from __future__ import annotations

from ..errors import DeviceError
from ..wording import count


def rank_device(spec: str, local_rank: int, local_size: int) -> str:
    """The engine device string for local rank `local_rank` of `local_size` under `--device spec`."""
    entries = [entry.strip() for entry in str(spec).split(",")]
    if not all(entries):
        raise DeviceError(f"--device {spec!r}: empty entry; give e.g. 'gpu', 'cpu' or 'gpu:0,gpu:1'")
    if len(entries) > 1:
        if local_rank >= len(entries):
            raise DeviceError(
                f"--device {spec!r} lists {count(len(entries), 'device')}, but this node runs at least "
                f"{count(local_rank + 1, 'rank')}; give one device per rank on the node"
            )
        entry = entries[local_rank]
    else:
        entry = entries[0]
    if entry == "gpu":
        return f"gpu:{local_rank}"
    if entry == "auto":
        if local_size == 1:
            return "auto"
        return f"gpu:{local_rank}" if count_gpus() else "cpu"
    return entry


def count_gpus() -> int:
    """Usable OpenCL GPUs on this node, numbered as the engine's "gpu:N" numbers them."""
    from ..runtime.devices import usable_gpus

    try:
        return len(usable_gpus())
    except Exception:  # no ICD loader or a broken platform: no GPU to use
        return 0
