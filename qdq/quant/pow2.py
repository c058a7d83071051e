"""Power-of-two scale helpers: the fix position ``pos = -log2(scale)`` used by NPU rules."""

from __future__ import annotations

import math

import numpy as np


def pos(scale: float) -> float:
    """The fix position of a scale: ``scale == 2 ** -pos``. Not rounded; see `is_pow2`."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be positive and finite, got {scale!r}")
    return 0.0 - math.log2(scale)  # not `-log2`: a scale of 1.0 is position 0.0, not -0.0


def is_pow2(scale: float) -> bool:
    """True when the scale is exactly a power of two, as stored (no tolerance)."""
    return exact_pos(scale) is not None


def exact_pos(scale: float) -> int | None:
    """The integer fix position of an exact power-of-two scale, else None.

    One `frexp` (no logarithm): the NPU rules ask this for every operand of every op.
    """
    if not (scale > 0 and math.isfinite(scale)):
        return None
    mantissa, exponent = math.frexp(scale)
    return 1 - exponent if mantissa == 0.5 else None  # scale = 0.5 · 2^exponent = 2^-(1 - exponent)


def all_pow2(scales: np.ndarray) -> bool:
    """True when every element of a scale array is exactly a power of two."""
    values = np.asarray(scales, dtype=np.float64).ravel()
    if values.size == 1:  # per-tensor scales: plain floats are ten times faster than numpy here
        return is_pow2(float(values[0]))
    if values.size == 0:
        return False
    return bool(np.all(exact(values)))


def exact(values: np.ndarray) -> np.ndarray:
    """Elementwise `is_pow2` of a float64 array (mantissa 0.5: NaN, infinities, zero and negatives fail)."""
    mantissa, _ = np.frexp(values)
    return mantissa == 0.5


def int_pos(scale: float) -> int:
    """The integer fix position of an exact power-of-two scale; ValueError otherwise."""
    found = exact_pos(scale)
    if found is None:
        raise ValueError(f"scale {scale!r} is not a power of two")
    return found
