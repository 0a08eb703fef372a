"""Calibration: each layer's input range over a set of images, by max, percentile or entropy (TensorRT's methods).

    hists, images = observe(tensors, batches)                   # one float32 forward; |input| histogram per layer
    cal = from_histograms(hists, images, sha256, "entropy")     # a Calibration (calibration.py)

`observe` runs VGG16 in float32 numpy (model/reference.py's channels-last forward) over batches of normalised
images and adds every convolution's and FC layer's input to that layer's `AbsHistogram`; the histograms merge
batch after batch, so the memory does not grow with the number of images. Each method then reads a range from them:

- max: the largest |x| seen. Nothing is clipped; rare large values cost resolution everywhere else.
- percentile: the p-th percentile of |x| (default 99.99), zeros counted: the rarest 0.01% are clipped to it.
- entropy: TensorRT's KL-divergence calibrator (Migacz, "8-bit Inference with TensorRT", GTC 2017), as described
  there: a histogram of |x| in 2,048 bins (here 1,639 to 2,048: whole groups of AbsHistogram's) from 0 to the
  maximum; for each candidate count of bins i from 128 to all of them, the reference P is the first i bins with
  everything beyond folded into bin i - 1, and the candidate Q is the same i bins quantised to 128 levels (the bins
  split into 128 runs of equal length, each run's total spread evenly over its non-empty bins, empty ones staying
  empty); the i with the least KL(P || Q) wins and the threshold is (i + 0.5) bin widths. Exact zeros are left out
  (every scale represents them), else the half of a post-ReLU tensor that is zero would pull every threshold
  down. A bin of P with no mass in Q (the fold into bin i - 1 when that bin was empty) gets a small probability
  EPSILON in Q, taken from the rest in proportion.
- entropy with grid="int8": the same search with Q on INT8's own grid. A candidate range of i bins maps onto 127
  uniform steps (scale i / 127 bins), and each bin joins the level its centre rounds to, as the quantiser rounds:
  level 0 takes the bins below half a step (values that become 0), levels 1 to 126 a whole step each, level 127
  the last half step. The threshold is then i bin widths, the edge of the range that maps onto 127. TensorRT's 128
  runs of equal length fit a grid of 128 intervals from 0, which FP8's uneven grid has no better match for; INT8's
  symmetric grid rounds to nearest, so its levels sit on the steps, not between them.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from ..model.reference import dense_layer, staged_logits
from ..weights.spec import infer_width, vgg16_spec
from .calibration import LAYERS, Calibration
from .histogram import AbsHistogram
from .methods import DEFAULT_PERCENTILE, METHODS

ENTROPY_BINS = 2048
ENTROPY_LEVELS = 128  # TensorRT's: the positive half of an 8-bit code
EPSILON = 1e-4
INT8_LEVELS = 127  # INT8's positive steps: [0, amax] is 127 of them
GRIDS = ("fp8", "int8")


def observe(tensors: dict[str, np.ndarray], batches: Iterable[np.ndarray],
            progress: Callable[[int], None] | None = None) -> tuple[dict[str, AbsHistogram], int]:
    """({layer: histogram of |its input|}, images seen) over `batches` of float32 (N, 3, 224, 224) inputs.
    `progress(n)` is called after each batch with its number of images."""
    spec = vgg16_spec(infer_width(tensors))
    dense = dense_layer(tensors)
    hists = {name: AbsHistogram() for name in LAYERS}

    def layer(name, a):
        try:
            hists[name].add(a)
        except ValueError as exc:
            raise ValueError(f"the input of {name}: {exc}") from None
        return dense(name, a)

    images = 0
    for x in batches:
        staged_logits(spec, np.asarray(x, dtype=np.float32), layer)
        images += len(x)
        if progress is not None:
            progress(len(x))
    return hists, images


def from_histograms(hists: dict[str, AbsHistogram], images: int, weights_sha256: str, method: str = "max",
                    percentile: float | None = None, grid: str = "fp8") -> Calibration:
    """The Calibration that `method` (max, percentile or entropy) reads from `observe`'s histograms; `grid`
    ("fp8" or "int8"): the entropy method's levels (module docstring)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "percentile":
        percentile = DEFAULT_PERCENTILE if percentile is None else float(percentile)
    else:
        percentile = None
    amax = {name: amax_of(hists[name], method, percentile, grid) for name in LAYERS}
    return Calibration(weights_sha256, method, images, percentile, amax)


def amax_of(hist: AbsHistogram, method: str, percentile: float | None = None, grid: str = "fp8") -> float:
    if method == "max":
        return float(hist.max)
    if method == "percentile":
        return float(hist.percentile(DEFAULT_PERCENTILE if percentile is None else percentile))
    return entropy_amax(hist, grid=grid)


def entropy_amax(hist: AbsHistogram, bins: int = ENTROPY_BINS, levels: int = ENTROPY_LEVELS,
                 grid: str = "fp8") -> float:
    """The entropy method's threshold for the non-zero values of `hist` (never above their maximum); `grid`:
    "fp8" (TensorRT's 128 runs, threshold at i + 0.5 bins) or "int8" (INT8's 127 rounding steps, at i bins)."""
    if grid not in GRIDS:
        raise ValueError(f"no entropy grid {grid!r}; grids: {', '.join(GRIDS)}")
    counts, width = hist.coarse(bins)
    if counts.sum() == 0:
        return 0.0
    if grid == "int8":
        return float(min(kl_best_bins(counts, INT8_LEVELS, int8_grid=True) * width, hist.max))
    return float(min((kl_best_bins(counts, levels) + 0.5) * width, hist.max))


def kl_best_bins(counts: np.ndarray, levels: int = ENTROPY_LEVELS, int8_grid: bool = False) -> int:
    """The number of bins i (levels <= i <= len(counts)) whose clipped distribution P is the closest, by KL
    divergence, to its quantisation Q to `levels` levels (`int8_grid`: levels + 1 rounding steps 0..levels, module
    docstring); len(counts) when there are no more bins than levels."""
    counts = np.asarray(counts, dtype=np.float64)
    n = len(counts)
    if n <= levels:
        return n
    beyond = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # beyond[i] = counts[i:].sum()
    candidates = range(levels, n + 1)
    divergences = np.array([_kl_clipped(counts[:i], beyond[i], levels, int8_grid) for i in candidates])
    return candidates[int(np.argmin(divergences))]


def _kl_clipped(kept: np.ndarray, outliers: float, levels: int, int8_grid: bool = False) -> float:
    """KL(P || Q) for the first i bins `kept` with `outliers` folded into the last (P) and quantised (Q)."""
    i = len(kept)
    if kept.sum() == 0:
        return np.inf
    p = kept.copy()
    p[-1] += outliers
    if int8_grid:  # the level each bin's centre rounds to, the range's i bins being `levels` steps
        run = np.rint((np.arange(i) + 0.5) * levels / i).astype(np.int64)
    else:  # the level each bin falls in: `levels` runs of i / levels bins
        run = np.arange(i) * levels // i
    filled = kept > 0
    totals = np.bincount(run, weights=kept, minlength=levels + 1)
    nonempty = np.bincount(run, weights=filled, minlength=levels + 1)
    q = np.where(filled, totals[run] / np.maximum(nonempty[run], 1), 0.0)
    p /= p.sum()
    q /= q.sum()
    missing = (p > 0) & (q == 0)
    if missing.any():
        q = q * (1 - EPSILON * missing.sum())
        q[missing] = EPSILON
    mass = p > 0
    return float(np.sum(p[mass] * np.log(p[mass] / q[mass])))
