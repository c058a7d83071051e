"""The distribution of one activation over calibration samples, and what a grid costs on it.

Why: choosing an activation's power-of-two position by least squared error (what AMD Quark's
MinMSE does) needs the values the tensor takes, not only its range: a finer grid clips the few
largest values and rounds all the others more finely. Keeping every value of every feature map
does not fit in memory; a histogram does, and answers the one question asked of it, the mean
squared error of QuantizeLinear → DequantizeLinear on a given grid.

The histogram is symmetric about zero over [-R, R] with R a power of two, and doubles R (merging
pairs of bins) when a value falls outside, so samples can arrive one at a time. Exact zeros are
counted apart: they sit on every grid (integer zero-points) and cost nothing, and a Relu output
is often half zeros.
"""

from __future__ import annotations

import math

import numpy as np

BINS = 1 << 14  # 4 bins per step at the finest grid a position search asks about (R / 2048)


class Histogram:
    """Counts of a tensor's non-zero finite values over [-R, R] in `BINS` equal bins, and its zeros."""

    def __init__(self) -> None:
        self.counts = np.zeros(BINS, dtype=np.int64)
        self.zeros = 0
        self.limit = 0.0  # R; 0 until a non-zero value arrives

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        values = values[np.isfinite(values)]
        nonzero = values[values != 0]
        self.zeros += values.size - nonzero.size
        if nonzero.size == 0:
            return
        largest = float(np.abs(nonzero).max())
        if self.limit == 0.0:
            self.limit = 2.0 ** math.ceil(math.log2(largest))
        while largest > self.limit:
            self._double()
        index = np.floor((nonzero + self.limit) * (BINS / (2 * self.limit))).astype(np.int64)
        self.counts += np.bincount(np.clip(index, 0, BINS - 1), minlength=BINS)

    def _double(self) -> None:
        """Twice the range, half the resolution: pairs of bins merge into the middle half."""
        merged = self.counts.reshape(-1, 2).sum(axis=1)
        self.counts = np.zeros(BINS, dtype=np.int64)
        self.counts[BINS // 4: BINS // 4 + merged.size] = merged
        self.limit *= 2

    @property
    def total(self) -> int:
        return int(self.counts.sum()) + self.zeros

    def squared_error(self, scale: float, qmin: float, qmax: float, zero_point: float,
                      bounds: tuple[float, float] = (-math.inf, math.inf)) -> float:
        """Mean squared error of Q → DQ with this grid over the values counted, each first clipped
        to `bounds` (a Clip before the Q). Bin centres stand for their bins; zeros are exact."""
        if self.total == 0:
            return 0.0
        width = 2 * self.limit / BINS
        centres = np.clip(-self.limit + width * (np.arange(BINS) + 0.5), *bounds)
        grid = (np.clip(np.rint(centres / scale) + zero_point, qmin, qmax) - zero_point) * scale
        return float(np.dot(self.counts, (grid - centres) ** 2) / self.total)
