"""The onnxruntime CPU rules (QDQ505-507, QDQ804-805) and the `ort` rule set.

Each rule gets a tiny hand-built graph that breaks it and the nearest graph that does not,
linted with the `ort` set narrowed to the rule. Fixes run through the fix driver. Exact fixes
must give bit-identical outputs in onnxruntime with graph optimisations off; approximate ones
stay within the bound their change report states. Where a rule exists to make onnxruntime fuse
a node unit, the test counts the QLinear ops in onnxruntime's own optimised graph
(ORT_ENABLE_ALL, `optimized_model_filepath`). The last section exports a small PyTorch FX QAT
model and checks the whole set on it (../shared/reference/onnxruntime-cpu-qdq.md §9).
"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from optional import torch_or_skip
from builders import GraphBuilder
from conftest import run_optimized, run_ort, saturation_not_shown
from onnx import numpy_helper

from qdq.checks.weight_type import _pairs_onto_bound, nearest_safe_weights
from qdq.engine.fix import fix
from qdq.engine.lint import lint
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import load_rules_file, load_target
from qdq.graph.model import Model, load_model, save_model
from qdq.rewrite.rule import FixSafety
from qdq.support.errors import RuleSetError

ORT = load_target("ort")


# --- building blocks ------------------------------------------------------------------------------


def f32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def act(b: GraphBuilder, x: str, name: str, scale=0.05, zp=0, dtype=np.int8) -> str:
    """`{name}_q` → `{name}_dq` sharing 0-d `{name}_scale` and `{name}_zp`; the integers are `{name}_int`."""
    params = [b.init(f"{name}_scale", f32(scale)), b.init(f"{name}_zp", np.asarray(zp, dtype))]
    xq = b.node("QuantizeLinear", [x, *params], [f"{name}_int"], name=f"{name}_q")
    return b.node("DequantizeLinear", [xq, *params], [f"{name}_deq"], name=f"{name}_dq")


def conv_weight(b: GraphBuilder, name: str, shape, scale=0.02, axis: int | None = None) -> str:
    """A stored int8 weight `{name}_int` read by DequantizeLinear `{name}_dq` (per-axis with `axis`)."""
    values = (np.arange(int(np.prod(shape))) % 200 - 100).reshape(shape)
    scale = f32(scale)
    zp = np.zeros(scale.shape, np.int8)
    inputs = [b.init(f"{name}_int", values.astype(np.int8)), b.init(f"{name}_scale", scale), b.init(f"{name}_zp", zp)]
    attrs = {"axis": axis} if axis is not None else {}
    return b.node("DequantizeLinear", inputs, [f"{name}_deq"], name=f"{name}_dq", **attrs)


def load(b: GraphBuilder, tmp_path: Path, name: str = "model.onnx") -> Model:
    return load_model(b.save(tmp_path / name))


def found(model: Model, code: str, ruleset=ORT) -> list:
    return [f for f in lint(model, ruleset.narrowed(select=[code])).findings]


def fix_rule(model: Model, code: str, tmp_path: Path, ruleset=ORT, name: str = "fixed.onnx"):
    """Fix one rule through the driver; the saved file passes the full checker. Returns (changes, path)."""
    changes = fix(model, ruleset.narrowed(select=[code])).changes
    path = tmp_path / name
    save_model(model, path)
    onnx.checker.check_model(str(path), full_check=True)
    return changes, path


def with_params(code: str, tmp_path: Path, text: str):
    """The ort set with extra TOML for one rule."""
    path = tmp_path / "rules.toml"
    path.write_text(f'extends = "ort"\n[rules.{code}]\n{text}\n')
    return load_rules_file(path)


def optimized_ops(path: Path) -> Counter:
    """The op counts of onnxruntime's fully optimised graph (what actually runs)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(path.with_suffix(".optimized.onnx"))
    options.log_severity_level = 3  # the "hardware specific optimizations" notice
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def node_params(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The scale and zero-point constants a Q/DQ node of a saved model reads."""
    graph = onnx.load(str(path)).graph
    inits = initializers(path)
    node = next(n for n in graph.node if n.name == name)
    return inits[node.input[1]], inits[node.input[2]]


def rand(*shape, seed=0, scale=1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def test_ort_set_rules_and_fix_order():
    enabled = sorted(c for c, cfg in ORT.rules.items() if cfg.enabled)
    assert {"QDQ505", "QDQ506", "QDQ507", "QDQ804", "QDQ805"} <= set(enabled)
    assert "QDQ503" not in enabled and "QDQ504" not in enabled and "QDQ401" not in enabled
    assert str(ORT.rules["QDQ201"].severity) == "error"
    order = [rule.code for rule, _ in ORT.fix_sequence()]
    artefacts = [i for i, c in enumerate(order) if c.startswith("QDQ2")]
    assert max(artefacts) < order.index("QDQ505") < order.index("QDQ507") < order.index("QDQ804")
    assert order.index("QDQ804") < order.index("QDQ805") < order.index("QDQ402")
    exact = {rule.code for rule, _ in ORT.fix_sequence() if rule.fix_safety == FixSafety.EXACT}
    assert "QDQ505" in exact and not exact & {"QDQ506", "QDQ507", "QDQ804", "QDQ805"}


# --- QDQ505 activation-type -----------------------------------------------------------------------


def int8_fan_out(zp: int = 0, dtype=np.int8) -> GraphBuilder:
    """x → Q(int8) → DQ → {Relu, Neg}: a Q with two DQ readers, which onnxruntime cannot convert itself."""
    b = GraphBuilder()
    x = b.input("x", [2, 8])
    params = [b.init("a_scale", f32(0.05)), b.init("a_zp", np.asarray(zp, dtype))]
    xq = b.node("QuantizeLinear", [x, *params], ["a_int"], name="a_q")
    first = b.node("DequantizeLinear", [xq, *params], ["a_deq1"], name="a_dq1")
    second = b.node("DequantizeLinear", [xq, *params], ["a_deq2"], name="a_dq2")
    b.output(b.node("Relu", [first], ["y1"], name="relu"), [2, 8])
    b.output(b.node("Neg", [second], ["y2"], name="neg"), [2, 8])
    return b


@pytest.mark.parametrize(("zp", "new_zp"), [(0, 128), (-5, 123), (127, 255)])
def test_qdq505_int8_becomes_uint8_bit_exactly(tmp_path, zp, new_zp):
    model = load(int8_fan_out(zp), tmp_path)
    [finding] = found(model, "QDQ505")
    assert finding.fix == FixSafety.EXACT and finding.values["dtype"] == "int8"
    changes, path = fix_rule(model, "QDQ505", tmp_path)
    assert len(changes) == 1 and changes[0].old.startswith("int8") and changes[0].new.startswith("uint8")
    for node in ("a_q", "a_dq1", "a_dq2"):
        scale, zero_point = node_params(path, node)
        assert zero_point.dtype == np.uint8 and zero_point.shape == () and int(zero_point) == new_zp
        assert scale == np.float32(0.05)
    # Values across and beyond both ends of the grid, and exact half steps (round half to even).
    x = np.concatenate([rand(1, 8, scale=10.0), np.arange(-4, 4, dtype=np.float32).reshape(1, 8) * 0.025])
    before, after = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert found(load_model(path), "QDQ505") == []


def test_qdq505_int8_preference_turns_uint8_into_int8(tmp_path):
    model = load(int8_fan_out(128, np.uint8), tmp_path)
    ruleset = with_params("QDQ505", tmp_path, 'activation_type = "int8"')
    assert found(model, "QDQ505") == []  # ort wants uint8: already so
    changes, path = fix_rule(model, "QDQ505", tmp_path, ruleset)
    assert len(changes) == 1
    assert int(node_params(path, "a_q")[1]) == 0 and node_params(path, "a_q")[1].dtype == np.int8
    x = rand(2, 8, scale=10.0)
    assert all(np.array_equal(a, b) for a, b in zip(run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})))


def test_qdq505_no_preference_and_weights_are_left_alone(tmp_path):
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "in", zp=128, dtype=np.uint8)
    conv = b.node("Conv", [x, conv_weight(b, "w", (3, 2, 1, 1))], ["c"], name="conv")
    b.output(act(b, conv, "out", zp=128, dtype=np.uint8), [1, 3, 4, 4])
    model = load(b, tmp_path)
    assert found(model, "QDQ505") == []  # the int8 weight is not an activation
    assert found(load(int8_fan_out(), tmp_path, "m2.onnx"), "QDQ505", with_params("QDQ505", tmp_path, 'activation_type = ""')) == []


def test_qdq505_values_it_cannot_rewrite(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [4])
    # Q output is a graph output: its type is the model's interface.
    params = [b.init("o_scale", f32(0.1)), b.init("o_zp", np.asarray(0, np.int8))]
    b.output(b.node("QuantizeLinear", [x, *params], ["out_int"], name="o_q"), [4])
    # Q → Cast(to=INT8) → DQ: the Cast would convert the new uint8 back.
    cast_params = [b.init("c_scale", f32(0.1)), b.init("c_zp", np.asarray(0, np.int8))]
    xq = b.node("QuantizeLinear", [x, *cast_params], ["c_int"], name="c_q")
    cast = b.node("Cast", [xq], ["c_cast"], name="cast", to=onnx.TensorProto.INT8)
    b.output(b.node("DequantizeLinear", [cast, *cast_params], ["c_deq"], name="c_dq"), [4])
    findings = {f.node: f for f in found(load(b, tmp_path), "QDQ505")}
    assert set(findings) == {"o_q", "c_q"}
    assert all(f.fix is None for f in findings.values())
    assert "graph output" in findings["o_q"].message and "Cast" in findings["c_q"].message


def test_qdq505_rewrites_stored_integers_into_a_new_constant(tmp_path):
    b = GraphBuilder()
    x = act(b, b.input("x", [4]), "x", zp=128, dtype=np.uint8)
    # Stored int8 integers that no op reads as a weight (an activation constant), shared by two DQs.
    params = [b.init("k_scale", f32(0.1)), b.init("k_zp", np.asarray(0, np.int8))]
    stored = b.init("k_int", np.arange(-2, 2, dtype=np.int8))
    first = b.node("DequantizeLinear", [stored, *params], ["k_deq"], name="k_dq")
    second = b.node("DequantizeLinear", [stored, *params], ["k_deq2"], name="k_dq2")
    total = b.node("Add", [b.node("Add", [x, first], ["sum"], name="add"), second], ["sum2"], name="add2")
    b.output(act(b, total, "out", zp=128, dtype=np.uint8), [4])
    model = load(b, tmp_path)
    [finding] = found(model, "QDQ505")
    assert finding.fix is not None and finding.tensors == ("k_int",)
    changes, path = fix_rule(model, "QDQ505", tmp_path)
    assert [c.tensor for c in changes] == ["k_int"]
    written = onnx.load(str(path)).graph
    values = {t.name: numpy_helper.to_array(t) for t in written.initializer}
    dequantizes = [n for n in written.node if n.op_type == "DequantizeLinear" and n.name in ("k_dq", "k_dq2")]
    assert len({n.input[0] for n in dequantizes}) == 1  # still one constant for both
    assert np.array_equal(values[dequantizes[0].input[0]], np.arange(126, 130, dtype=np.uint8))
    feeds = {"x": np.linspace(-1, 1, 4, dtype=np.float32)}
    assert np.array_equal(run_ort(tmp_path / "model.onnx", feeds)[0], run_ort(path, feeds)[0])


def test_qdq505_lets_onnxruntime_fuse_the_bias_adds_of_its_own_ptq_transformer(tmp_path):
    """onnxruntime's quantize_static stores the bias of each MatMul → Add as int8 beside uint8
    activations, so none of those Adds fuses; with the constants rewritten every Add does."""
    source = tmp_path / "transformer_default.onnx"  # a copy: optimized_ops writes beside its model
    shutil.copy(Path(__file__).resolve().parent / "corpus" / "ort" / "transformer_default.onnx", source)
    before = optimized_ops(source)
    assert before["Add"] > 0 and before["QLinearAdd"] == 0
    model = load_model(source)
    changes, path = fix_rule(model, "QDQ505", tmp_path)
    assert any(c.tensor in {t.name for t in onnx.load(str(source)).graph.initializer} for c in changes)
    after = optimized_ops(path)
    assert after["Add"] == 0 and after["QLinearAdd"] == before["Add"]
    data = np.random.default_rng(0).standard_normal([2, 3, 32, 32]).astype(np.float32)
    name = onnx.load(str(source)).graph.input[0].name
    assert all(np.array_equal(a, b) for a, b in zip(run_ort(source, {name: data}), run_ort(path, {name: data})))


def test_qdq505_rejects_an_unknown_type(tmp_path):
    with pytest.raises(RuleSetError, match="activation_type"):
        found(load(int8_fan_out(), tmp_path), "QDQ505", with_params("QDQ505", tmp_path, 'activation_type = "int16"'))


# --- QDQ506 weight-axis ---------------------------------------------------------------------------


def weighted(op: str, shape, axis: int, **attrs) -> GraphBuilder:
    """A per-axis int8 weight (scales 0.01, 0.02, ... along `axis`) read by one `op`."""
    b = GraphBuilder()
    scales = 0.01 * (1 + np.arange(shape[axis]))
    w = conv_weight(b, "w", shape, scale=scales, axis=axis)
    if op in ("Conv", "ConvTranspose"):
        x = act(b, b.input("x", [1, shape[1] if op == "Conv" else shape[0], 4, 4]), "in")
        out_shape = [1, shape[0] if op == "Conv" else shape[1], 4, 4]
    else:
        inner, outer = (shape[1], shape[0]) if op == "Gemm" and attrs.get("transB") else shape
        x = act(b, b.input("x", [2, inner]), "in")
        out_shape = [2, outer]
    b.output(b.node(op, [x, w], ["y"], name="op", **attrs), out_shape)
    return b


@pytest.mark.parametrize(("op", "shape", "good", "bad", "attrs"), [
    ("Conv", (4, 3, 1, 1), 0, 1, {}),
    ("ConvTranspose", (3, 4, 1, 1), 1, 0, {}),
    ("Gemm", (4, 3), 0, 1, {"transB": 1}),
    ("Gemm", (3, 4), 1, 0, {}),
    ("MatMul", (3, 4), 1, 0, {}),
])
def test_qdq506_output_channel_axis(tmp_path, op, shape, good, bad, attrs):
    assert found(load(weighted(op, shape, good, **attrs), tmp_path, "good.onnx"), "QDQ506") == []
    [finding] = found(load(weighted(op, shape, bad, **attrs), tmp_path, "bad.onnx"), "QDQ506")
    assert (finding.values["axis"], finding.values["expected"]) == (bad, good)


def test_qdq506_fix_takes_the_largest_scale_and_saturates_nothing(tmp_path):
    model = load(weighted("Conv", (4, 3, 1, 1), 1), tmp_path)
    old = initializers(tmp_path / "model.onnx")
    changes, path = fix_rule(model, "QDQ506", tmp_path)
    assert [c.code for c in changes] == ["QDQ506"] and changes[0].values["saturated"] == 0
    scale, zero_point = node_params(path, "w_dq")
    assert scale.shape == () and scale == np.float32(0.03)
    graph = onnx.load(str(path)).graph
    new_q = initializers(path)[next(n for n in graph.node if n.name == "w_dq").input[0]]
    real_old = old["w_int"].astype(np.float64) * old["w_scale"].reshape(1, 3, 1, 1)
    assert np.all(np.abs(new_q * float(scale) - real_old) <= float(scale) / 2 + 1e-9)
    assert found(load_model(path), "QDQ506") == []


# --- QDQ507 clipped-zero-point --------------------------------------------------------------------


def relu_pool(zp=128, dtype=np.uint8, pool_scale=0.05, activation="Relu", clip_min=0.0) -> GraphBuilder:
    """x → DQ-free Relu → Q(zp) → DQ → MaxPool → Q → DQ → y."""
    b = GraphBuilder()
    x = b.input("x", [1, 1, 4, 4])
    if activation == "Relu":
        r = b.node("Relu", [x], ["r"], name="relu")
    else:
        r = b.node("Clip", [x, b.init("lo", f32(clip_min)), b.init("hi", f32(100.0))], ["r"], name="clip")
    a = act(b, r, "a", 0.05, zp, dtype)
    pool = b.node("MaxPool", [a], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    b.output(act(b, pool, "b", pool_scale, zp, dtype), [1, 1, 2, 2])
    return b


def test_qdq507_moves_the_zero_point_and_the_pool_output_with_it(tmp_path):
    model = load(relu_pool(), tmp_path)
    [finding] = found(model, "QDQ507")
    assert finding.values["zero_point"] == 128 and finding.values["expected"] == 0
    assert set(finding.tensors) == {"r", "p"}  # the MaxPool output shares the parameters
    changes, path = fix_rule(model, "QDQ507", tmp_path)
    assert len(changes) == 2
    assert all(c.values["old_max"] == pytest.approx(127 * 0.05) and c.values["new_max"] == pytest.approx(255 * 0.05)
               for c in changes)
    assert "only values the old grid saturated" in changes[0].description
    for node in ("a_q", "a_dq", "b_q", "b_dq"):
        scale, zero_point = node_params(path, node)
        assert int(zero_point) == 0 and zero_point.dtype == np.uint8 and scale == np.float32(0.05)
    # Below the old maximum nothing moves; above it the new grid represents what the old one clipped.
    x = np.linspace(-3, 12, 16, dtype=np.float32).reshape(1, 1, 4, 4)
    (before,), (after,) = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    saturated = before >= np.float32(127 * 0.05)
    assert np.array_equal(before[~saturated], after[~saturated]) and saturated.any()
    assert np.all(after[saturated] > before[saturated])
    assert found(load_model(path), "QDQ507") == []


@pytest.mark.parametrize(("zp", "dtype", "activation", "clip_min", "expected"), [
    (0, np.uint8, "Relu", 0.0, False),      # already at the minimum
    (-128, np.int8, "Relu", 0.0, False),
    (0, np.int8, "Relu", 0.0, True),        # int8 symmetric: -128 is the minimum
    (128, np.uint8, "Clip", 0.0, True),
    (128, np.uint8, "Clip", 0.02, True),    # rounds to step 0 on a 0.05 grid
    (128, np.uint8, "Clip", 0.5, True),     # not absorbed, but never below 0.5: zp 0 loses nothing
])
def test_qdq507_when_it_applies(tmp_path, zp, dtype, activation, clip_min, expected):
    model = load(relu_pool(zp, dtype, activation=activation, clip_min=clip_min), tmp_path)
    assert bool(found(model, "QDQ507")) == expected


def test_qdq507_leaves_a_differently_quantized_pool_output_to_qdq402(tmp_path):
    """The pool output has its own scale: QDQ507 moves both values (a MaxPool of values never below 0 is never
    below 0), each with its own scale; QDQ402 aligns them, the driver settles."""
    model = load(relu_pool(pool_scale=0.1), tmp_path)
    assert [f.tensors for f in found(model, "QDQ507")] == [("r",), ("p",)]
    result = fix(model, ORT)
    assert result.converged and not [f for f in result.result.findings if f.code in ("QDQ402", "QDQ507")]
    path = tmp_path / "fixed.onnx"
    save_model(model, path)
    params = [node_params(path, n) for n in ("a_q", "a_dq", "b_q", "b_dq")]
    assert all(int(zp) == 0 and scale == np.float32(0.1) for scale, zp in params)  # the coarser scale, zp 0
    assert set(result.by_rule()) >= {"QDQ402", "QDQ507"}


def test_qdq507_through_parameter(tmp_path):
    model = load(relu_pool(), tmp_path)
    # Without MaxPool in `through` the pool output is not moved with the Relu value but on its own bound.
    findings = found(model, "QDQ507", with_params("QDQ507", tmp_path, "through = []"))
    assert [f.tensors for f in findings] == [("r",), ("p",)]


def test_qdq507_with_qdq402_in_the_full_ort_fix(tmp_path):
    model = load(relu_pool(zp=0, dtype=np.int8), tmp_path)
    result = fix(model, ORT)
    assert result.converged and result.result.findings == []
    assert result.by_rule() == {"QDQ505": 2, "QDQ507": 2}
    path = tmp_path / "fixed.onnx"
    save_model(model, path)
    assert all(int(node_params(path, n)[1]) == 0 and node_params(path, n)[1].dtype == np.uint8
               for n in ("a_q", "a_dq", "b_q", "b_dq"))


# --- QDQ804 float-output ------------------------------------------------------------------------------


def conv_with_side_consumer(quantized_output: bool = True, graph_output: bool = False) -> GraphBuilder:
    """DQ → Conv → {Q → DQ → y, Abs → side}: the Abs reads the conv output in float."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "in", zp=128, dtype=np.uint8)
    conv = b.node("Conv", [x, conv_weight(b, "w", (3, 2, 1, 1))], ["c"], name="conv")
    if quantized_output:
        b.output(act(b, conv, "out", 0.1, 128, np.uint8), [1, 3, 4, 4])
    if graph_output:
        b.output(conv, [1, 3, 4, 4])
    else:
        b.output(b.node("Abs", [conv], ["side"], name="abs"), [1, 3, 4, 4])
    return b


def test_qdq804_routes_the_float_consumer_through_the_existing_q(tmp_path):
    model = load(conv_with_side_consumer(), tmp_path)
    [finding] = found(model, "QDQ804")
    assert finding.node == "conv" and "abs" in finding.message and finding.fix == FixSafety.APPROXIMATE
    assert optimized_ops(tmp_path / "model.onnx")["QLinearConv"] == 0
    changes, path = fix_rule(model, "QDQ804", tmp_path)
    assert len(changes) == 1 and changes[0].node == "abs"
    graph = onnx.load(str(path)).graph
    abs_input = next(n for n in graph.node if n.name == "abs").input[0]
    assert abs_input == "out_deq"  # the existing DQ, reused
    assert optimized_ops(path)["QLinearConv"] == 1
    x = rand(1, 2, 4, 4)
    (y0, side0), (y1, side1) = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    assert np.array_equal(y0, y1)
    assert np.max(np.abs(side1 - side0)) <= 0.1 / 2 + 1e-6  # rounded to the output's grid (nothing clips here)
    assert found(load_model(path), "QDQ804") == []


def test_qdq804_creates_a_dq_when_the_q_has_none(tmp_path):
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "in", zp=128, dtype=np.uint8)
    conv = b.node("Conv", [x, conv_weight(b, "w", (3, 2, 1, 1))], ["c"], name="conv")
    params = [b.init("o_scale", f32(0.1)), b.init("o_zp", np.asarray(128, np.uint8))]
    b.output(b.node("QuantizeLinear", [conv, *params], ["c_int"], name="o_q"), [1, 3, 4, 4], onnx.TensorProto.UINT8)
    b.output(b.node("Abs", [conv], ["side"], name="abs"), [1, 3, 4, 4])
    changes, path = fix_rule(load(b, tmp_path), "QDQ804", tmp_path)
    graph = onnx.load(str(path)).graph
    [dq] = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "c_int"]
    assert next(n for n in graph.node if n.name == "abs").input[0] == dq.output[0]


def test_qdq804_without_a_q_or_at_a_graph_output_is_not_fixable(tmp_path):
    [no_q] = found(load(conv_with_side_consumer(quantized_output=False), tmp_path, "a.onnx"), "QDQ804")
    assert no_q.fix is None and "needs data" in no_q.message
    [output] = found(load(conv_with_side_consumer(graph_output=True), tmp_path, "b.onnx"), "QDQ804")
    assert output.fix is None and "graph output" in output.message


def upsampled_conv(mode: str) -> GraphBuilder:
    """DQ → Conv → Resize(2×, `mode`) → Q → DQ → y: the conv output reaches a Q only through the Resize."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "in", zp=128, dtype=np.uint8)
    conv = b.node("Conv", [x, conv_weight(b, "w", (3, 2, 1, 1))], ["c"], name="conv")
    up = b.node("Resize", [conv, "", b.init("scales", f32([1, 1, 2, 2]))], ["up"], name="up", mode=mode)
    b.output(act(b, up, "out", 0.1, 128, np.uint8), [1, 3, 8, 8])
    return b


def test_qdq804_gives_an_output_the_grid_of_the_q_after_a_nearest_resize(tmp_path):
    """Quantizing before a nearest Resize on the grid of the Q after it changes no integer: data-free and exact."""
    model = load(upsampled_conv("nearest"), tmp_path)
    [finding] = found(model, "QDQ804")
    assert finding.fix is not None and "out_q" in finding.message
    changes, path = fix_rule(model, "QDQ804", tmp_path)
    assert [c.code for c in changes] == ["QDQ804"] and optimized_ops(path)["QLinearConv"] == 1
    x = rand(1, 2, 4, 4)
    (before,), (after,) = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    assert np.array_equal(before, after)
    # A linear Resize mixes values: the grid after it says nothing certain about the values before it.
    [linear] = found(load(upsampled_conv("linear"), tmp_path, "linear.onnx"), "QDQ804")
    assert linear.fix is None and "needs data" in linear.message


def test_qdq804_negative(tmp_path):
    # Conv → Relu → Q: the Q absorbs the Relu, the unit fuses.
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "in", zp=128, dtype=np.uint8)
    conv = b.node("Conv", [x, conv_weight(b, "w", (3, 2, 1, 1))], ["c"], name="conv")
    b.output(act(b, b.node("Relu", [conv], ["r"], name="relu"), "out", 0.1, 0, np.uint8), [1, 3, 4, 4])
    assert found(load(b, tmp_path, "relu.onnx"), "QDQ804") == []
    # A float data input: the op is not a node unit at all (the input side's rule reports it).
    b = GraphBuilder()
    conv = b.node("Conv", [b.input("x", [1, 2, 4, 4]), conv_weight(b, "w", (3, 2, 1, 1))], ["c"], name="conv")
    b.output(b.node("Abs", [conv], ["side"], name="abs"), [1, 3, 4, 4])
    assert found(load(b, tmp_path, "float.onnx"), "QDQ804") == []


# --- QDQ805 fixed-range-output --------------------------------------------------------------------------


def silu(quantized_sigmoid: bool = False, sigmoid_is_output: bool = False, op: str = "Sigmoid") -> GraphBuilder:
    """DQ → {Sigmoid, Mul} → Q → DQ → y, as FX exports a SiLU."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 4, 4, 4]), "in", 0.05, 128, np.uint8)
    s = b.node(op, [x], ["s"], name="sig")
    if quantized_sigmoid:
        s = act(b, s, "s", 1 / 256, 0, np.uint8)
    if sigmoid_is_output:
        b.output(s, [1, 4, 4, 4])
    y = b.node("Mul", [x, s], ["m"], name="mul")
    b.output(act(b, y, "out", 0.05, 128, np.uint8), [1, 4, 4, 4])
    return b


def test_qdq805_inserts_a_data_free_qdq_and_onnxruntime_fuses_the_silu(tmp_path):
    model = load(silu(), tmp_path)
    [finding] = found(model, "QDQ805")
    assert (finding.values["low"], finding.values["high"]) == (0.0, 1.0)
    assert optimized_ops(tmp_path / "model.onnx")["QLinearSigmoid"] == 0
    changes, path = fix_rule(model, "QDQ805", tmp_path)
    assert len(changes) == 1 and changes[0].values["scale"] == 1 / 256 and changes[0].values["zero_point"] == 0
    graph = onnx.load(str(path)).graph
    inits = initializers(path)
    [q] = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "s"]
    assert inits[q.input[1]] == np.float32(1 / 256) and inits[q.input[1]].shape == ()
    assert inits[q.input[2]].dtype == np.uint8 and int(inits[q.input[2]]) == 0
    assert next(n for n in graph.node if n.name == "mul").input[1] != "s"
    ops = optimized_ops(path)
    assert ops["QLinearSigmoid"] == 1 and ops["QLinearMul"] == 1
    # The Sigmoid output moves by at most one step of 1/256, so the Mul output by at most |x|/256,
    # plus one step of the output grid where the rounding tips over.
    x = rand(1, 4, 4, 4, scale=2.0)
    xq = (np.clip(np.rint(x / 0.05) + 128, 0, 255) - 128) * 0.05
    (before,), (after,) = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    assert np.all(np.abs(after - before) <= np.abs(xq) / 256 + 0.05 + 1e-6)
    assert found(load_model(path), "QDQ805") == []


def test_qdq805_tanh_in_int8_is_symmetric(tmp_path):
    model = load(silu(op="Tanh"), tmp_path)
    ruleset = with_params("QDQ805", tmp_path, 'ranges = { Tanh = [-1.0, 1.0] }\ndtype = "int8"')
    changes, path = fix_rule(model, "QDQ805", tmp_path, ruleset)
    assert changes[0].values == {"scale": 1 / 128, "zero_point": 0, "max_error": 1 / 128}


def test_qdq805_negative_and_not_fixable(tmp_path):
    assert found(load(silu(quantized_sigmoid=True), tmp_path, "q.onnx"), "QDQ805") == []
    assert found(load(silu(op="Tanh"), tmp_path, "tanh.onnx"), "QDQ805") == []  # ort lists only Sigmoid
    [output] = found(load(silu(sigmoid_is_output=True), tmp_path, "out.onnx"), "QDQ805")
    assert output.fix is None
    b = GraphBuilder()  # a Sigmoid on a float path stays float: a Q/DQ would only add work
    b.output(b.node("Sigmoid", [b.input("x", [4])], ["s"], name="sig"), [4])
    b.node("QuantizeLinear", ["s", b.init("unused_scale", f32(0.1))], ["unused"], name="other_q")
    assert found(load(b, tmp_path, "float.onnx"), "QDQ805") == []


@pytest.mark.parametrize("text", ['ranges = { Sigmoid = [1.0, 0.0] }', 'ranges = { Sigmoid = [0.0] }', 'dtype = "float8e4m3fn"'])
def test_qdq805_rejects_bad_parameters(tmp_path, text):
    with pytest.raises(RuleSetError):
        found(load(silu(), tmp_path), "QDQ805", with_params("QDQ805", tmp_path, text))


# --- a PyTorch FX QAT export, end to end ------------------------------------------------------------


@pytest.fixture(scope="module")
def fx_model(tmp_path_factory) -> Path:
    torch_or_skip()
    from fx_models import export_observed

    return export_observed(tmp_path_factory.mktemp("ort_fx") / "fx_qat.onnx", tail="silu", batch=4)


@pytest.fixture(scope="module")
def fx_feeds() -> dict[str, np.ndarray]:
    return {"x": rand(1, 3, 16, 16, seed=1, scale=2.0)}


def test_fx_export_as_exported_mostly_runs_in_float(fx_model):
    ops = optimized_ops(fx_model)
    assert ops["Conv"] + ops["FusedConv"] >= 5 and ops["QLinearConv"] <= 1


def test_fx_exact_only_fix_is_bit_exact(fx_model, fx_feeds, tmp_path):
    model = load_model(fx_model)
    result = fix(model, ORT, exact_only=True)
    assert result.converged
    assert {"QDQ201", "QDQ202", "QDQ505"} <= set(result.by_rule())
    assert {all_rules()[c.code].fix_safety for c in result.changes} == {FixSafety.EXACT}
    path = tmp_path / "exact.onnx"
    save_model(model, path)
    before, after = run_ort(fx_model, fx_feeds), run_ort(path, fx_feeds)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    left = {f.code for f in result.result.findings}
    assert "QDQ505" not in left and "QDQ201" not in left and {"QDQ507", "QDQ805"} <= left


def test_fx_full_fix_fuses_every_conv(fx_model, fx_feeds, tmp_path):
    model = load_model(fx_model)
    result = fix(model, ORT)
    assert result.converged and result.result.findings == []
    assert {"QDQ505", "QDQ507", "QDQ805"} <= set(result.by_rule())
    path = tmp_path / "full.onnx"
    save_model(model, path)
    onnx.checker.check_model(str(path), full_check=True)
    ops = optimized_ops(path)
    assert ops["QLinearConv"] == 6 and ops["Conv"] + ops["FusedConv"] == 0
    assert ops["QLinearAdd"] == 1 and ops["QLinearSigmoid"] == 1 and ops["QLinearMul"] == 1
    # Approximate fixes: Relu zero-points change only saturated values, the Sigmoid moves by at most
    # 1/256, the ConvBn fold by float rounding. The output stays close to the exported model's.
    (before,), (after,) = run_ort(fx_model, fx_feeds), run_ort(path, fx_feeds)
    sqnr = 10 * np.log10(np.sum(before.astype(np.float64) ** 2) / max(np.sum((after - before).astype(np.float64) ** 2), 1e-30))
    assert sqnr > 30


def test_float_output_without_a_q_is_fixed_from_calibration_data(tmp_path):
    """DQ → Conv → Tanh (float): no Q exists for the conv output, so the scale must be measured."""
    from qdq.quant.calibrate import tensor_ranges

    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "x", dtype=np.uint8, zp=128)
    y = b.node("Conv", [x, conv_weight(b, "w", (2, 2, 1, 1))], ["conv_out"], name="conv")
    b.node("Tanh", [y], ["y"], name="tanh")
    b.output("y", [1, 2, 4, 4])
    path = b.save(tmp_path / "m.onnx")
    model = load_model(path)
    [finding] = found(model, "QDQ804")
    assert finding.fix is None and "--calibrate" in finding.message
    feeds = {"x": rand(1, 2, 4, 4)}
    result = fix(model, ORT.narrowed(select=["QDQ804"]), ranges=tensor_ranges(path, feeds))
    assert [c.code for c in result.changes] == ["QDQ804"] and not result.result.findings
    tanh = next(n for n in model.graph.nodes if n.name == "tanh")
    quantize = tanh.inputs[0].inputs[0].inputs[0].inputs[0]
    assert quantize.op == "QuantizeLinear" and quantize.inputs[2].values.dtype == np.uint8


# Quark's A16W8, Ryzen AI's configuration for transformers: int16 activations, zero-point 0 after Softmax.
QUARK_A16W8 = Path(__file__).resolve().parent / "corpus" / "quark" / "transformer_a16w8.onnx"


def test_qdq507_leaves_16_bit_activations_alone_on_onnxruntime(tmp_path):
    model = load_model(QUARK_A16W8)
    assert found(model, "QDQ507") == []  # rules/ort.toml: both of the rule's reasons are 8-bit kernels
    every_type = found(model, "QDQ507", with_params("QDQ507", tmp_path, 'types = ["uint8", "int8", "uint16", "int16"]'))
    assert every_type, "the model was chosen for its one-sided int16 activations"
    graph = onnx.load(str(QUARK_A16W8)).graph
    zero_points = {t.name: t.data_type for t in graph.initializer}
    quantizes = {n.name: n for n in graph.node if n.op_type == "QuantizeLinear"}
    assert {zero_points[quantizes[f.node].input[2]] for f in every_type} == {onnx.TensorProto.INT16}


def test_qdq507_rejects_a_type_that_is_no_integer_type(tmp_path):
    with pytest.raises(RuleSetError, match="QDQ507.types"):
        found(load(relu_pool(), tmp_path), "QDQ507", with_params("QDQ507", tmp_path, 'types = ["unit8"]'))


# --- QDQ508 saturating-weight-type ------------------------------------------------------------------

PAIR_LIMIT = ORT.rules["QDQ508"].params["pair_limit"]
# The largest pair of equal weights that 255 · (w + w) keeps inside the 16-bit range: 64.
LARGEST_SAFE = PAIR_LIMIT // 255 // 2


def saturating_conv(zp=128, in_type=np.uint8, weight="stored", axis=None, shared=False, top=127,
                    second=None) -> GraphBuilder:
    """DQ(x, 0.01, zp) → Conv ← DQ(int8 weight, `top` but one -128 in the first channel) → Q → DQ → y.

    `second` gives a second output channel these weights. `weight` "stored" keeps the integers `w_int` in the model, "float" quantizes `w_float` with
    Q `w_q` as FX exports it; `axis` makes it per-channel (2 output channels). With `shared`, a
    second Conv, whose input has zero-point 0, reads the same weight through its own DQ `w2_dq`.
    """
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 4, 2, 2]), "in", 0.01, zp, in_type)
    scale = f32(0.01 if axis is None else [0.01, 0.02])
    cout = 2 if second is not None else scale.size
    integers = np.full((cout, 4, 1, 1), top, np.int8)
    integers[0, 0] = -128
    if second is not None:
        integers[1:] = second
    attrs = {"axis": axis} if axis is not None else {}
    params = [b.init("w_scale", scale), b.init("w_zp", np.zeros(scale.shape, np.int8))]
    if weight == "float":
        real = integers.astype(np.float32) * scale.reshape(-1, 1, 1, 1)
        source = b.node("QuantizeLinear", [b.init("w_float", real), *params], ["w_int"], name="w_q", **attrs)
    else:
        source = b.init("w_int", integers)
    conv = b.node("Conv", [x, b.node("DequantizeLinear", [source, *params], ["w_deq"], name="w_dq", **attrs)], ["c"])
    b.output(act(b, conv, "out", 0.1, 0, np.uint8), [1, cout, 2, 2])
    if shared:
        x2 = act(b, b.input("x2", [1, 4, 2, 2]), "in2", 0.01, 0, np.uint8)
        w2 = b.node("DequantizeLinear", [source, *params], ["w2_deq"], name="w2_dq", **attrs)
        b.output(act(b, b.node("Conv", [x2, w2], ["c2"]), "out2", 0.1, 0, np.uint8), [1, cout, 2, 2])
    return b


def test_qdq508_runs_last_in_the_ort_fix_order():
    order = [rule.code for rule, _ in ORT.fix_sequence()]
    assert order.index("QDQ508") > max(order.index("QDQ505"), order.index("QDQ507"), order.index("QDQ804"))
    assert order.index("QDQ507") < order.index("QDQ508")  # it reads the zero-points QDQ507 moved
    assert all_rules()["QDQ508"].fix_safety == FixSafety.APPROXIMATE  # 7-bit by default; "uint8" is exact


@pytest.mark.parametrize(("zp", "in_type", "top", "expected"), [
    (128, np.uint8, 127, True),                # 255 · (127 + 127) > 32767
    (0, np.uint8, 127, True),                  # after a Relu too: a large input can still meet both weights
    (0, np.int8, 127, True),                   # an int8 input reaches the kernel as uint8, 128 higher
    (128, np.uint8, LARGEST_SAFE, False),      # 255 · 128 = 32640 fits whatever the input
    (128, np.uint8, LARGEST_SAFE + 1, True),
])
def test_qdq508_when_a_weight_pair_can_overflow(tmp_path, zp, in_type, top, expected):
    findings = found(load(saturating_conv(zp, in_type, top=top), tmp_path), "QDQ508")
    assert bool(findings) == expected
    if expected:
        [finding] = findings
        assert finding.node == "w_dq" and finding.values["pair"] == 2 * top


def test_qdq508_parameters(tmp_path):
    model = load(saturating_conv(zp=128), tmp_path)
    assert found(model, "QDQ508", with_params("QDQ508", tmp_path, "pair_limit = 64770")) == []  # 255 · 254
    assert len(found(model, "QDQ508", with_params("QDQ508", tmp_path, "pair_limit = 64769"))) == 1
    assert found(model, "QDQ508", with_params("QDQ508", tmp_path, 'ops = ["Gemm"]')) == []
    with pytest.raises(RuleSetError):
        found(model, "QDQ508", with_params("QDQ508", tmp_path, 'weights = "int4"'))


@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("weight", ["stored", "float"])
def test_qdq508_stores_the_weight_as_uint8_bit_exact(tmp_path, weight, axis):
    model = load(saturating_conv(weight=weight, axis=axis), tmp_path)
    uint8 = with_params("QDQ508", tmp_path, 'weights = "uint8"')
    [finding] = found(model, "QDQ508", uint8)
    changes, path = fix_rule(model, "QDQ508", tmp_path, uint8)
    assert len(changes) == 1
    inits = initializers(path)
    for node in ["w_dq"] + (["w_q"] if weight == "float" else []):
        scale, zero_point = node_params(path, node)
        assert zero_point.dtype == np.uint8 and np.all(zero_point == 128) and zero_point.shape == scale.shape
    integers = next(n for n in onnx.load(str(path)).graph.node if n.name == "w_dq").input[0]
    if weight == "float":  # the float weight stays; only the type its Q writes changes
        assert integers == "w_int" and np.array_equal(inits["w_float"], initializers(tmp_path / "model.onnx")["w_float"])
    else:
        assert inits[integers].dtype == np.uint8 and inits[integers].min() == 0 and inits[integers].max() == 255
    x = rand(1, 4, 2, 2, scale=0.8)
    before, after = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert found(load_model(path), "QDQ508") == []


def test_qdq508_gives_shared_integers_a_new_constant(tmp_path):
    model = load(saturating_conv(shared=True), tmp_path)
    uint8 = with_params("QDQ508", tmp_path, 'weights = "uint8"')
    [finding] = found(model, "QDQ508", uint8)  # one value, reported once
    original = model.graph.tensors()["w_int"]
    stored = original.values.copy()
    changes, path = fix_rule(model, "QDQ508", tmp_path, uint8)
    assert original.values.dtype == np.int8 and np.array_equal(original.values, stored)  # never edited in place
    graph = onnx.load(str(path)).graph
    readers = {n.name: n.input[0] for n in graph.node if n.name in ("w_dq", "w2_dq")}
    assert readers["w_dq"] == readers["w2_dq"] != "w_int"
    assert np.array_equal(initializers(path)[readers["w_dq"]], stored.astype(np.int16) + 128)
    feeds = {"x": rand(1, 4, 2, 2, scale=0.8), "x2": rand(1, 4, 2, 2, seed=1, scale=0.8)}
    before, after = run_ort(tmp_path / "model.onnx", feeds), run_ort(path, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_qdq508_fixed_conv_fuses_and_does_not_saturate(tmp_path):
    model = load(saturating_conv(), tmp_path)
    _, path = fix_rule(model, "QDQ508", tmp_path, with_params("QDQ508", tmp_path, 'weights = "uint8"'))
    assert optimized_ops(path)["QLinearConv"] == 1
    reason = saturation_not_shown()
    if reason:
        pytest.skip(reason)
    # Inputs of 1.27 are integers 255: 255 · 127 twice overflows the 16-bit pair sums of u8×s8.
    feeds = {"x": np.full((1, 4, 2, 2), 1.27, np.float32)}
    (exact,) = run_ort(tmp_path / "model.onnx", feeds)
    (saturated,), (fixed,) = run_optimized(tmp_path / "model.onnx", feeds), run_optimized(path, feeds)
    assert np.allclose(exact, 3.2)  # 1.27 · 0.01 · (3 · 127 - 128) = 3.21 on the output's 0.1 grid
    assert np.all(np.abs(saturated - exact) > 1.0) and np.array_equal(fixed, exact)


@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("weight", ["stored", "float"])
def test_qdq508_narrows_the_channels_at_risk_just_enough(tmp_path, weight, axis):
    model = load(saturating_conv(weight=weight, axis=axis), tmp_path)
    [finding] = found(model, "QDQ508")
    assert finding.fix == FixSafety.APPROXIMATE and "narrower int8" in finding.message
    [change], path = fix_rule(model, "QDQ508", tmp_path)
    assert "no 16-bit pair sum can saturate" in change.description
    scale, zero_point = node_params(path, "w_dq")
    # 127 + 127 becomes 64 + 64 = 128, the largest pair that fits, on a grid 127/64 coarser.
    assert zero_point.dtype == np.int8 and np.all(zero_point == 0)
    assert np.allclose(scale, f32(0.01 if axis is None else [0.01, 0.02]) * 127 / LARGEST_SAFE)
    assert found(load_model(path), "QDQ508") == []
    assert optimized_ops(path)["QLinearConv"] == 1
    # Inputs of 1.27 are integers 255: every pair fits, and the fused kernel agrees with the unfused one.
    feeds = {"x": np.full((1, 4, 2, 2), 1.27, np.float32)}
    (unfused,), (fused,) = run_ort(path, feeds), run_optimized(path, feeds)
    assert np.array_equal(unfused, fused)


def test_qdq508_leaves_the_channels_not_at_risk_on_their_grid(tmp_path):
    """A per-tensor weight whose second output channel cannot saturate becomes per-channel: only the first moves."""
    model = load(saturating_conv(second=40), tmp_path)
    [finding] = found(model, "QDQ508")
    assert (finding.values["channels"], finding.values["outputs"]) == (1, 2)
    _, path = fix_rule(model, "QDQ508", tmp_path)
    scale, _ = node_params(path, "w_dq")
    assert np.allclose(scale, f32([0.01 * 127 / LARGEST_SAFE, 0.01]))
    x = rand(1, 4, 2, 2, scale=0.8)
    (before,), (after,) = run_ort(tmp_path / "model.onnx", {"x": x}), run_ort(path, {"x": x})
    assert np.array_equal(before[:, 1], after[:, 1])


@pytest.mark.parametrize("weight", ["stored", "float"])
def test_qdq508_moves_a_lone_pair_onto_the_bound_instead_of_coarsening_the_channel(tmp_path, weight):
    """One pair 65 + 65 among 31 pairs of opposite signs: the channel keeps its grid and only that pair moves,
    to 64 + 64 (an error of 2 steps² against about 62/12 ≈ 5 for re-rounding the other weights on a coarser grid)."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 64, 1, 1]), "in", 0.01, 0, np.uint8)
    magnitudes = np.random.default_rng(0).integers(1, 128, 64)
    integers = (magnitudes * np.tile([1, -1], 32)).astype(np.int8).reshape(1, 64, 1, 1)
    integers[0, :2, 0, 0] = 65
    params = [b.init("w_scale", f32(0.01)), b.init("w_zp", np.int8(0))]
    if weight == "float":
        source = b.node("QuantizeLinear", [b.init("w_float", integers.astype(np.float32) * f32(0.01)), *params],
                        ["w_int"], name="w_q")
    else:
        source = b.init("w_int", integers)
    w = b.node("DequantizeLinear", [source, *params], ["w_deq"], name="w_dq")
    b.output(act(b, b.node("Conv", [x, w], ["c"]), "out", 0.1, 0, np.uint8), [1, 1, 1, 1])
    model = load(b, tmp_path)
    [finding] = found(model, "QDQ508")
    assert finding.values["pair"] == 130
    [change], path = fix_rule(model, "QDQ508", tmp_path)
    assert "1 pair(s) moved onto that bound" in change.description
    scale, _ = node_params(path, "w_dq")
    assert np.allclose(scale, 0.01)  # the grid stays
    graph = onnx.load(str(path)).graph
    dq = next(n for n in graph.node if n.name == "w_dq")
    if weight == "float":  # the Q now reads float weights that it maps onto the chosen integers
        q = next(n for n in graph.node if n.output[0] == dq.input[0])
        stored = np.rint(initializers(path)[q.input[0]] / scale.reshape(-1, 1, 1, 1)).astype(np.int8)
    else:
        stored = initializers(path)[dq.input[0]]
    expected = integers.copy()
    expected[0, :2, 0, 0] = 64
    assert np.array_equal(stored, expected)
    assert found(load_model(path), "QDQ508") == []
    feeds = {"x": np.full((1, 64, 1, 1), 2.55, np.float32)}  # integers 255: the worst input for every pair
    (unfused,), (fused,) = run_ort(path, feeds), run_optimized(path, feeds)
    assert np.array_equal(unfused, fused)


def test_nearest_safe_weights_is_no_worse_than_either_pure_fix():
    """On random channels: no pair exceeds the bound, and the cost (squared error plus the mean ratio times the
    summed error squared) is at most that of the finest grid on which rounding alone fits (the fix before pairs
    could move) and that of moving pairs on the grid as it is."""
    rng = np.random.default_rng(0)
    most, ratio = PAIR_LIMIT // 255, ORT.rules["QDQ508"].params["input_mean_ratio"]

    def cost(integers, step, real):
        error = integers * step - real
        return np.sum(error ** 2) + ratio * np.sum(error) ** 2

    def pair_sums(integers):
        return np.concatenate([integers, np.zeros((1, integers.shape[1] % 2))], axis=1).reshape(-1, 2).sum(axis=1)

    for _ in range(200):
        n = int(rng.integers(2, 40))
        real = np.clip(rng.normal(0, rng.uniform(20, 90), (1, n)), -128, 127)  # in steps of scale 1
        k, scale, rows, moved = nearest_safe_weights(real, 1.0, most, ratio)
        assert np.all(np.abs(pair_sums(rows)) <= most) and np.all(np.abs(rows) <= 128) and 63 <= k <= 127
        chosen = cost(rows, float(scale), real)
        for k_alone in range(127, 62, -1):  # rounding alone, on the finest grid where it fits
            step = float(np.float32(127 / k_alone))
            alone = np.clip(np.rint(real / step), -128, 127)
            if np.all(np.abs(pair_sums(alone)) <= most):
                assert chosen <= cost(alone, step, real) + 1e-9
                break
        same_grid, _ = _pairs_onto_bound(np.clip(np.rint(real), -128, 127), real, most)
        assert chosen <= cost(same_grid, 1.0, real) + 1e-9


@pytest.mark.parametrize("float_output", [False, True])
def test_qdq508_narrows_a_matmul_weight_so_its_fused_kernel_agrees(tmp_path, float_output):
    """A MatMul with an int8 [K, N] weight fuses into QLinearMatMul (or MatMulIntegerToFloat with a float output),
    which pairs along K like QGemm: weights 127 at K = 0 and 1 saturate with inputs of 255 before the fix, not after."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 8]), "in", 0.01, 0, np.uint8)
    integers = np.zeros((8, 4), np.int8)
    integers[:2] = 127
    integers[2:] = np.int8(-3)
    w = b.node("DequantizeLinear", [b.init("w_int", integers), b.init("w_scale", f32(0.01)), b.init("w_zp", np.int8(0))],
               ["w_deq"], name="w_dq")
    product = b.node("MatMul", [x, w], ["m"])
    b.output(product if float_output else act(b, product, "out", 0.5, 0, np.uint8), [1, 4])
    model = load(b, tmp_path)
    [finding] = found(model, "QDQ508")
    assert finding.values["pair"] == 254
    _, path = fix_rule(model, "QDQ508", tmp_path)
    assert found(load_model(path), "QDQ508") == []
    reason = saturation_not_shown()
    if reason:
        pytest.skip(reason)
    feeds = {"x": np.full((1, 8), 2.55, np.float32)}  # integers 255
    (unfused,), (saturated,) = run_ort(tmp_path / "model.onnx", feeds), run_optimized(tmp_path / "model.onnx", feeds)
    assert np.all(np.abs(saturated - unfused) > 1.0)
    (unfused,), (fused,) = run_ort(path, feeds), run_optimized(path, feeds)
    assert np.allclose(fused, unfused, rtol=1e-6, atol=0)  # a float output may differ in its last bit


def test_qdq508_before_opset_13_gives_the_whole_weight_one_grid(tmp_path):
    """DequantizeLinear has no per-axis scales before opset 13: one grid is chosen for every channel."""
    b = GraphBuilder(opset=12)
    x = act(b, b.input("x", [1, 4, 2, 2]), "in", 0.01, 0, np.uint8)
    integers = np.full((2, 4, 1, 1), 127, np.int8)
    integers[1] = 40
    w = b.node("DequantizeLinear", [b.init("w_int", integers), b.init("w_scale", f32(0.01)), b.init("w_zp", np.int8(0))],
               ["w_deq"], name="w_dq")
    b.output(act(b, b.node("Conv", [x, w], ["c"]), "out", 0.1, 0, np.uint8), [1, 2, 2, 2])
    model = load(b, tmp_path)
    [change], path = fix_rule(model, "QDQ508", tmp_path)
    assert "one scale before opset 13" in change.description
    scale, _ = node_params(path, "w_dq")
    assert scale.shape == () and np.isclose(scale, 0.01 * 127 / LARGEST_SAFE)  # 127 + 127 → 64 + 64
    dq = next(n for n in onnx.load(str(path)).graph.node if n.name == "w_dq")
    stored = initializers(path)[dq.input[0]]
    assert np.all(stored[0] == LARGEST_SAFE) and np.all(stored[1] == 20)  # 40 · 64/127 = 20.2
    assert found(load_model(path), "QDQ508") == []


def test_qdq508_leaves_depthwise_convs_alone(tmp_path):
    """onnxruntime's depthwise kernel (one input and one output channel per group) does not add products in pairs:
    on this CPU 255 · 127 · 2 comes out whole, fused or not."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 4, 4, 4]), "in", 0.01, 128, np.uint8)
    params = [b.init("w_scale", f32(0.01)), b.init("w_zp", np.int8(0))]
    w = b.node("DequantizeLinear", [b.init("w_int", np.full((4, 1, 3, 3), 127, np.int8)), *params], ["w_deq"],
               name="w_dq")
    b.output(act(b, b.node("Conv", [x, w], ["c"], group=4), "out", 0.1, 0, np.uint8), [1, 4, 2, 2])
    model = load(b, tmp_path)
    assert found(model, "QDQ508") == [] and optimized_ops(tmp_path / "model.onnx")["QLinearConv"] == 1
    assert len(found(model, "QDQ508", with_params("QDQ508", tmp_path, "depthwise_pairs = true"))) == 1
    feeds = {"x": np.full((1, 4, 4, 4), 1.27, np.float32)}  # integers 255
    (unfused,), (fused,) = run_ort(tmp_path / "model.onnx", feeds), run_optimized(tmp_path / "model.onnx", feeds)
    assert np.array_equal(unfused, fused)


def test_qdq508_stores_a_one_channel_conv_as_uint8(tmp_path):
    """A Conv reading a grey image (`uint8_channels` = 1 in ort) keeps its grid: uint8, exact."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 1, 4, 4]), "in", 0.01, 128, np.uint8)
    params = [b.init("w_scale", f32(0.01)), b.init("w_zp", np.int8(0))]
    w = b.node("DequantizeLinear", [b.init("w_int", np.full((2, 1, 3, 3), 127, np.int8)), *params], ["w_deq"],
               name="w_dq")
    b.output(act(b, b.node("Conv", [x, w], ["c"]), "out", 0.1, 0, np.uint8), [1, 2, 2, 2])
    model = load(b, tmp_path)
    [finding] = found(model, "QDQ508")
    assert finding.values["expected"] == "uint8"
    _, path = fix_rule(model, "QDQ508", tmp_path)
    scale, zero_point = node_params(path, "w_dq")
    assert zero_point.dtype == np.uint8 and scale == f32(0.01)


def test_narrowed_weights_keep_their_conv_fused(tmp_path):
    """Issue 39's checker: QDQ508 moved the grid of some output channels and left their int32 bias at
    the old input × weight scale; onnxruntime then kept those Convs float (11 QLinearConv in the
    quantizer's MobileNetV2, 5 after the fix). QDQ606 re-scales the biases after it."""
    source = Path(__file__).parent / "corpus" / "ort" / "mobilenetv2_default.onnx"
    model = load_model(source)
    result = fix(model, ORT)
    assert result.converged and {"QDQ508", "QDQ606"} <= set(result.by_rule())
    path = tmp_path / "fixed.onnx"
    save_model(model, path)
    ops = optimized_ops(path)
    assert ops["QLinearConv"] == 17 and ops["Conv"] + ops["FusedConv"] == 0, ops


def relu6_block(top: float) -> GraphBuilder:
    """u8 DQ → Conv → Clip(0, 6) → Q(u8, zp 0, range [0, top]) → DQ → y."""
    b = GraphBuilder()
    x = act(b, b.input("x", [1, 2, 4, 4]), "x", 0.02, 128, np.uint8)
    y = b.node("Conv", [x, conv_weight(b, "w", (2, 2, 1, 1))], name="conv")
    clipped = b.node("Clip", [y, b.init("lo", f32(0.0)), b.init("hi", f32(6.0))], name="relu6")
    b.node("Identity", [act(b, clipped, "y", top / 255, 0, np.uint8)], ["out"])
    b.output("out", [1, 2, 4, 4])
    return b


@pytest.mark.parametrize("top, fused", [(6.0, True), (255 / 32, False)])
def test_a_clip_the_q_does_not_cover_keeps_the_conv_float(tmp_path, top, fused):
    """Issue 39's checker: Quark's power-of-two ReLU6 outputs (Q range [0, 7.97]) were lint-clean for
    ort, but onnxruntime absorbs a Clip only when the Q's range lies within it: 12 Convs ran float."""
    model = load(relu6_block(top), tmp_path)
    assert [f.node for f in found(model, "QDQ804")] == ([] if fused else ["conv"])
    assert optimized_ops(tmp_path / "model.onnx")["QLinearConv"] == int(fused)


def test_sixteen_bit_activations_are_named_not_rewritten(tmp_path):
    """Issue 39's checker: a uint16 model was lint-clean for ort, yet onnxruntime's QLinear kernels
    are 8-bit and not one of its Convs fused. QDQ505 names such values, without a fix."""
    b = GraphBuilder(opset=21)  # uint16 Q/DQ
    x = act(b, b.input("x", [1, 2, 4, 4]), "x", 0.0001, 32768, np.uint16)
    y = b.node("Conv", [x, conv_weight(b, "w", (2, 2, 1, 1))], name="conv")
    b.node("Identity", [act(b, y, "y", 0.001, 32768, np.uint16)], ["out"])
    b.output("out", [1, 2, 4, 4])
    model = load(b, tmp_path)
    findings = found(model, "QDQ505")
    assert sorted(f.tensors for f in findings) == [("conv_out",), ("x",)] and all(f.fix is None for f in findings)
    assert optimized_ops(tmp_path / "model.onnx")["QLinearConv"] == 0
