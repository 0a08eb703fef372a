"""`AbsHistogram`: the distribution of |x| over many batches in a fixed number of bins, for calibration.

The range [0, R) is split into BINS equal bins, R the power of two above the first non-zero batch's maximum.
When a later batch holds a value >= R, R doubles (as often as needed) and each pair of neighbouring bins merges
into one: the counts stay exact, only coarser, and the memory stays BINS counts whatever the number of images.
The largest value lies in the upper half of the range, so more than BINS / 2 bins cover [0, max]: 8,192, against
the 2,048 that TensorRT's entropy calibrator uses (`coarse` regroups them into about that many).

Exact zeros (half of every post-ReLU activation) are counted apart: they are exact at any scale, so the entropy
method leaves them out, while percentiles count them as the values they are.
"""

from __future__ import annotations

import math

import numpy as np

BINS = 1 << 14
_CHUNK = 1 << 22  # values binned at a time: bounds the temporaries of a large batch


class AbsHistogram:
    def __init__(self, bins: int = BINS):
        self.counts = np.zeros(bins, dtype=np.int64)  # non-zero |x|: bin i holds [i * width, (i + 1) * width)
        self.zeros = 0
        self.max = 0.0
        self.range: float | None = None  # R; None until a non-zero value came

    @property
    def width(self) -> float:
        return (self.range or 0.0) / len(self.counts)

    @property
    def total(self) -> int:
        return int(self.counts.sum()) + self.zeros

    def add(self, x: np.ndarray) -> None:
        """Count |x| (any shape; NaN and infinities are a ValueError: they have no range)."""
        flat = np.asarray(x).reshape(-1)
        for start in range(0, flat.size, _CHUNK):
            self._add(np.abs(flat[start:start + _CHUNK], dtype=np.float32))

    def _add(self, a: np.ndarray) -> None:
        if a.size == 0:
            return
        top = float(a.max())
        if not math.isfinite(top):
            raise ValueError("values that are not finite (NaN or infinity) have no range to calibrate")
        nonzero = a[a > 0]
        self.zeros += a.size - nonzero.size
        if nonzero.size == 0:
            return
        self.max = max(self.max, top)
        self._cover(top)
        bins = len(self.counts)
        index = np.minimum((nonzero * np.float32(bins / self.range)).astype(np.int64), bins - 1)
        self.counts += np.bincount(index, minlength=bins)

    def _cover(self, top: float) -> None:
        """Grow the range (doubling, merging bin pairs) until `top` < R."""
        if self.range is None:
            mantissa, exponent = math.frexp(top)  # top = mantissa * 2^exponent, 0.5 <= mantissa < 1
            self.range = math.ldexp(1.0, exponent)
            return
        factor = 1
        while top >= self.range * factor:
            factor *= 2
        if factor == 1:
            return
        bins = len(self.counts)
        merged = self.counts.reshape(-1, factor).sum(axis=1) if factor < bins else self.counts.sum(keepdims=True)
        self.counts = np.zeros(bins, dtype=np.int64)
        self.counts[:len(merged)] = merged
        self.range *= factor

    def percentile(self, p: float) -> float:
        """The p-th percentile (0 < p <= 100) of |x| over everything counted, zeros included: interpolated within
        its bin, so within one bin width of numpy's; never above the maximum."""
        total = self.total
        if total == 0 or self.range is None:
            return 0.0
        target = p / 100.0 * total
        if target <= self.zeros:
            return 0.0
        cdf = self.zeros + np.cumsum(self.counts)
        i = int(np.searchsorted(cdf, target))
        i = min(i, len(self.counts) - 1)
        before = cdf[i - 1] if i else self.zeros
        inside = (target - before) / self.counts[i] if self.counts[i] else 1.0
        return min((i + inside) * self.width, self.max)

    def coarse(self, bins: int = 2048) -> tuple[np.ndarray, float]:
        """(counts, width): the non-zero values regrouped into at most `bins` bins from 0 to just past the
        maximum, whole groups of this histogram's bins each: with BINS, at least 80% of `bins` (the maximum lies
        in the upper half of the range, so more than BINS / 2 bins are in use)."""
        if self.range is None:
            return np.zeros(0, dtype=np.int64), 0.0
        used = int(np.flatnonzero(self.counts)[-1]) + 1
        group = -(-used // bins)
        padded = np.zeros(-(-used // group) * group, dtype=np.int64)
        padded[:used] = self.counts[:used]
        return padded.reshape(-1, group).sum(axis=1), group * self.width
