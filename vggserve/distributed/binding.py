"""Each rank loads the model on its own device, and all ranks agree on whether that worked.

    bound = load_rank_model("vgg16.safetensors", device="gpu", max_batch_size=16)   # collective
    bound.model       # this rank's VGG16, on device bound.device (e.g. "gpu:1" for local rank 1)
    bound.ranks       # every rank's {"rank", "device", "device_name"}, in rank order
    bound.share       # this rank's share of its host (cores.HostShare: its cores, the host's, ranks on the host)

If any rank fails (no such GPU, unreadable weights, kernel build error) every rank raises RankSetupError with
the failing ranks' messages, instead of the healthy ranks waiting forever in their first collective.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import VggserveError, describe
from .cores import HostShare, allowed_cpus, rank_cores
from .devices import rank_device
from .mpi import barrier, node_layout, world


class RankSetupError(VggserveError):
    """Raised on every rank when some rank could not bind its device or load its model.

    `exit_code` is the first failing rank's. Report it once (on rank 0); the other ranks should exit quietly
    with the same code.
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class BoundModel:
    model: object
    device: str
    ranks: list[dict]
    local_size: int = 1  # ranks on this rank's machine
    share: HostShare | None = None  # this rank's share of its host (None: every core it may run on, alone)

    @property
    def cores(self) -> float:
        """This rank's share of the cores it may run on (cores.rank_cores)."""
        return self.host_share.cores

    @property
    def host_share(self) -> HostShare:
        if self.share is None:
            cpus = len(allowed_cpus())
            return HostShare(float(cpus), cpus, self.local_size)
        return self.share


def load_model(weights, device: str, max_batch_size: int, precision: str = "fp32"):
    """This rank's engine model (the one place the batch job and sharding construct a model)."""
    from ..model.vgg16 import VGG16

    return VGG16.load(weights, device=device, max_batch_size=max_batch_size, precision=precision)


def load_rank_model(weights, device: str = "gpu", max_batch_size: int = 16, comm=None,
                    precision: str = "fp32") -> BoundModel:
    """Collective: bind this rank's device from the `device` spec (see devices.py) and load `weights` on it."""
    comm = comm if comm is not None else world()
    local_rank, local_size = node_layout(comm)
    share = HostShare(rank_cores(comm), len(allowed_cpus()), local_size)
    model, bound, problem = None, device, None
    try:
        bound = rank_device(device, local_rank, local_size)
        model = load_model(weights, bound, max_batch_size, precision)
        name = str(getattr(model, "device_name", bound))
    except Exception as exc:  # reported on every rank below, then raised
        name = ""
        problem = (describe(exc), int(getattr(exc, "exit_code", 1)))
    barrier(comm)  # ranks wait for the slowest load while sleeping, not spinning
    reports = comm.allgather({"rank": comm.Get_rank(), "device": bound, "device_name": name, "problem": problem})
    failed = [report for report in reports if report["problem"]]
    if failed:
        if model is not None and hasattr(model, "close"):
            model.close()
        raise RankSetupError(_failure_message(failed, len(reports)), failed[0]["problem"][1])
    for report in reports:
        del report["problem"]
    return BoundModel(model, bound, reports, local_size, share)


def _failure_message(failed: list[dict], size: int) -> str:
    messages = {report["problem"][0] for report in failed}
    if size == 1:
        return messages.pop()
    if len(failed) == size and len(messages) == 1:
        return f"every rank: {messages.pop()}"
    return "; ".join(f"rank {r['rank']} ({r['device']}): {r['problem'][0]}" for r in failed)
