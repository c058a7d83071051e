"""Activation positions chosen by least squared error on calibration data (QDQ504 `rounding = "min-error"`).

The expected positions are recomputed here by brute force from the raw calibration values with
numpy (QuantizeLinear's round-half-even and clip), never from qdq's histogram: the histogram is
an approximation, and these tests hold it to the exact answer on the cases that matter (a
heavy tail a finer grid should clip, a Clip put back in front of the Q, no data at all).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from onnx import numpy_helper

from qdq.engine.fix import fix
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_rules_file
from qdq.graph.model import load_model, save_model
from qdq.quant.calibrate import tensor_ranges
from qdq.support.errors import RuleSetError
from qdq.quant.histogram import MAX_BINS, MEMORY, MIN_BINS, Histogram, bins_for



CLIP_WEIGHT = 2.0  # set in each test's rules file, so the brute force below is told it, not read from qdq


def exact_error(values: np.ndarray, pos: int, qmin=-128, qmax=127, zp=0, clip_weight=1.0) -> float:
    scale = 2.0**-pos
    integers = np.rint(values / scale) + zp
    error = ((np.clip(integers, qmin, qmax) - zp) * scale - values) ** 2
    return float(np.mean(np.where((integers < qmin) | (integers > qmax), clip_weight * error, error)))


def best_pos(values: np.ndarray, positions) -> int:
    errors = {pos: exact_error(values, pos, clip_weight=CLIP_WEIGHT) for pos in positions}
    return min(errors, key=lambda pos: (errors[pos], pos))


def test_histogram_error_matches_the_exact_error_after_its_range_doubles():
    rng = np.random.default_rng(7)
    values = [rng.laplace(0, 0.1, 5000), rng.laplace(0, 0.1, 5000) * 8, np.zeros(3000)]
    histogram = Histogram()
    for chunk in values:
        histogram.add(chunk)
    everything = np.concatenate(values)
    assert histogram.total == everything.size and histogram.zeros == 3000
    assert histogram.limit == 2.0 ** math.ceil(math.log2(np.abs(everything).max()))
    for pos in range(2, 10):
        exact = exact_error(everything, pos)
        assert abs(histogram.squared_error(2.0**-pos, -128, 127, 0) - exact) <= 0.1 * exact, pos
        # Values clipped first (a Clip(0, 1) before the Q), then quantized.
        exact = exact_error(np.clip(everything, 0, 1), pos)
        assert abs(histogram.squared_error(2.0**-pos, -128, 127, 0, (0, 1)) - exact) <= 0.1 * exact, pos
        # Saturated values' error weighted 3 times.
        exact = exact_error(everything, pos, clip_weight=3.0)
        assert abs(histogram.squared_error(2.0**-pos, -128, 127, 0, clip_weight=3.0) - exact) <= 0.1 * exact, pos


def test_many_histograms_share_a_memory_budget():
    assert bins_for(1) == MAX_BINS and bins_for(10**7) == MIN_BINS
    for count in (300, 5000, 30000):
        bins = bins_for(count)
        assert bins & (bins - 1) == 0 and (bins * 4 * count <= MEMORY or bins == MIN_BINS)
        assert bins * 2 * 4 * count > MEMORY or bins == MAX_BINS  # the largest that fits


def heavy_tailed_graph(tmp_path, scale: float, one_sided: bool = False):
    """x → Q(scale, int8 zp 0) → DQ → output; `one_sided`: Q(scale, uint8 zp 0), which clips x to
    [0, 255·scale] and which QDQ503 makes int8 zp 0 with that Clip put back in front of the Q."""
    b = GraphBuilder()
    x = b.input("x", [64, 64])
    zero_point = np.uint8(0) if one_sided else np.int8(0)
    params = [b.init("s", np.float32(scale)), b.init("zp", zero_point)]
    q = b.node("QuantizeLinear", [x, *params], ["x_int"], name="x_q")
    b.output(b.node("DequantizeLinear", [q, *params], ["y"], name="x_dq"), [64, 64])
    path = tmp_path / "m.onnx"
    onnx.save(b.model(), str(path))
    return path


def fixed_scale(tmp_path, path, rounding: str, samples, codes=("QDQ504",)) -> float:
    """The Q's scale after fixing with npu narrowed to `codes`, `rounding` for activations."""
    rules = tmp_path / "rules.toml"
    rules.write_text(f'extends = "npu"\n[rules.QDQ504]\nrounding = "{rounding}"\nclip_weight = {CLIP_WEIGHT}\n')
    model = load_model(path)
    ranges = tensor_ranges(path, *samples) if samples else None
    result = fix(model, load_rules_file(rules).narrowed(select=list(codes)), ranges=ranges)
    assert result.converged and not result.result.findings
    save_model(model, tmp_path / "fixed.onnx")
    saved = onnx.load(str(tmp_path / "fixed.onnx"))
    constants = {t.name: numpy_helper.to_array(t) for t in saved.graph.initializer}
    (quantize,) = [n for n in saved.graph.node if n.op_type == "QuantizeLinear"]
    return float(constants[quantize.input[1]])


def test_min_error_clips_a_heavy_tail_that_ceil_keeps(tmp_path):
    # The input's scale holds the largest value (6.3 / 127); most values are far smaller.
    rng = np.random.default_rng(0)
    samples = [{"x": rng.laplace(0, 0.3, (64, 64)).astype(np.float32)} for _ in range(16)]
    samples[0]["x"][0, 0] = 6.3
    everything = np.concatenate([s["x"].ravel() for s in samples]).astype(np.float64)
    path = heavy_tailed_graph(tmp_path, 6.3 / 127)
    ceil_pos = -math.ceil(math.log2(np.float32(6.3 / 127)))
    expected = best_pos(everything, range(ceil_pos - 1, ceil_pos + 5))
    assert expected > ceil_pos  # the test means something only when a finer grid wins
    assert fixed_scale(tmp_path, path, "min-error", samples) == 2.0**-expected
    assert fixed_scale(tmp_path, path, "ceil", samples) == 2.0**-ceil_pos


def test_min_error_without_data_is_ceil(tmp_path):
    path = heavy_tailed_graph(tmp_path, 6.3 / 127)
    assert fixed_scale(tmp_path, path, "min-error", []) == 2.0 ** math.ceil(math.log2(np.float32(6.3 / 127)))


@pytest.mark.parametrize("outlier", [None, 50.0])
def test_min_error_reads_the_values_behind_a_clip_the_fix_put_back(tmp_path, outlier):
    # QDQ503 makes the one-sided uint8 grid [0, 255·s] int8 with zp 0 and puts Clip(0, 255·s)
    # before the Q. That Clip's output was never measured; its input was, and the grid's error is
    # that of the values the Clip lets through: an outlier past its top costs only what it costs
    # clipped there.
    scale = 4.0 / 255
    rng = np.random.default_rng(0)
    samples = [{"x": rng.laplace(0, 0.05, (64, 64)).astype(np.float32)} for _ in range(4)]
    if outlier is not None:
        samples[1]["x"][0, 0] = outlier
    measured = np.concatenate([s["x"].ravel() for s in samples]).astype(np.float64)
    clipped = np.clip(measured, 0, 255 * np.float32(scale))
    path = heavy_tailed_graph(tmp_path, scale, one_sided=True)
    ceil_pos = -math.ceil(math.log2(np.float32(scale)))
    expected = best_pos(clipped, range(ceil_pos - 5, ceil_pos + 5))
    if outlier is None:
        assert expected > ceil_pos  # without the Clip's input measured, the fix would keep ceil
    else:
        assert best_pos(measured, range(ceil_pos - 5, ceil_pos + 5)) < ceil_pos  # unclipped, the outlier would win
    assert fixed_scale(tmp_path, path, "min-error", samples, ("QDQ503", "QDQ504")) == 2.0**-expected


def test_clip_weight_below_one_is_refused(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('extends = "npu"\n[rules.QDQ504]\nclip_weight = 0.5\n')
    with pytest.raises(RuleSetError, match="clip_weight must be a number >= 1"):
        lint(load_model(heavy_tailed_graph(tmp_path, 0.05)), load_rules_file(rules))
