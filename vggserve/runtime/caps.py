"""What a device can do, as the kernels' hosts need it: local memory, work-group size, tensor cores.

`VGGSERVE_EMULATE_MMA=1` makes any device count as having tensor cores, running the tensor-core kernels on an exact
software model of mma.sync / ldmatrix / cp.async (kernels/conv_tc.cl): slow, for testing their logic on PoCL.
It emulates Hopper's wgmma too (kernels/wgmma.clh), which natively needs compute capability 9.0 exactly (sm_90a
code runs on no other GPU). Natively `wgmma_halo` (weights in registers, kernels/conv_wg_halo.cl) is offered by
default on compute capability 9.0; the two older wgmma entries (tc_wgmma, tc_halo_wgmma: weights copied into local
memory) are opt-in, `VGGSERVE_WGMMA=1`: they pass their tests on an H100 but are slower there than the mma.sync kernels
on every layer measured (BENCHMARKS.md), so the tuner would only spend time on them. `VGGSERVE_WGMMA=0` turns every
wgmma entry off everywhere, the software model included (they are then never chosen). The FP8 kernels' mma.sync with e4m3
operands (m16n8k32) needs compute capability 8.9 (Ada) or newer natively; the software model runs them anywhere.
"""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Caps:
    kind: str  # "gpu", "cpu", "other"
    label: str
    compute_units: int
    local_mem: int
    max_work_group: int
    tensor_cores: bool  # mma.sync m16n8k16 f16 and m16n8k8 tf32 (NVIDIA, compute capability 8.0+), or emulated
    emulate_mma: bool  # the tensor-core kernels run on the software model
    wgmma: bool = False  # Hopper's wgmma through PTX programs (compute capability 9.0, sm_90a), or emulated
    wgmma_experimental: bool = False  # and the slower wgmma entries too (VGGSERVE_WGMMA=1, or emulated)
    fp8: bool = False  # mma.sync m16n8k32 e4m3 (compute capability 8.9+), or emulated

    @property
    def mma_define(self) -> dict:
        """The #define the tensor-core kernels take."""
        return {"MMA_EMULATE": int(self.emulate_mma)}


def nvidia_compute_capability(device) -> tuple[int, int] | None:
    if "cl_nv_device_attribute_query" not in (device.extensions or ""):
        return None
    try:
        return device.compute_capability_major_nv, device.compute_capability_minor_nv
    except Exception:  # noqa: BLE001 - an ICD that lists the extension but does not answer
        return None


def emulation_requested() -> bool:
    return os.environ.get("VGGSERVE_EMULATE_MMA", "") in ("1", "true", "yes")


def wgmma_setting() -> str | None:
    """VGGSERVE_WGMMA: "on", "off", or None (unset: wgmma_halo where the device has wgmma, the other entries only
    emulated)."""
    value = os.environ.get("VGGSERVE_WGMMA", "").strip().lower()
    return "on" if value in ("1", "true", "yes") else "off" if value in ("0", "false", "no") else None


def of(device, kind: str, label: str) -> Caps:
    cc = nvidia_compute_capability(device)
    native = cc is not None and cc >= (8, 0)
    emulate = not native and emulation_requested()
    setting = wgmma_setting()
    wgmma = setting != "off" and (emulate or cc == (9, 0))
    return Caps(kind=kind, label=label, compute_units=device.max_compute_units, local_mem=device.local_mem_size,
                max_work_group=device.max_work_group_size, tensor_cores=native or emulate, emulate_mma=emulate,
                wgmma=wgmma, wgmma_experimental=wgmma and (emulate or setting == "on"),
                fp8=emulate or (native and cc >= (8, 9)))
