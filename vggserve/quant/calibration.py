"""FP8 scales: the calibrated activation ranges stored beside the weights, and the per-channel weight scales.

    cal = load_for("vgg16.safetensors", sha256)     # vgg16.safetensors.fp8.json, checked against the weights' hash
    cal = load_for("vgg16.safetensors", sha256, "int8")   # vgg16.safetensors.int8.json: INT8's own (its method)
    cal.scale("features.0")                         # per-tensor activation scale: amax / 448
    s_w = weight_scales(w)                          # per output channel (axis 0): amax / 448, float32
    codes = quantize(w, s_w)                        # uint8 e4m3 codes of w / s_w
    dequantize(codes, s_w)                          # ~= w

The scaling rule, one for activations and weights alike: a value x is stored as the e4m3 code of
float32(x) * float32(1 / scale) (the reciprocal taken in double, then rounded to float32, as an epilogue that
multiplies by it does), rounded to nearest even and saturated to +-448; it stands for decode(code) * scale. With
scale = amax / 448 the calibrated range [-amax, amax] maps onto e4m3's [-448, 448].

The sidecar (`<weights>.fp8.json`, or `<weights>.int8.json` for `--precision int8`, whose recommended method
differs: quant/methods.py's DEFAULT_METHODS) is JSON: {"format", "version", "weights_sha256", "method", "percentile",
"images", "created", "amax": {layer: float}}. `amax[layer]` is the absolute maximum of that layer's INPUT as the
method calibrated it (features.0: the normalised image; a layer after a pooling: the pooled activation;
classifier.0: the flattened 25088 features).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import CalibrationError
from ..tempfiles import replace_atomically
from ..weights.spec import vgg16_spec
from . import e4m3
from .methods import METHODS

FORMAT = "vggserve-fp8-calibration"
VERSION = 1
_SPEC = vgg16_spec(1.0)
#: every convolution and FC layer, in network order (the names do not depend on the width)
LAYERS = tuple(c.name for c in _SPEC.convs) + tuple(f.name for f in _SPEC.fcs)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Calibration:
    """Per-tensor activation ranges of one weights file, and how they were found."""

    weights_sha256: str
    method: str  # "max" | "percentile" | "entropy"
    images: int
    percentile: float | None  # the percentile for method "percentile" (e.g. 99.99), else None
    amax: dict[str, float]  # layer name -> calibrated absolute maximum of its input
    created: str = field(default_factory=_now)  # ISO 8601, UTC
    version: int = VERSION

    def __post_init__(self):
        _check(self)

    def scale(self, layer: str) -> float:
        """The layer's per-tensor input scale, amax / 448 (1.0 for an input that was all zeros)."""
        try:
            amax = self.amax[layer]
        except KeyError:
            raise KeyError(f"no layer {layer!r} in the calibration; layers: {', '.join(LAYERS)}") from None
        return amax / e4m3.MAX if amax > 0 else 1.0

    def to_json(self) -> str:
        data = {"format": FORMAT, **asdict(self)}
        data["amax"] = {name: float(self.amax[name]) for name in LAYERS}
        return json.dumps(data, indent=2) + "\n"

    @staticmethod
    def from_json(text: str | bytes) -> Calibration:
        """The calibration in `text`; CalibrationError (saying what is wrong) for anything else."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CalibrationError(f"not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CalibrationError(f'not a vggserve FP8 calibration (no "format": "{FORMAT}")')
        version = data.get("version")
        if version != VERSION:
            raise CalibrationError(f"version {version!r}; this vggserve reads version {VERSION}")
        fields = {k: v for k, v in data.items() if k != "format"}
        try:
            return Calibration(**fields)
        except TypeError as exc:  # a missing or an unknown field
            raise CalibrationError(str(exc).replace("Calibration.__init__() ", "")) from None


def _check(cal: Calibration) -> None:
    """CalibrationError naming the first field that is wrong."""
    if not isinstance(cal.weights_sha256, str) or not _SHA256.fullmatch(cal.weights_sha256):
        raise CalibrationError(f"weights_sha256 must be 64 lowercase hex digits, got {cal.weights_sha256!r}")
    if cal.method not in METHODS:
        raise CalibrationError(f"method must be one of {', '.join(METHODS)}, got {cal.method!r}")
    if not isinstance(cal.images, int) or isinstance(cal.images, bool) or cal.images < 1:
        raise CalibrationError(f"images must be a whole number >= 1, got {cal.images!r}")
    if cal.method == "percentile":
        if not _number(cal.percentile) or not 0 < cal.percentile <= 100:
            raise CalibrationError(f"percentile must be in (0, 100] for method percentile, got {cal.percentile!r}")
    elif cal.percentile is not None:
        raise CalibrationError(f"percentile must be null for method {cal.method}, got {cal.percentile!r}")
    if not isinstance(cal.amax, dict) or set(cal.amax) != set(LAYERS):
        names = sorted(cal.amax) if isinstance(cal.amax, dict) else cal.amax
        raise CalibrationError(f"amax must name exactly the layers {', '.join(LAYERS)}, got {names!r}")
    for name, value in cal.amax.items():
        if not _number(value) or not math.isfinite(value) or value < 0:
            raise CalibrationError(f"amax of {name} must be a finite number >= 0, got {value!r}")
    if not isinstance(cal.created, str):
        raise CalibrationError(f"created must be an ISO time string, got {cal.created!r}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


PRECISIONS = ("fp8", "int8")  # the precisions that read a calibration, each its own sidecar


def sidecar_path(weights_path: str | os.PathLike, precision: str = "fp8") -> Path:
    """Where the `precision` calibration of a weights file lives: beside it, named `<weights file name>.fp8.json`
    (or `.int8.json`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"no calibration for precision {precision!r}; these read one: {', '.join(PRECISIONS)}")
    return Path(f"{os.fspath(weights_path)}.{precision}.json")


def save(cal: Calibration, path: str | os.PathLike) -> None:
    """Write `cal` to `path` atomically: readers see the old file or the new one, never half of one."""
    replace_atomically(path, cal.to_json().encode("utf-8"))


def how_to_calibrate(weights_path: str | os.PathLike, precision: str = "fp8") -> str:
    extra = "" if precision == "fp8" else f" --precision {precision}"
    return f"`vggserve calibrate --weights {shlex.quote(os.fspath(weights_path))}{extra} --images DIR`"


def load_for(weights_path: str | os.PathLike, weights_sha256: str, precision: str = "fp8") -> Calibration:
    """The `precision` calibration beside `weights_path`, checked to belong to the weights whose hash is
    `weights_sha256`.

    Raises CalibrationError in one line: missing (saying how to calibrate), unreadable, damaged, or made for other
    weights (both hashes named)."""
    side = sidecar_path(weights_path, precision)
    fix = f"make one with {how_to_calibrate(weights_path, precision)}"
    what = f"{precision.upper()} calibration"
    try:
        text = side.read_bytes()
    except FileNotFoundError:
        raise CalibrationError(f"{weights_path} has no {what} ({side} does not exist); {fix}") from None
    except OSError as exc:
        raise CalibrationError(f"cannot read the {what} {side}: {exc.strerror or exc}") from None
    try:
        cal = Calibration.from_json(text)
    except CalibrationError as exc:
        raise CalibrationError(f"the {what} {side} is damaged: {exc}; {fix}") from None
    if cal.weights_sha256 != weights_sha256:
        raise CalibrationError(f"the {what} {side} was made for other weights (sha256 {cal.weights_sha256}, "
                               f"{weights_path} has {weights_sha256}); {fix}")
    return cal


def weight_scales(weight: np.ndarray, top: float = e4m3.MAX) -> np.ndarray:
    """Per output channel (axis 0): the channel's absolute maximum / `top` (448, e4m3's largest; INT8: 127),
    float32; 1.0 for a channel of zeros."""
    w = np.asarray(weight, dtype=np.float32)
    amax = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) if w.size else np.zeros(w.shape[0], np.float32)
    return np.where(amax > 0, amax / np.float32(top), np.float32(1.0)).astype(np.float32)


def reciprocal(scale) -> np.ndarray:
    """float32(1 / scale), the reciprocal taken in double: what x is multiplied by before rounding to e4m3."""
    return (1.0 / np.asarray(scale, dtype=np.float64)).astype(np.float32)


def _along_axis0(v: np.ndarray, ndim: int) -> np.ndarray:
    """A scalar as it is; a per-channel vector shaped to broadcast along axis 0 of an ndim array."""
    return v if v.ndim == 0 else v.reshape((-1,) + (1,) * (ndim - 1))


def scaled(x, scale) -> np.ndarray:
    """float32(x) * float32(1 / scale): what gets rounded to e4m3 (`scale` a scalar, or a vector along axis 0)."""
    x = np.asarray(x, dtype=np.float32)
    return x * _along_axis0(reciprocal(scale), x.ndim)


def quantize(x, scale) -> np.ndarray:
    """uint8 e4m3 codes of x / scale (nearest even, saturated to +-448): `scale` a scalar (per tensor) or a vector
    along axis 0 (per output channel)."""
    return e4m3.encode(scaled(x, scale))


def dequantize(codes, scale) -> np.ndarray:
    """float32 decode(codes) * scale, `scale` a scalar or a vector along axis 0."""
    values = e4m3.decode(codes)
    return values * _along_axis0(np.asarray(scale, dtype=np.float32), values.ndim)
