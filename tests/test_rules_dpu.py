"""The DPU numerics rules (QDQ7xx), rule by rule: positive and negative cases on tiny hand-built
graphs, parameters overridden from a rules file, the QDQ701 fix run in onnxruntime, and the
average-pool factor table.

The rules are not in `common`; each test lints with a rules file that extends it and turns them
on with the DPU's constants from rules/npu.toml (where they live; the rules' own defaults are
placeholders). The linter only runs rules on models with Q/DQ, so every graph has a Q/DQ pair.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import apply_fix, run_ort
from onnx import TensorProto, helper

import cli
from qdq.checks import dpu
from qdq.engine.lint import lint
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import RuleSet, load_rules_file, load_target
from qdq.graph.model import Model, load_model, save_model
from qdq.rewrite.rule import Finding, FixSafety, Severity
from qdq.support.errors import RuleSetError

DPU_CODES = ["QDQ701", "QDQ702", "QDQ703"]
HSIG_FACTOR = 1.0001220703125
NPU = {code: load_target("npu").rules[code].params for code in DPU_CODES}
# AMD's fixed average-pool multipliers: [area, k, n] for 3×3, 5×5, 6×6, 7×7 and 14×14.
AMD_TABLE = [[9, 7, 6], [25, 10, 8], [36, 7, 8], [49, 21, 10], [196, 21, 12]]


def dpu_avgpool_multiplier(area: int, search_bits: int = 7, table=None) -> tuple[int, int]:
    return dpu.dpu_avgpool_multiplier(area, search_bits, table=AMD_TABLE if table is None else table)


def dpu_avgpool_factor(area: int, search_bits: int = 7, table=None) -> float:
    return dpu.dpu_avgpool_factor(area, search_bits, table=AMD_TABLE if table is None else table)


def _toml(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)


def dpu_tables(code: str = "", params: str = "") -> str:
    """[rules.QDQ70x] tables with rules/npu.toml's DPU constants, `params` (TOML lines) overriding `code`'s."""
    tables = ""
    for c in DPU_CODES:
        overridden = {line.split("=")[0].strip() for line in params.splitlines() if "=" in line} if c == code else set()
        lines = "".join(f"{k} = {_toml(v)}\n" for k, v in NPU[c].items() if k not in overridden)
        tables += f"[rules.{c}]\n{lines}" + (params if c == code else "")
    return tables


# --- building blocks ------------------------------------------------------------------------------


def dpu_rules(tmp_path: Path, extra: str = "") -> RuleSet:
    """`common` plus the DPU rules; `extra` is appended (parameter overrides)."""
    path = tmp_path / "dpu.toml"
    path.write_text('extends = "common"\n' + dpu_tables() + extra)
    return load_rules_file(path)


def dpu_rules_with(tmp_path: Path, code: str, params: str) -> RuleSet:
    """`common` plus the DPU rules, with `params` (TOML lines) under [rules.code]."""
    path = tmp_path / "dpu.toml"
    path.write_text('extends = "common"\n' + dpu_tables(code, params))
    return load_rules_file(path)


def load(b: GraphBuilder, tmp_path: Path, name: str = "m.onnx") -> Model:
    return load_model(b.save(tmp_path / name))


def found(model: Model, code: str, ruleset: RuleSet) -> list[Finding]:
    """One rule's findings; each message must be the rule's template filled with its own values."""
    rule = all_rules()[code]
    findings = [f for f in lint(model, ruleset).findings if f.code == code]
    for f in findings:
        assert f.message == rule.message.format(node=f.node or "", **f.values)
        json.dumps(f.to_dict())  # values are plain JSON
    return findings


def one(model: Model, code: str, ruleset: RuleSet) -> Finding:
    findings = found(model, code, ruleset)
    assert len(findings) == 1, [f.message for f in findings]
    return findings[0]


def none(model: Model, code: str, ruleset: RuleSet) -> None:
    assert found(model, code, ruleset) == []


def qdq_input(b: GraphBuilder, shape: list[int]) -> str:
    """Graph input `x` through a Q/DQ pair (so the linter runs)."""
    return b.qdq(b.input("x", shape), scale=0.05, name="in")


def leaky(tmp_path: Path, alpha: float | None) -> Model:
    b = GraphBuilder()
    attrs = {} if alpha is None else {"alpha": alpha}
    b.output(b.node("LeakyRelu", [qdq_input(b, [2, 8])], ["y"], name="lrelu", **attrs), [2, 8])
    return load(b, tmp_path)


def add_mul(b: GraphBuilder, x: str, value, via_constant_node: bool = False, dtype=np.float32) -> str:
    """`x · value`, the constant an initializer or a Constant node's output."""
    value = np.asarray(value, dtype=dtype)
    if via_constant_node:
        const = b.node("Constant", [], ["mul_const"], name="const", value=onnx.numpy_helper.from_array(value, "v"))
    else:
        const = b.init("mul_const", value)
    return b.node("Mul", [x, const], ["y"], name="mul")


# --- QDQ701 leaky-relu-slope -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "dpu_alpha", "slope"),
    [
        (0.1, 0.1015625, "26/256"),
        (None, 0.01171875, "3/256"),  # absent: the ONNX default 0.01
        (0.2, 0.19921875, "51/256"),
        (2.5 / 256, 2 / 256, "2/256"),  # a tie rounds half to even: 2.5 → 2
        (3.5 / 256, 4 / 256, "4/256"),  # 3.5 → 4
    ],
)
def test_qdq701_slope_not_a_multiple_of_1_256(tmp_path, alpha, dpu_alpha, slope):
    f = one(leaky(tmp_path, alpha), "QDQ701", dpu_rules(tmp_path))
    expected = 0.01 if alpha is None else float(str(np.float32(alpha)))
    assert (f.node, f.tensors, f.severity) == ("lrelu", ("in_dq_out", "y"), Severity.WARNING)
    assert f.fix == FixSafety.APPROXIMATE
    assert f.values == {"alpha": expected, "dpu_alpha": dpu_alpha, "slope": slope}
    assert f"LeakyRelu lrelu has alpha {expected:.8g}" in f.message and slope in f.message


@pytest.mark.parametrize("alpha", [0.1015625, 0.25, 0.0, 26 / 256, -0.5, 3 / 256])
def test_qdq701_dpu_slopes_are_clean(tmp_path, alpha):
    none(leaky(tmp_path, alpha), "QDQ701", dpu_rules(tmp_path))


def test_qdq701_slope_denominator_from_the_rules_file(tmp_path):
    # 3/256 is a DPU slope at 1/256 but not at 1/128: 1.5/128 rounds half to even to 2/128.
    model = leaky(tmp_path, 3 / 256)
    none(model, "QDQ701", dpu_rules(tmp_path))
    f = one(model, "QDQ701", dpu_rules_with(tmp_path, "QDQ701", "slope_denominator = 128\n"))
    assert f.values == {"alpha": 0.01171875, "dpu_alpha": 0.015625, "slope": "2/128"}


def test_qdq701_bad_slope_denominator(tmp_path):
    model = leaky(tmp_path, 0.1)
    with pytest.raises(RuleSetError, match="slope_denominator must be a positive integer"):
        lint(model, dpu_rules_with(tmp_path, "QDQ701", "slope_denominator = 0\n"))
    with pytest.raises(RuleSetError, match="must be int"):
        dpu_rules_with(tmp_path, "QDQ701", "slope_denominator = 2.5\n")


def test_qdq701_not_in_common_and_needs_qdq(tmp_path):
    from qdq.engine.ruleset import load_target

    model = leaky(tmp_path, 0.1)
    assert [f for f in lint(model, load_target("common")).findings if f.code.startswith("QDQ7")] == []
    b = GraphBuilder()
    b.output(b.node("LeakyRelu", [b.input("x", [2])], ["y"], name="lrelu", alpha=0.1), [2])
    result = lint(load(b, tmp_path, "plain.onnx"), dpu_rules(tmp_path))
    assert result.findings == [] and result.notes


def test_qdq701_fix_sets_the_dpu_slope(tmp_path):
    b = GraphBuilder()
    xd = qdq_input(b, [4, 16])
    b.node("LeakyRelu", [xd], ["y"], name="lrelu", alpha=0.1)
    b.node("Identity", [xd], ["xd"], name="keep_xd")
    b.output("y", [4, 16])
    b.output("xd", [4, 16])
    path = b.save(tmp_path / "m.onnx")
    ruleset = dpu_rules(tmp_path)
    feeds = {"x": (np.random.default_rng(0).standard_normal((4, 16)) * 4).astype(np.float32)}
    y_before, xd_values = run_ort(path, feeds)

    model = load_model(path)
    changes = apply_fix(model, "QDQ701", ruleset)
    assert [(c.code, c.node, c.tensor, c.old, c.new) for c in changes] == [("QDQ701", "lrelu", None, 0.1, 0.1015625)]
    assert "26/256" in changes[0].description
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    (node,) = [n for n in onnx.load(str(out)).graph.node if n.op_type == "LeakyRelu"]
    assert helper.get_attribute_value(node.attribute[0]) == 0.1015625

    y_after, xd_after = run_ort(out, feeds)
    assert np.array_equal(xd_values, xd_after)
    negative = xd_values < 0
    assert negative.any() and (~negative).any()
    # Positive outputs are unchanged; negative ones are now x·26/256, i.e. they moved by the slope difference.
    assert np.array_equal(y_after[~negative], y_before[~negative])
    assert np.array_equal(y_after[negative], xd_values[negative] * np.float32(0.1015625))
    np.testing.assert_allclose(y_after - y_before, np.where(negative, xd_values * (0.1015625 - 0.1), 0), atol=1e-6)

    fixed = load_model(out)
    none(fixed, "QDQ701", ruleset)
    assert apply_fix(fixed, "QDQ701", ruleset) == []


def test_qdq701_fix_of_an_absent_alpha(tmp_path):
    model = leaky(tmp_path, None)
    changes = apply_fix(model, "QDQ701", dpu_rules(tmp_path))
    assert [(c.old, c.new) for c in changes] == [(0.01, 0.01171875)]
    (node,) = [n for n in model.graph.nodes if n.op == "LeakyRelu"]
    assert node.attrs["alpha"] == 0.01171875


def test_explain_qdq701(capsys):
    assert cli.main(["explain", "QDQ701"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("QDQ701 leaky-relu-slope") and "approximate fix" in out and "slope_denominator = 256" in out


# --- QDQ702 hard-sigmoid-dpu -------------------------------------------------------------------------


def hard_sigmoid(tmp_path: Path, alpha=1 / 6, beta=None, mul=None, via_constant_node=False, op="HardSigmoid") -> Model:
    b = GraphBuilder()
    attrs = {}
    if op == "HardSigmoid" and alpha is not None:
        attrs["alpha"] = alpha
    if beta is not None:
        attrs["beta"] = beta
    out = b.node(op, [qdq_input(b, [2, 8])], name="hsig", **attrs)
    if mul is not None:
        out = add_mul(b, out, mul, via_constant_node)
    b.output(out, [2, 8])
    return load(b, tmp_path)


@pytest.mark.parametrize("beta", [None, 0.5])
def test_qdq702_hard_sigmoid_without_the_dpu_mul(tmp_path, beta):
    f = one(hard_sigmoid(tmp_path, beta=beta), "QDQ702", dpu_rules(tmp_path))
    assert (f.node, f.severity, f.fix) == ("hsig", Severity.INFO, None)
    assert f.values["op"] == "HardSigmoid" and f.values["dpu_factor"] == HSIG_FACTOR
    assert "x·2731/16384 + 0.5 instead of x·0.1666667 + 0.5" in f.message
    assert "1.22e-04" in f.message and "Mul by 1.0001220703125" in f.message


@pytest.mark.parametrize("via_constant_node", [False, True])
def test_qdq702_hard_sigmoid_followed_by_the_dpu_mul_is_clean(tmp_path, via_constant_node):
    model = hard_sigmoid(tmp_path, mul=HSIG_FACTOR, via_constant_node=via_constant_node)
    none(model, "QDQ702", dpu_rules(tmp_path))


@pytest.mark.parametrize("value", [1.0, 1.0001, [HSIG_FACTOR, 1.0]])
def test_qdq702_mul_by_something_else(tmp_path, value):
    one(hard_sigmoid(tmp_path, mul=value), "QDQ702", dpu_rules(tmp_path))


def test_qdq702_mul_with_a_second_reader_still_reported(tmp_path):
    b = GraphBuilder()
    h = b.node("HardSigmoid", [qdq_input(b, [2, 8])], name="hsig", alpha=1 / 6)
    b.output(add_mul(b, h, HSIG_FACTOR), [2, 8])
    b.output(b.node("Relu", [h], ["z"], name="relu"), [2, 8])
    one(load(b, tmp_path), "QDQ702", dpu_rules(tmp_path))


@pytest.mark.parametrize(("alpha", "beta"), [(None, None), (0.2, 0.5), (1 / 6, 0.6), (0.1667, 0.5)])
def test_qdq702_other_hard_sigmoids_are_clean(tmp_path, alpha, beta):
    none(hard_sigmoid(tmp_path, alpha=alpha, beta=beta), "QDQ702", dpu_rules(tmp_path))


def test_qdq702_sigmoid_is_replaced_on_the_dpu(tmp_path):
    model = hard_sigmoid(tmp_path, op="Sigmoid")
    f = one(model, "QDQ702", dpu_rules(tmp_path))
    assert f.values["op"] == "Sigmoid"
    assert "replaces Sigmoid with HardSigmoid" in f.message and "1/(1 + e^-x)" in f.message
    # A Mul by the factor does not make a Sigmoid what the DPU computes.
    one(hard_sigmoid(tmp_path, op="Sigmoid", mul=HSIG_FACTOR), "QDQ702", dpu_rules(tmp_path))
    none(model, "QDQ702", dpu_rules_with(tmp_path, "QDQ702", "sigmoid_replaced = false\n"))


def test_qdq702_parameters_from_the_rules_file(tmp_path):
    # Another generation: HardSigmoid(0.2) computed with a factor of 1.25.
    ruleset = dpu_rules_with(tmp_path, "QDQ702", "alpha = 0.2\ndpu_factor = 1.25\n")
    f = one(hard_sigmoid(tmp_path, alpha=0.2), "QDQ702", ruleset)
    assert "x·1/4 + 0.5" in f.message
    none(hard_sigmoid(tmp_path, alpha=0.2, mul=1.25), "QDQ702", ruleset)
    none(hard_sigmoid(tmp_path), "QDQ702", ruleset)


# --- QDQ703 avgpool-dpu-multiplier -------------------------------------------------------------------

FACTORS = [
    ((3, 3), 0.984375, (7, 6)),
    ((5, 5), 0.9765625, (10, 8)),
    ((6, 6), 0.984375, (7, 8)),
    ((7, 7), 1.0048828125, (21, 10)),
    ((14, 14), 1.0048828125, (21, 12)),
]


@pytest.mark.parametrize(("kernel", "factor", "multiplier"), FACTORS)
def test_dpu_avgpool_factor_table(kernel, factor, multiplier):
    area = kernel[0] * kernel[1]
    assert dpu_avgpool_factor(area) == factor
    assert dpu_avgpool_multiplier(area) == multiplier
    k, n = multiplier
    assert factor == area * k / 2**n


@pytest.mark.parametrize("area", [1, 2, 4, 8, 16, 64, 256, 1024, 65536])
def test_dpu_avgpool_factor_of_a_power_of_two_is_one(area):
    assert dpu_avgpool_factor(area) == 1.0


def test_dpu_avgpool_factor_search():
    # The plain search (no table) matches 7×7 and 14×14 but not the hard-coded 3×3, 5×5, 6×6.
    assert [dpu_avgpool_factor(a, table=[]) for a in (9, 25, 36, 49, 196)] == [
        9 * 57 / 512, 25 * 41 / 1024, 36 * 57 / 2048, 1.0048828125, 1.0048828125,
    ]
    # Areas outside the table: the first n with the smallest error.
    assert dpu_avgpool_multiplier(100) == (41, 12)
    assert dpu_avgpool_multiplier(15) == (17, 8)  # n < 11; 68/1024 ties with 17/256, the first wins
    assert dpu_avgpool_multiplier(15, search_bits=4) == (9, 7)
    assert dpu_avgpool_multiplier(3, search_bits=0) == (1, 1)  # n in range(0, 2): 1/2 beats 0/1 and 1/1
    assert dpu_avgpool_factor(12) == 12 * dpu_avgpool_multiplier(12)[0] / 2 ** dpu_avgpool_multiplier(12)[1]
    with pytest.raises(ValueError):
        dpu_avgpool_factor(0)


def test_dpu_avgpool_factor_reproduces_the_dpu_mean():
    # The DPU's integer mean sum·k/2^n is the float mean times the factor.
    window = np.arange(49, dtype=np.float64)
    k, n = dpu_avgpool_multiplier(49)
    assert window.sum() * k / 2**n == pytest.approx(window.mean() * dpu_avgpool_factor(49), rel=1e-15)


def avgpool(tmp_path: Path, kernel, mul=None, size=None) -> Model:
    b = GraphBuilder()
    size = size or [max(kernel[0], 1), max(kernel[1], 1)]
    x = qdq_input(b, [1, 2, *size])
    out = b.node("AveragePool", [x], name="pool", kernel_shape=list(kernel))
    if mul is not None:
        out = add_mul(b, out, mul)
    b.output(out, [1, 2, size[0] - kernel[0] + 1, size[1] - kernel[1] + 1])
    return load(b, tmp_path)


def gap(tmp_path: Path, shape, mul=None, direct: bool = False) -> Model:
    """GlobalAveragePool over `shape`: reading the graph input directly, or behind a Q/DQ pair
    (whose output has no stored shape, so the rule infers it)."""
    b = GraphBuilder()
    if direct:
        x = b.input("x", shape)
        b.output(b.qdq(b.input("other", [2]), name="other"), [2])
    else:
        x = qdq_input(b, shape)
    out = b.node("GlobalAveragePool", [x], name="gap")
    if mul is not None:
        out = add_mul(b, out, mul)
    b.output(out, [shape[0], shape[1], 1, 1])
    return load(b, tmp_path)


@pytest.mark.parametrize(("kernel", "factor", "multiplier"), FACTORS)
def test_qdq703_average_pool(tmp_path, kernel, factor, multiplier):
    f = one(avgpool(tmp_path, kernel), "QDQ703", dpu_rules(tmp_path))
    assert (f.node, f.severity, f.fix) == ("pool", Severity.WARNING, None)
    assert f.values == {"op": "AveragePool", "kernel": list(kernel), "factor": factor,
                        "k": multiplier[0], "shift": multiplier[1], "detail": ""}
    assert f"sum·{multiplier[0]}/2^{multiplier[1]}" in f.message and f"{factor:.10g}" in f.message


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize(("kernel", "factor", "multiplier"), FACTORS)
def test_qdq703_global_average_pool(tmp_path, kernel, factor, multiplier, direct):
    f = one(gap(tmp_path, [1, 3, *kernel], direct=direct), "QDQ703", dpu_rules(tmp_path))
    assert (f.node, f.values["op"]) == ("gap", "GlobalAveragePool")
    assert (f.values["kernel"], f.values["factor"]) == (list(kernel), factor)


@pytest.mark.parametrize("kernel", [(2, 2), (4, 4), (1, 1), (2, 8), (16, 16)])
def test_qdq703_power_of_two_area_is_clean(tmp_path, kernel):
    none(avgpool(tmp_path, kernel), "QDQ703", dpu_rules(tmp_path))
    none(gap(tmp_path, [1, 3, *kernel]), "QDQ703", dpu_rules(tmp_path))


@pytest.mark.parametrize("kernel", [(256, 3), (3, 256), (300, 300)])
def test_qdq703_kernel_side_above_255_is_not_rescaled(tmp_path, kernel):
    none(gap(tmp_path, [1, 1, *kernel], direct=True), "QDQ703", dpu_rules(tmp_path))
    one(gap(tmp_path, [1, 1, *kernel], direct=True), "QDQ703", dpu_rules_with(tmp_path, "QDQ703", "max_kernel = 300\n"))


@pytest.mark.parametrize("via_constant_node", [False, True])
@pytest.mark.parametrize(("kernel", "factor", "multiplier"), FACTORS)
def test_qdq703_followed_by_the_dpu_mul_is_clean(tmp_path, kernel, factor, multiplier, via_constant_node):
    b = GraphBuilder()
    out = b.node("GlobalAveragePool", [qdq_input(b, [1, 3, *kernel])], name="gap")
    b.output(add_mul(b, out, factor, via_constant_node), [1, 3, 1, 1])
    none(load(b, tmp_path), "QDQ703", dpu_rules(tmp_path))
    none(avgpool(tmp_path, kernel, mul=factor), "QDQ703", dpu_rules(tmp_path))


@pytest.mark.parametrize("value", [1.0, 0.984375 * (1 + 1e-7), 1.0048828125])
def test_qdq703_mul_by_something_else(tmp_path, value):
    f = one(avgpool(tmp_path, (3, 3), mul=value), "QDQ703", dpu_rules(tmp_path))
    assert f.values["factor"] == 0.984375


def test_qdq703_mul_by_the_factor_in_float16_is_clean(tmp_path):
    # 1.0048828125 = 1029/1024 is not a float16 (11 significant bits): equal in the constant's own type is enough.
    b = GraphBuilder()
    x = b.node("Cast", [qdq_input(b, [1, 3, 7, 7])], name="to_half", to=TensorProto.FLOAT16)
    out = b.node("GlobalAveragePool", [x], name="gap")
    b.node("Mul", [out, b.init("f", np.asarray(1.0048828125, np.float16))], ["y"], name="mul")
    b.output("y", [1, 3, 1, 1], TensorProto.FLOAT16)
    none(load(b, tmp_path), "QDQ703", dpu_rules(tmp_path))


def test_qdq703_pool_with_another_reader_or_as_graph_output(tmp_path):
    b = GraphBuilder()
    out = b.node("AveragePool", [qdq_input(b, [1, 2, 3, 3])], name="pool", kernel_shape=[3, 3])
    b.output(add_mul(b, out, 0.984375), [1, 2, 1, 1])
    b.output(out, [1, 2, 1, 1])
    f = one(load(b, tmp_path), "QDQ703", dpu_rules(tmp_path))
    assert f.tensors == ("in_dq_out", "pool_out")


def test_qdq703_non_square_kernel(tmp_path):
    f = one(avgpool(tmp_path, (3, 5)), "QDQ703", dpu_rules(tmp_path))
    assert f.values["kernel"] == [3, 5] and f.values["factor"] == dpu_avgpool_factor(15) == 15 * 17 / 256
    assert "non-square" in f.message and "area 15" in f.message


@pytest.mark.parametrize("shape", [["N", 3, "H", "W"], [1, 3, "H", 7], [1, 3, 7]])
def test_qdq703_global_pool_of_unknown_or_non_2d_kernel_is_skipped(tmp_path, shape):
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.qdq(b.input("other", [2]), name="other"), [2])
    b.output(b.node("GlobalAveragePool", [x], name="gap"), ["N", 3, 1, 1][: len(shape)])
    none(load(b, tmp_path), "QDQ703", dpu_rules(tmp_path))


def test_qdq703_global_pool_shape_from_shape_inference(tmp_path):
    # The GAP reads a Conv output: no stored shape; shape inference finds 7×7.
    b = GraphBuilder()
    x = qdq_input(b, [1, 3, 9, 9])
    w = b.weight("w", np.ones((4, 3, 3, 3), np.float32) * 0.1)
    conv = b.node("Conv", [x, w], name="conv")
    b.output(b.node("GlobalAveragePool", [conv], name="gap"), [1, 4, 1, 1])
    f = one(load(b, tmp_path), "QDQ703", dpu_rules(tmp_path))
    assert f.values["kernel"] == [7, 7]


def test_qdq703_parameters_from_the_rules_file(tmp_path):
    model_gap = gap(tmp_path, [1, 3, 3, 3])
    none(model_gap, "QDQ703", dpu_rules_with(tmp_path, "QDQ703", 'ops = ["AveragePool"]\n'))
    # Without the table, 3×3 is searched: 57/512.
    f = one(model_gap, "QDQ703", dpu_rules_with(tmp_path, "QDQ703", "table = []\n"))
    assert (f.values["k"], f.values["shift"], f.values["factor"]) == (57, 9, 1.001953125)
    f = one(model_gap, "QDQ703", dpu_rules_with(tmp_path, "QDQ703", "table = [[9, 57, 9]]\nsearch_bits = 3\n"))
    assert f.values["factor"] == 1.001953125
    with pytest.raises(RuleSetError, match="search_bits must be a non-negative integer"):
        lint(model_gap, dpu_rules_with(tmp_path, "QDQ703", "search_bits = -1\n"))
    with pytest.raises(RuleSetError, match=r"table rows must be \[area, k, n\]"):
        lint(model_gap, dpu_rules_with(tmp_path, "QDQ703", "table = [[9, 7]]\n"))


# --- all three ---------------------------------------------------------------------------------------


def test_dpu_rules_metadata():
    registry = all_rules()
    assert [(registry[c].name, registry[c].severity, registry[c].fix_safety) for c in DPU_CODES] == [
        ("leaky-relu-slope", Severity.WARNING, FixSafety.APPROXIMATE),
        ("hard-sigmoid-dpu", Severity.INFO, None),
        ("avgpool-dpu-multiplier", Severity.WARNING, None),
    ]
    # The DPU's constants live in rules/npu.toml; the rules' defaults are placeholders.
    assert NPU["QDQ703"]["table"] == AMD_TABLE and registry["QDQ703"].parameters["table"] == []
    assert NPU["QDQ701"]["slope_denominator"] == 256 and NPU["QDQ702"]["dpu_factor"] == HSIG_FACTOR


def test_a_dpu_rule_without_its_constants_says_where_they_come_from(tmp_path):
    path = tmp_path / "bare.toml"
    path.write_text('extends = "common"\n[rules.QDQ702]\n')
    b = GraphBuilder()
    b.output(b.node("Sigmoid", [qdq_input(b, [1, 2])], name="sig"), [1, 2])
    with pytest.raises(RuleSetError, match="QDQ702.alpha must be a positive number.*rules/npu.toml"):
        lint(load(b, tmp_path), load_rules_file(path))


def test_one_model_with_all_three_through_the_command_line(tmp_path, capsys):
    b = GraphBuilder()
    x = qdq_input(b, [1, 2, 7, 7])
    h = b.node("LeakyRelu", [x], name="lrelu", alpha=0.1)
    h = b.node("Sigmoid", [h], name="sig")
    b.output(b.node("GlobalAveragePool", [h], name="gap"), [1, 2, 1, 1])
    path = b.save(tmp_path / "m.onnx")
    rules = tmp_path / "dpu.toml"
    rules.write_text('extends = "common"\n' + dpu_tables())
    code = cli.main(["lint", str(path), "--rules", str(rules), "--format", "json", "--isolated"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert sorted((f["code"], f["node"]) for f in data["findings"]) == [
        ("QDQ701", "lrelu"), ("QDQ702", "sig"), ("QDQ703", "gap"),
    ]
