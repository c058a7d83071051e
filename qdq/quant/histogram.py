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

from qdq.quant.rounding import quantize

# 2^14 bins give 4 per step at the finest grid QDQ504 asks about (four positions finer than one
# that holds R: step R / 2048); a model with many quantizers gets fewer, so that all of its
# histograms together stay within MEMORY bytes, down to MIN_BINS.
MAX_BINS, MIN_BINS = 1 << 14, 1 << 10
MEMORY = 256 << 20


def bins_for(count: int) -> int:
    """The bins each of `count` histograms gets: a power of two in [MIN_BINS, MAX_BINS]."""
    fits = MEMORY // (np.dtype(np.int32).itemsize * max(count, 1))
    return int(min(MAX_BINS, max(MIN_BINS, 1 << (int(fits).bit_length() - 1))))


class Histogram:
    """Counts of a tensor's non-zero finite values over [-R, R] in `bins` equal bins, and its zeros."""

    def __init__(self, bins: int = MAX_BINS) -> None:
        self.bins = bins
        self.counts: np.ndarray | None = None  # allocated with the first non-zero value
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
        if self.counts is None:
            self.counts = np.zeros(self.bins, dtype=np.int32)  # int32: 2^31 values a bin before it wraps
            self.limit = 2.0 ** math.ceil(math.log2(largest))
        while largest > self.limit:
            self._double()
        index = np.floor((nonzero + self.limit) * (self.bins / (2 * self.limit))).astype(np.int64)
        self.counts += np.bincount(np.clip(index, 0, self.bins - 1), minlength=self.bins).astype(np.int32)

    def _double(self) -> None:
        """Twice the range, half the resolution: pairs of bins merge into the middle half."""
        merged = self.counts.reshape(-1, 2).sum(axis=1, dtype=np.int32)
        self.counts = np.zeros(self.bins, dtype=np.int32)
        self.counts[self.bins // 4: self.bins // 4 + merged.size] = merged
        self.limit *= 2

    @property
    def total(self) -> int:
        return (int(self.counts.sum(dtype=np.int64)) if self.counts is not None else 0) + self.zeros

    def squared_error(self, scale: float, qmin: float, qmax: float, zero_point: float,
                      bounds: tuple[float, float] = (-math.inf, math.inf), clip_weight: float = 1.0) -> float:
        """Mean squared error of Q → DQ with this grid over the values counted, each first clipped
        to `bounds` (a Clip before the Q); the error of values the grid saturates counts
        `clip_weight` times. Bin centres stand for their bins; zeros are exact."""
        if self.counts is None:
            return 0.0
        width = 2 * self.limit / self.bins
        centres = np.clip(-self.limit + width * (np.arange(self.bins) + 0.5), *bounds)
        integers, unclipped = quantize(centres, scale, zero_point, qmin, qmax)
        error = ((integers - zero_point) * scale - centres) ** 2
        if clip_weight != 1.0:
            error = np.where(integers != unclipped, clip_weight * error, error)
        return float(np.dot(self.counts.astype(np.float64), error) / self.total)
