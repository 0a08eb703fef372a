"""VGG16 at 8 bits (`--precision fp8` or `int8`): which layers stay FP16, and each layer's scales.

    plans = layer_plans(INT8, calibration, ["features.0", ..., "classifier.6"])
    plans["features.2"]   # LayerPlan(precision=INT8, in_scale=amax/255, out_scale=<features.5's>, out_codes=INT8)

Two layers stay FP16 (BENCHMARKS.md, "FP8 accuracy" and "Recommendation: INT8 with FP16 in classifier.6"):
- classifier.6, the logits: 0.03% of the multiply-adds, and at FP16 it lowers the logits' error most per MAC;
- features.0: its input is the signed normalised image, which INT8's unsigned activation codes cannot hold (and its
  27 inputs per output would not fill an 8-bit mma's k = 32); it reads FP16 and writes the next layer's codes.
Every other layer reads its input as 8-bit codes of x / s_in, s_in = amax / the format's top (calibration's amax of
that layer's input; FP8 448, INT8's u8 activations 255), and writes the next layer's codes (or FP16 before
classifier.6), so no separate conversion pass exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.precision import FP16, Precision
from ..quant.calibration import Calibration

FP16_LAYERS = ("features.0", "classifier.6")
ACTIVATION_TOP = {"fp8": 448.0, "int8": 255.0}  # the largest code an activation's calibrated amax maps onto


@dataclass(frozen=True)
class LayerPlan:
    precision: Precision  # the layer's input storage and its multiply (FP16, or the 8-bit precision)
    in_scale: float | None  # the scale of its 8-bit input (None: FP16)
    out_scale: float | None  # the next layer's input scale where this layer writes its codes
    out_codes: Precision | None  # the codes it writes (the 8-bit precision), None where it writes FP16 or logits

    @property
    def codes(self) -> Precision:
        """The 8-bit format the layer reads or writes (FP16 for one that does neither: classifier.6)."""
        return self.out_codes or self.precision

    @property
    def kwargs(self) -> dict:
        """What an 8-bit entry's make() takes of it (tc_gemm, tc_halo); nothing for a plain FP16 layer, which any
        FP16 entry can then run."""
        kw = {"in_scale": self.in_scale, "out_scale": self.out_scale, "out_codes": self.out_codes}
        return {k: v for k, v in kw.items() if v is not None}


def activation_scale(cal: Calibration, layer: str, precision: Precision) -> float:
    """The per-tensor scale of a layer's 8-bit input: amax / the format's top (1.0 for an input that was all 0)."""
    amax = cal.amax[layer]
    return amax / ACTIVATION_TOP[precision.name] if amax > 0 else 1.0


def layer_plans(precision: Precision, cal: Calibration, names: list[str]) -> dict[str, LayerPlan]:
    """{layer name: its LayerPlan} for the layers `names` in network order at the 8-bit `precision`."""
    eight = [name not in FP16_LAYERS for name in names]
    plans = {}
    for i, name in enumerate(names):
        writes = i + 1 < len(names) and eight[i + 1]
        plans[name] = LayerPlan(precision if eight[i] else FP16,
                                activation_scale(cal, name, precision) if eight[i] else None,
                                activation_scale(cal, names[i + 1], precision) if writes else None,
                                precision if writes else None)
    return plans
