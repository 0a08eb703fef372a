"""Precisions: how the engine stores tensors and which arithmetic multiplies them.

| name | storage | multiplies on | where |
|---|---|---|---|
| fp32 | float32 | FP32 FMA | every device (the default: results never change by surprise) |
| tf32 | float32 (values rounded to TF32) | tensor cores, TF32 inputs, FP32 accumulate | NVIDIA, compute capability 8.0+ |
| fp16 | float16 | tensor cores (NVIDIA 8.0+), else FP32 FMA on FP16 storage (`vload_half`) | every device |
| fp8 | e4m3 codes, scaled (ops/eightbit.py) | tensor cores, e4m3, FP32 accumulate | NVIDIA, compute capability 8.9+ |
| int8 | u8 activations, s8 weights, scaled | tensor cores, u8 x s8, int32 accumulate | NVIDIA, compute capability 8.0+ |

The 8-bit precisions quantise the weights at load and read the activation scales from the calibration beside the
weights (model/eightbit.py: features.0 and classifier.6 stay FP16; docs/fp8.md).

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

    @property
    def tf32(self) -> bool:
        return self.name == "tf32"

    @property
    def fp8(self) -> bool:
        """Stored as e4m3 codes (quant/e4m3.py), multiplied on e4m3 tensor cores."""
        return self.name == "fp8"

    @property
    def int8(self) -> bool:
        """Activations stored as u8 codes, weights as s8 (quant/int8.py), multiplied on integer tensor cores."""
        return self.name == "int8"

    @property
    def eight_bit(self) -> bool:
        """One byte a value, scaled (ops/eightbit.py): fp8 or int8."""
        return self.storage == np.uint8

    @property
    def floats(self) -> "Precision":
        """The storage of this model's activations where they are not 8-bit codes: an 8-bit model's input to
        features.0 (which runs at FP16 and writes the next layer's codes) and a layer that writes no codes are FP16;
        every other precision is its own."""
        return FP16 if self.eight_bit else self

    def __str__(self) -> str:
        return self.name


FP32 = Precision("fp32", np.float32, False)
TF32 = Precision("tf32", np.float32, True)
FP16 = Precision("fp16", np.float16, False)
FP8 = Precision("fp8", np.uint8, True)
INT8 = Precision("int8", np.uint8, True)
PRECISIONS = {p.name: p for p in (FP32, TF32, FP16, FP8, INT8)}  # what the engine serves (the CLI's choices)
NAMES = tuple(PRECISIONS)
# what a precision needs of the device beyond FP32 and FP16 storage: (Caps-like flag, the need in words)
NEEDS = {"tf32": ("tensor_cores", "NVIDIA tensor cores, compute capability 8.0 or newer"),
         "fp8": ("fp8", "NVIDIA tensor cores with 8-bit floats (e4m3), compute capability 8.9 or newer"),
         "int8": ("tensor_cores", "NVIDIA tensor cores, compute capability 8.0 or newer")}
DEFAULT = "fp32"


def get(name) -> Precision:
    """A Precision from its name (or itself); ValueError naming the choices."""
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}: choose one of {', '.join(NAMES)}") from None


def _runs(name: str, tensor_cores: bool, fp8: bool) -> bool:
    flag = NEEDS.get(name, (None,))[0]
    return flag is None or {"tensor_cores": tensor_cores, "fp8": fp8}[flag]


def supported(tensor_cores: bool, fp8: bool = False) -> tuple[str, ...]:
    """The served precisions a device runs: TF32 and INT8 need tensor cores, FP8 e4m3 tensor cores (runtime/caps.py's
    `tensor_cores`, `fp8`); FP16 runs everywhere (as storage at least)."""
    return tuple(n for n in NAMES if _runs(n, tensor_cores, fp8))


def check(precision: Precision, tensor_cores: bool, device_label: str, fp8: bool = False) -> None:
    """DeviceError, in one line naming what the device supports, if it cannot run `precision`."""
    if not _runs(precision.name, tensor_cores, fp8):
        raise DeviceError(f"{device_label} cannot run precision {precision.name} (it needs "
                          f"{NEEDS[precision.name][1]}); this device supports "
                          f"{', '.join(supported(tensor_cores, fp8))}")


def storage_defines(precision: Precision, in_float: bool = False, out_float: bool = False) -> dict:
    """kernels/storage.clh's switches for a portable kernel: weights and activations in the precision's storage;
    in_float: the input is the float32 model input (first layer); out_float: the output is the float32 logits."""
    half = int(precision.half)
    return {"IN_HALF": half and not in_float, "W_HALF": half, "OUT_HALF": half and not out_float}
