"""Properties of lint and fix on random valid QDQ models (tests/random_graphs.py), for every target.

A CI gate must never crash on a model and never call a model clean that is not: lint never
raises; fix writes a model that passes the ONNX checker, runs in onnxruntime, settles, and whose
remaining findings are exactly what a fresh lint of the written file reports, none of them
fixable; exact fixes leave the outputs bit-identical; fixing the output again changes nothing.

Runs derandomized (same examples every run, so CI is reproducible). Example counts per property
are set below; `pytest --hypothesis-show-statistics` prints them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import run_ort
from hypothesis import HealthCheck, given, settings
from random_graphs import qdq_models

from qdq.engine.fix import fix
from qdq.engine.lint import lint
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import builtin_targets, load_target
from qdq.graph.model import load_model, save_model
from qdq.rewrite.rule import FixSafety

settings.register_profile(
    "qdq-properties", deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile("qdq-properties")
TARGETS = builtin_targets()


def saved(model: onnx.ModelProto, folder: Path) -> Path:
    """Write a drawn model, first proving it valid: qdq must only be judged on models that are."""
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    run_ort(path, feeds_for(path))
    return path


def feeds_for(path: Path) -> dict[str, np.ndarray]:
    proto = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in proto.graph.input
    }


def summary(findings) -> list[tuple]:
    return sorted((f.code, f.node or "", f.message, str(f.severity)) for f in findings)


@settings(PROFILE, max_examples=60)
@given(qdq_models())
def test_lint_never_raises(proto):
    with tempfile.TemporaryDirectory() as folder:
        model = load_model(saved(proto, Path(folder)))
        for target in TARGETS:
            lint(model, load_target(target))


@pytest.mark.parametrize("target", TARGETS)
@settings(PROFILE, max_examples=15)
@given(proto=qdq_models())
def test_fix_writes_a_valid_settled_model_that_a_second_fix_leaves_alone(target, proto):
    ruleset = load_target(target)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        model = load_model(saved(proto, folder))
        fixed = fix(model, ruleset)
        first = folder / "fixed.onnx"
        save_model(model, first)

        onnx.checker.check_model(str(first), full_check=True)
        run_ort(first, feeds_for(first))
        assert fixed.converged, fixed.still_changing
        # What the driver reports as left is what a fresh lint of the written file finds.
        assert summary(fixed.result.findings) == summary(lint(load_model(first), ruleset).findings)
        # Anything left must say why it was not fixed: no finding still claims a fix.
        assert [f.code for f in fixed.result.findings if f.fix is not None] == []

        again = load_model(first)
        assert fix(again, ruleset).changes == []
        second = folder / "again.onnx"
        save_model(again, second)
        assert second.read_bytes() == first.read_bytes()


@pytest.mark.parametrize("target", TARGETS)
@settings(PROFILE, max_examples=12)
@given(proto=qdq_models())
def test_exact_only_fix_keeps_outputs_bit_identical(target, proto):
    ruleset = load_target(target)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        source = saved(proto, folder)
        model = load_model(source)
        fixed = fix(model, ruleset, exact_only=True)
        assert {all_rules()[c.code].fix_safety for c in fixed.changes} <= {FixSafety.EXACT}
        out = folder / "exact.onnx"
        save_model(model, out)
        onnx.checker.check_model(str(out), full_check=True)
        feeds = feeds_for(source)
        for before, after in zip(run_ort(source, feeds), run_ort(out, feeds), strict=True):
            assert before.dtype == after.dtype and before.shape == after.shape
            assert np.array_equal(before, after, equal_nan=True)
        assert fixed.converged, fixed.still_changing
        left = [f.code for f in fixed.result.findings if f.fix == FixSafety.EXACT]
        assert left == [], "an exact fix left its own finding"



def test_trt_fix_settles_on_an_int32_bias_of_a_per_channel_conv(tmp_path):
    """Found by the fix property: trt's QDQ502 made the bias per-tensor, QDQ606 per-channel again, 10 rounds.
    trt now folds the bias into a float constant first (QDQ609), and nothing re-scales it."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 2, 8, 8]), 0.05)
    w = b.weight("w", np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32),
                 np.asarray([0.01, 0.02, 0.03, 0.04], np.float32), axis=0)
    bias = b.node("DequantizeLinear", [b.init("bq", np.arange(4, dtype=np.int32)), *b.qparams("b", 0.001, 0, np.int32)])
    y = b.node("Conv", [x, w, bias], pads=[1, 1, 1, 1])
    b.output(b.qdq(y, 0.1), [1, 4, 8, 8])
    model = load_model(b.save(tmp_path / "m.onnx"))
    fixed = fix(model, load_target("trt"))
    # (QDQ809 also takes the Q/DQ off the graph output: TensorRT wants the float there.)
    assert fixed.converged and fixed.by_rule() == {"QDQ609": 1, "QDQ809": 1}
    assert fixed.result.findings == []


def test_overlapping_alignment_groups_settle_on_one_zero_point(tmp_path):
    """Found by the fix property: a value read by a MaxPool and a Reshape whose outputs have its
    scale but other zero-points; each group gave its output's zero-point to the shared input, so
    ort's QDQ402 traded 140 and 112 back and forth until the round limit."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 2, 8, 8]), 0.05, 128, np.uint8)
    pooled = b.qdq(b.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 0.05, 140, np.uint8)
    shape = b.init("shape", np.asarray([1, 4, 4, 8], np.int64))
    reshaped = b.qdq(b.node("Reshape", [x, shape]), 0.05, 112, np.uint8)
    b.output(pooled, [1, 2, 8, 8])
    b.output(reshaped, [1, 4, 4, 8])
    model = load_model(b.save(tmp_path / "m.onnx"))
    fixed = fix(model, load_target("ort"))
    assert fixed.converged, fixed.still_changing
    assert [f.code for f in fixed.result.findings if f.code == "QDQ402"] == []
