"""The fix driver: rule order from the rules file, rounds to a fixed point, and what it reports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from qdq.engine.fix import fix
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import load_rules_file, load_target
from qdq.graph.model import load_model, save_model
from qdq.rewrite.rule import FixSafety, ScaleCeilings
from qdq.support.errors import InvalidOutputError, RuleSetError


def _concat_after_pool(builder, tmp_path):
    """DQ(2^-3) → MaxPool → Q(2^-4) → DQ → Concat ← DQ(2^-5); Concat → Q(2^-5).

    Aligning the Concat coarsens the MaxPool's output, which breaks the MaxPool's own
    alignment, so the driver needs a second round for QDQ402.
    """
    x = builder.input("x", [1, 2, 4, 4])
    y = builder.input("y", [1, 2, 2, 2])
    a = builder.qdq(x, scale=2.0**-3)
    pooled = builder.node("MaxPool", [a], kernel_shape=[2, 2], strides=[2, 2])
    b = builder.qdq(pooled, scale=2.0**-4)
    c = builder.qdq(y, scale=2.0**-5)
    cat = builder.node("Concat", [b, c], axis=1)
    out = builder.qdq(cat, scale=2.0**-5)
    builder.node("Identity", [out], ["out"])
    builder.output("out", [1, 4, 2, 2])
    return load_model(builder.save(tmp_path / "m.onnx"))


def test_fix_order_comes_from_the_rules_file(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('extends = "npu"\nfix-order = ["QDQ402", "QDQ401"]\n')
    codes = [rule.code for rule, _ in load_rules_file(path).fix_sequence()]
    assert codes.index("QDQ402") < codes.index("QDQ401") < codes.index("QDQ102")


def test_fix_order_is_inherited_and_unlisted_rules_follow_by_code():
    npu = [rule.code for rule, _ in load_target("npu").fix_sequence()]
    assert npu.index("QDQ504") < npu.index("QDQ401") < npu.index("QDQ601") < npu.index("QDQ604")
    assert npu.index("QDQ604") < npu.index("QDQ606") < npu.index("QDQ605")  # the bias follows a moved weight
    common = [rule.code for rule, _ in load_target("common").fix_sequence()]
    assert common == sorted(common)


def test_fix_order_must_be_a_list_of_codes(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('extends = "npu"\nfix-order = "QDQ4"\n')
    with pytest.raises(RuleSetError, match="fix-order"):
        load_rules_file(path)


def test_rounds_run_until_nothing_changes(builder, tmp_path):
    model = _concat_after_pool(builder, tmp_path)
    result = fix(model, load_target("npu").narrowed(select=["QDQ401", "QDQ402"]))
    assert result.converged and not result.result.findings
    assert result.rounds >= 2  # the last round is the one that changed nothing
    assert {c.code for c in result.changes} == {"QDQ401", "QDQ402"}


def test_round_limit_is_reported_with_the_rules_still_changing(builder, tmp_path):
    model = _concat_after_pool(builder, tmp_path)
    result = fix(model, load_target("npu").narrowed(select=["QDQ401", "QDQ402"]), max_rounds=1)
    assert not result.converged
    assert result.still_changing
    assert result.to_dict()["converged"] is False
    # Round 1 aligned the Concat, then the MaxPool, which misaligned the Concat again.
    assert [f.code for f in result.result.findings] == ["QDQ401"]


def test_exact_only_skips_approximate_fixes(builder, tmp_path):
    x = builder.input("x", [1, 4])
    q = builder.q(x, scale=np.array([0.05], dtype=np.float32), zero_point=np.array([0], dtype=np.int8))
    out = builder.dq(q, scale=np.array([0.05], dtype=np.float32), zero_point=np.array([0], dtype=np.int8))
    builder.node("Identity", [out], ["y"])
    builder.output("y", [1, 4])
    model = load_model(builder.save(tmp_path / "m.onnx"))
    result = fix(model, load_target("npu"), exact_only=True)
    safety = {c.code for c in result.changes}
    assert safety == {"QDQ201"}
    assert result.exact_only
    assert [f.code for f in result.result.findings] == ["QDQ504"]  # 0.05 is left: its fix is approximate
    assert all(f.fix == FixSafety.APPROXIMATE for f in result.result.findings)


def test_a_clean_model_is_left_exactly_as_it_was(builder, tmp_path):
    x = builder.input("x", [1, 4])
    out = builder.qdq(x, scale=2.0**-4)
    builder.node("Identity", [out], ["y"])
    builder.output("y", [1, 4])
    model = load_model(builder.save(tmp_path / "m.onnx"))
    result = fix(model, load_target("npu"))
    assert result.changes == [] and result.converged and result.rounds == 1
    save_model(model, tmp_path / "out.onnx")
    before, after = onnx.load(str(tmp_path / "m.onnx")), onnx.load(str(tmp_path / "out.onnx"))
    assert after.graph.node == before.graph.node and after.graph.initializer == before.graph.initializer


def test_a_float_model_has_nothing_to_fix(builder, tmp_path):
    x = builder.input("x", [1, 4])
    builder.node("Relu", [x], ["y"])
    builder.output("y", [1, 4])
    result = fix(load_model(builder.save(tmp_path / "m.onnx")), load_target("npu"))
    assert result.changes == [] and result.converged
    assert result.result.notes


def test_bad_inputs_file_stops_fix_before_anything_is_written(builder, tmp_path, capsys):
    import cli

    x = builder.input("x", [1, 4])
    out = builder.qdq(x, scale=0.05)
    builder.node("Identity", [out], ["y"])
    builder.output("y", [1, 4])
    path = builder.save(tmp_path / "m.onnx")
    np.savez(tmp_path / "wrong.npz", z=np.zeros((1, 4), np.float32))
    code = cli.main(["fix", str(path), "--target", "npu", "-o", str(tmp_path / "out.onnx"),
                     "--inputs", str(tmp_path / "wrong.npz")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "wrong.npz" in err
    assert not (tmp_path / "out.onnx").exists()


def test_a_scale_ceiling_only_comes_down():
    ceilings = ScaleCeilings()
    assert ceilings.lowest(["a", "b"]) is None
    ceilings.lower("a", 2.0 ** -7)
    ceilings.lower("a", 2.0 ** -5)  # a coarser ceiling for the same value does not lift it
    ceilings.lower("b", 2.0 ** -8)
    assert ceilings.lowest(["a"]) == 2.0 ** -7
    assert ceilings.lowest(["a", "b", "c"]) == 2.0 ** -8


def test_a_fix_that_edits_without_reporting_a_change_stops_the_fix(builder, tmp_path, monkeypatch):
    """qdq never changes a model silently: such a fix is a bug, and the driver refuses to go on."""
    x = builder.input("x", [1, 4])
    out = builder.qdq(x, scale=0.05)
    builder.node("Identity", [out], ["y"])
    builder.output("y", [1, 4])
    model = load_model(builder.save(tmp_path / "m.onnx"))
    rule = all_rules()["QDQ504"]

    def silent(self, ctx, finding):
        ctx.edits.set_attr(next(n for n in ctx.graph.nodes if n.op == "QuantizeLinear"), "axis", 0)
        return []

    monkeypatch.setattr(rule, "fix", silent)
    with pytest.raises(InvalidOutputError, match="QDQ504 changed the graph at .* without reporting a change"):
        fix(model, load_target("npu").narrowed(select=["QDQ504"]))
