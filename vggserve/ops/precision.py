"""Precisions: how the engine stores tensors and which arithmetic multiplies them.

| name | storage | multiplies on | where |
|---|---|---|---|
| fp32 | float32 | FP32 FMA | every device (the default: results never change by surprise) |
| tf32 | float32 (values rounded to TF32) | tensor cores, TF32 inputs, FP32 accumulate | NVIDIA, compute capability 8.0+ |
| fp16 | float16 | tensor cores (NVIDIA 8.0+), else FP32 FMA on FP16 storage (`vload_half`) | every device |

Byte sizes come from `Precision.storage` (`itemsize`), never a literal 4. Accumulation is FP32 everywhere; the
logits the engine returns are always float32.
"""

from dataclasses import dataclass

import numpy as np

from ..errors import DeviceError


@dataclass(frozen=True)
class Precision:
    name: str
    storage: type  # numpy dtype of stored weights and activations
    tensor_cores: bool  # needs the tensor-core family of kernels (else it can also run on the portable ones)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.storage).itemsize

    @property
    def half(self) -> bool:
        return self.storage == np.float16

    def __str__(self) -> str:
        return self.name


FP32 = Precision("fp32", np.float32, False)
TF32 = Precision("tf32", np.float32, True)
FP16 = Precision("fp16", np.float16, False)
PRECISIONS = {p.name: p for p in (FP32, TF32, FP16)}
NAMES = tuple(PRECISIONS)
DEFAULT = "fp32"


def get(name) -> Precision:
    """A Precision from its name (or itself); ValueError naming the choices."""
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}: choose one of {', '.join(NAMES)}") from None


def supported(tensor_cores: bool) -> tuple[str, ...]:
    """The precisions a device runs: TF32 needs tensor cores; FP16 runs everywhere (as storage at least)."""
    return NAMES if tensor_cores else ("fp32", "fp16")


def check(precision: Precision, tensor_cores: bool, device_label: str) -> None:
    """DeviceError, in one line naming what the device supports, if it cannot run `precision`."""
    allowed = supported(tensor_cores)
    if precision.name not in allowed:
        raise DeviceError(f"{device_label} cannot run precision {precision.name} (it needs NVIDIA tensor cores, "
                          f"compute capability 8.0 or newer); this device supports {', '.join(allowed)}")


def storage_defines(precision: Precision, in_float: bool = False, out_float: bool = False) -> dict:
    """kernels/storage.clh's switches for a portable kernel: weights and activations in the precision's storage;
    in_float: the input is the float32 model input (first layer); out_float: the output is the float32 logits."""
    half = int(precision.half)
    return {"IN_HALF": half and not in_float, "W_HALF": half, "OUT_HALF": half and not out_float}
