"""Power-of-two scale helpers: exact tests, no tolerance, down to float32 subnormals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qdq.quant.pow2 import all_pow2, exact_pos, int_pos, is_pow2, pos

F32_MIN_NORMAL = 2.0**-126
F32_MIN_SUBNORMAL = 2.0**-149


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        (1.0, 0),
        (0.5, 1),
        (2.0**-7, 7),
        (4.0, -2),
        (8, -3),  # a Python int
        (F32_MIN_NORMAL, 126),
        (F32_MIN_SUBNORMAL, 149),
        (2.0**-1074, 1074),  # float64's smallest subnormal
        (np.float32(2.0**-149), 149),
        (np.float32(2.0**-130), 130),
        (np.float16(2.0**-24), 24),  # float16's smallest subnormal
        (np.float64(2.0**-20), 20),
    ],
)
def test_powers_of_two(scale, expected):
    assert is_pow2(scale)
    assert int_pos(scale) == expected and isinstance(int_pos(scale), int)
    assert pos(scale) == float(expected)


def test_pos_of_one_is_positive_zero():
    assert math.copysign(1.0, pos(1.0)) == 1.0
    assert str(pos(1.0)) == "0.0"


@pytest.mark.parametrize(
    "scale",
    [
        0.75, 0.1, 3.0, 2.0**-126 * 1.5, np.float32(0.1),
        np.nextafter(0.5, 1.0), np.nextafter(np.float32(0.5), np.float32(0)),
    ],
)
def test_not_powers_of_two(scale):
    assert not is_pow2(scale)
    assert pos(scale) == -math.log2(float(scale))
    with pytest.raises(ValueError, match="not a power of two"):
        int_pos(scale)


def test_exact_pos_is_the_rounded_logarithm_for_every_float64_power_of_two():
    """`exact_pos` takes the position from `frexp`; it is what rounding `pos` (a logarithm) gives."""
    for exponent in range(-1074, 1024):
        scale = 2.0**exponent
        assert exact_pos(scale) == round(pos(scale)) == -exponent
        assert exact_pos(-scale) is None
        if exponent < 1023:  # 3 · 2^k is a float64 for every k here, never a power of two
            assert exact_pos(scale * 3) is None


def test_pos_is_not_rounded():
    assert pos(0.75) == pytest.approx(0.4150374992788438, rel=0, abs=1e-15)
    assert 0 < pos(0.75) < 1


@pytest.mark.parametrize("scale", [0.0, -0.0, -0.5, -1.0, math.inf, -math.inf, math.nan, np.float32(np.nan)])
def test_non_positive_or_non_finite(scale):
    assert not is_pow2(scale)
    with pytest.raises(ValueError, match="positive and finite"):
        pos(scale)
    with pytest.raises(ValueError, match="not a power of two"):
        int_pos(scale)


def test_all_pow2_on_float32_arrays():
    assert all_pow2(np.array([0.5, 0.25, 1.0, 2.0**-149, 2.0**-126], np.float32))
    assert all_pow2(np.full((2, 3), 2.0**-10, np.float32))
    assert all_pow2(np.float32(0.125))  # 0-d
    assert all_pow2([1.0, 2.0, 4.0])
    assert not all_pow2(np.array([0.5, 0.75], np.float32))
    assert not all_pow2(np.array([[0.5], [0.1]], np.float32))


def test_all_pow2_rejects_bad_values_and_empty():
    assert not all_pow2(np.array([0.5, 0.0], np.float32))
    assert not all_pow2(np.array([0.5, -0.5], np.float32))
    assert not all_pow2(np.array([0.5, np.inf], np.float32))
    assert not all_pow2(np.array([np.nan], np.float32))
    assert not all_pow2(np.array([], np.float32))


def test_array_and_scalar_helpers_agree():
    values = np.array([2.0**-149, 2.0**-126, 0.75, 1.0, 3.0, 1e-45, 1e-40], np.float32)
    expected = [True, True, False, True, False, True, False]
    assert [all_pow2(v) for v in values] == [is_pow2(v) for v in values] == expected
