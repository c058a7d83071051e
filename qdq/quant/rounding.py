"""QuantizeLinear's arithmetic on float values, and what the rounding costs.

Every fix that writes integers (a re-quantized weight, a folded BatchNorm, a bias at input ×
weight scale, a float weight quantized for the first time) computes them the way QuantizeLinear
does, round half to even then clip, and reports the same cost: values saturated, non-zero values
rounded to zero, and the SQNR of what the integers stand for against the ideal values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def along(values: np.ndarray, ndim: int, axis: int | None, rows: slice = slice(None)) -> np.ndarray:
    """Per-axis parameters shaped to broadcast over a tensor of rank `ndim` (one value passes through
    as a scalar). With `rows`, over that block of rows of the tensor (which matters when `axis` is 0)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size <= 1:
        return values.reshape(())
    shape = [1] * ndim
    axis = axis % ndim
    shape[axis] = values.size
    return values.reshape(shape)[rows] if axis == 0 else values.reshape(shape)


def quantize(values: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qmin: float,
             qmax: float) -> tuple[np.ndarray, np.ndarray]:
    """QuantizeLinear (round half to even, then clip to [qmin, qmax]): the integers as float64, and
    the same before clipping. `scale` and `zero_point` broadcast over `values` (see `along`)."""
    unclipped = np.rint(np.asarray(values, dtype=np.float64) / scale) + zero_point
    return np.clip(unclipped, qmin, qmax), unclipped


@dataclass
class RoundingCost:
    """What writing values as integers cost, added up over blocks of one tensor."""

    elements: int = 0
    saturated: int = 0
    rounded_to_zero: int = 0
    noise: float = 0.0
    signal: float = 0.0

    @classmethod
    def of(cls, ideal: np.ndarray, clipped: np.ndarray, unclipped: np.ndarray, scale: np.ndarray,
           zero_point: np.ndarray) -> RoundingCost:
        """The cost of `clipped` (from `quantize`) standing for `ideal`."""
        back = (clipped - zero_point) * scale
        return cls(int(np.size(ideal)), int(np.count_nonzero(clipped != unclipped)),
                   int(np.count_nonzero((clipped == zero_point) & (ideal != 0))),
                   float(np.sum((ideal - back) ** 2)), float(np.sum(np.square(ideal, dtype=np.float64))))

    def __add__(self, other: RoundingCost) -> RoundingCost:
        return RoundingCost(self.elements + other.elements, self.saturated + other.saturated,
                            self.rounded_to_zero + other.rounded_to_zero, self.noise + other.noise,
                            self.signal + other.signal)

    def values(self) -> dict:
        """For a change report: elements, saturated, rounded_to_zero and (for a non-zero tensor) sqnr_db."""
        out = {"elements": self.elements, "saturated": self.saturated, "rounded_to_zero": self.rounded_to_zero}
        if self.signal > 0:
            out["sqnr_db"] = round(10 * math.log10(self.signal / self.noise), 2) if self.noise > 0 else math.inf
        return out


def cost_sentence(reason: str, values: dict) -> str:
    """`reason (1 bit(s) of precision lost; 3 of 100 values saturate; SQNR 41.2 dB)` for a change report."""
    notes = []
    if values.get("bits_lost", 0) > 0:
        notes.append(f"{values['bits_lost']} bit(s) of precision lost")
    if values.get("saturated"):
        notes.append(f"{values['saturated']} of {values['elements']} values saturate")
    if values.get("rounded_to_zero"):
        notes.append(f"{values['rounded_to_zero']} of {values['elements']} values round to zero")
    if "sqnr_db" in values and values.get("elements"):
        notes.append(f"SQNR {values['sqnr_db']} dB")
    return reason + (f" ({'; '.join(notes)})" if notes else "")
