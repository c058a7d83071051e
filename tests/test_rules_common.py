"""The `common` rule set, rule by rule: a positive and a negative case on a tiny hand-built graph,
the exact fixes checked end to end in onnxruntime, a PyTorch-style artefact chain, and rule metadata.

How models are loaded: `load` saves and reads back through `load_model`, which runs `onnx.checker`
without `full_check`. That checker validates the graph structure and the op schemas' attributes
but not types or initializer values, so even the invalid models here (zero/NaN scales, int scales,
int32 Q outputs, float8 zero-points, out-of-range axes, mismatched shapes) load that way. Only a
model the checker rejects (an attribute its opset lacks) uses `load_unchecked`: the graph imported
straight from the proto into a `Model`, so the rule can still be shown to work on it.
"""
from __future__ import annotations

import json
import re
import string
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import apply_fix, findings_of, fix_roundtrip, lint_codes, run_ort
from onnx import TensorProto, helper

from qdq.engine.registry import all_rules
from qdq.engine.ruleset import load_target
from qdq.graph.model import Model, load_model, save_model
from qdq.graph.read import import_graph
from qdq.graph.tidy import tidy
from qdq.graph.write import export_model
from qdq.rewrite.rule import Finding, FixSafety, Rule
from qdq.support.errors import ModelLoadError

EXACT = FixSafety.EXACT
COMMON = sorted(load_target("common").rules)


# --- building blocks ------------------------------------------------------------------------------


def f32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def i8(value) -> np.ndarray:
    return np.asarray(value, dtype=np.int8)


def qnode(b: GraphBuilder, op: str, x: str, name: str, scale=0.05, zp=i8(0), **attrs) -> str:
    """One Q or DQ node with its own initializers `{name}_scale` and `{name}_zp` (zp=None: none).

    A numpy scale keeps its dtype, a Python number becomes float32; the zero-point's numpy dtype is
    the quantized type.
    """
    scale = scale if isinstance(scale, (np.ndarray, np.generic)) else f32(scale)
    inputs = [x, b.init(f"{name}_scale", scale)]
    if zp is not None:
        inputs.append(b.init(f"{name}_zp", np.asarray(zp)))
    return b.node(op, inputs, name=name, **attrs)


def q(b: GraphBuilder, x: str, name: str, scale=0.05, zp=i8(0), **attrs) -> str:
    return qnode(b, "QuantizeLinear", x, name, scale, zp, **attrs)


def dq(b: GraphBuilder, x: str, name: str, scale=0.05, zp=i8(0), **attrs) -> str:
    return qnode(b, "DequantizeLinear", x, name, scale, zp, **attrs)


def qdq(b: GraphBuilder, x: str, name: str, scale=0.05, zp=i8(0)) -> str:
    """`{name}_q` → `{name}_dq` sharing the initializers `{name}_scale` and `{name}_zp`."""
    scale = scale if isinstance(scale, (np.ndarray, np.generic)) else f32(scale)
    params = [b.init(f"{name}_scale", scale), b.init(f"{name}_zp", np.asarray(zp))]
    xq = b.node("QuantizeLinear", [x, *params], name=f"{name}_q")
    return b.node("DequantizeLinear", [xq, *params], name=f"{name}_dq")


def weight_dq(b: GraphBuilder, name: str, shape: tuple[int, ...], scale, zp=None, **attrs) -> str:
    """An int8 weight initializer `{name}_w` read by DequantizeLinear `{name}`."""
    values = (np.arange(np.prod(shape)) % 255 - 127).reshape(shape)
    b.init(f"{name}_w", i8(values))
    zp = np.zeros(np.shape(scale), np.int8) if zp is None else zp
    return qnode(b, "DequantizeLinear", f"{name}_w", name, f32(scale), zp, **attrs)


def save(b: GraphBuilder, tmp_path: Path, name: str = "m.onnx") -> Path:
    # No check here: load_model runs the checker itself, and one test needs a model it rejects.
    return b.save(tmp_path / name, check=False)


def load(b: GraphBuilder, tmp_path: Path) -> Model:
    """Save and load through `load_model`, the path `qdq lint` takes (onnx.checker included)."""
    return load_model(save(b, tmp_path))


def load_unchecked(b: GraphBuilder, tmp_path: Path) -> Model:
    """For a model `onnx.checker` rejects: import the proto directly, as load_model does after its check."""
    proto = b.model()
    return Model(graph=import_graph(proto), path=tmp_path / "m.onnx", opset=b.opset, proto=proto)


def found(model: Model, code: str) -> list[Finding]:
    """The findings of one rule; each message must be the rule's template filled with its own values."""
    rule = all_rules()[code]
    findings = findings_of(model, code)
    for f in findings:
        assert f.code == code
        assert f.message == rule.message.format(node=f.node or "", **f.values)
    return findings


def one(model: Model, code: str) -> Finding:
    findings = found(model, code)
    assert len(findings) == 1, [f.message for f in findings]
    return findings[0]


def by_node(findings: list[Finding]) -> dict[str, Finding]:
    return {f.node: f for f in findings}


def rand(*shape: int, seed: int = 0, spread: float = 8.0) -> np.ndarray:
    """Random float32 input wide enough to hit both saturation ends of int8 at the test scales."""
    return (np.random.default_rng(seed).standard_normal(shape) * spread).astype(np.float32)


def graph_bytes(model: Model) -> bytes:
    """The graph in a canonical form (apply_fix cleans and toposorts even when it changes nothing)."""
    graph = model.graph.copy()
    tidy(graph)
    return export_model(graph, model.proto).SerializeToString()


def assert_exact_fix(path: Path, code: str, tmp_path: Path, feeds: dict[str, np.ndarray]) -> tuple[list, Model]:
    """The fix removes every fixable finding, the result passes full_check (in fix_roundtrip), runs in
    onnxruntime with optimisations off, gives bit-identical outputs, and a second fix changes nothing."""
    changes, fixed, before, after = fix_roundtrip(path, code, tmp_path, feeds)
    assert changes
    assert [f for f in found(fixed, code) if f.fix is not None] == []
    assert len(before) == len(after)
    for a, b in zip(before, after):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)
    snapshot = graph_bytes(fixed)
    assert apply_fix(fixed, code) == []
    assert graph_bytes(fixed) == snapshot
    return changes, fixed


def assert_fix_leaves_alone(model: Model, code: str) -> None:
    """A finding without a fix is reported, and applying the rule's fix does not touch the graph."""
    assert found(model, code) and all(f.fix is None for f in found(model, code))
    snapshot = graph_bytes(model)
    assert apply_fix(model, code) == []
    assert graph_bytes(model) == snapshot
    assert all(f.fix is None for f in found(model, code))


# --- QDQ001 invalid-scale ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "problem"),
    [
        (0.0, "scale 0 is not positive"),
        (-0.25, "scale -0.25 is not positive"),
        (float("nan"), "scale is NaN or infinite"),
        (float("inf"), "scale is NaN or infinite"),
        (-float("inf"), "scale is NaN or infinite"),
    ],
)
def test_qdq001_bad_scale_value(tmp_path, scale, problem):
    # Loads through load_model: the checker does not look at initializer values.
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [2, 3]), "a", scale=scale), [2, 3])
    model = load(b, tmp_path)
    findings = by_node(found(model, "QDQ001"))
    assert set(findings) == {"a_q", "a_dq"}
    # Q and DQ share the scale, so this is not also a Q/DQ mismatch (a shared NaN used to be QDQ101).
    assert lint_codes(model) == ["QDQ001", "QDQ001"]
    for node, op in (("a_q", "QuantizeLinear"), ("a_dq", "DequantizeLinear")):
        f = findings[node]
        assert f.tensors == ("a_scale",)
        assert f.values == {"op": op, "problem": problem}
        assert f.fix is None
        assert f.message == f"{op} {node} has an invalid scale: {problem}"


def test_qdq001_one_bad_channel_of_a_per_axis_scale(tmp_path):
    b = GraphBuilder()
    b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.0, 0.3], axis=0), [4, 3])
    f = one(load(b, tmp_path), "QDQ001")
    assert (f.node, f.tensors, f.values["problem"]) == ("w", ("w_scale",), "scale 0 is not positive")


def test_qdq001_integer_scale(tmp_path):
    # An int32 scale breaks the type constraint, which only full_check sees: load_model accepts it.
    b = GraphBuilder()
    b.output(dq(b, q(b, b.input("x", [2, 3]), "q", scale=np.int32(1)), "dq"), [2, 3])
    f = one(load(b, tmp_path), "QDQ001")
    assert (f.node, f.tensors) == ("q", ("q_scale",))
    assert f.values == {"op": "QuantizeLinear", "problem": "scale type is int32, not a float type"}


def test_qdq001_double_scale(tmp_path):
    b = GraphBuilder()
    b.output(dq(b, b.init("w_q", i8([1, 2])), "dq", scale=np.float64(0.5)), [2])
    assert one(load(b, tmp_path), "QDQ001").values["problem"] == "scale type is double, not a float type"


@pytest.mark.parametrize("scale", [0.05, 1e-30, 3.0e38, f32([0.1, 0.2, 0.3, 0.4])])
def test_qdq001_clean_scales(tmp_path, scale):
    b = GraphBuilder()
    if np.ndim(scale):
        b.output(weight_dq(b, "w", (4, 3), scale, axis=0), [4, 3])
    else:
        b.output(qdq(b, b.input("x", [2, 3]), "a", scale=scale), [2, 3])
    assert found(load(b, tmp_path), "QDQ001") == []


def test_qdq001_float16_scale_and_cast_int_scale_are_clean(tmp_path):
    # opset 19 allows float16 scales; an int scale cast to float before the Q is a float scale.
    b = GraphBuilder(opset=19)
    x = b.input("x", [2, 3])
    b.output(qdq(b, x, "h", scale=np.float16(0.5)), [2, 3])
    s = b.node("Cast", [b.init("s_int", np.int32(2))], name="cast", to=TensorProto.FLOAT)
    xq = b.node("QuantizeLinear", [x, s, b.init("z", i8(0))], name="q")
    b.output(b.node("DequantizeLinear", [xq, s, "z"], name="dq"), [2, 3])
    assert found(load(b, tmp_path), "QDQ001") == []


# --- QDQ002 invalid-zero-point ----------------------------------------------------------------------


def test_qdq002_quantize_to_int32(tmp_path):
    # int32 on QuantizeLinear is a type-constraint violation; the checker without full_check lets it in.
    b = GraphBuilder()
    xq = q(b, b.input("x", [2, 3]), "q", zp=np.int32(0))
    b.output(dq(b, xq, "dq", zp=np.int32(0)), [2, 3])
    f = one(load(b, tmp_path), "QDQ002")  # the DQ reading int32 is legal (that is the bias case)
    assert (f.node, f.tensors, f.fix) == ("q", ("q_zp",), None)
    assert f.values == {"op": "QuantizeLinear", "problem": "QuantizeLinear cannot produce int32"}


def test_qdq002_quantize_to_int32_by_output_dtype(tmp_path):
    # opset 21: the type comes from `output_dtype` when there is no zero-point input.
    b = GraphBuilder(opset=21)
    xq = q(b, b.input("x", [2, 3]), "q", zp=None, output_dtype=TensorProto.INT32)
    b.output(dq(b, xq, "dq", zp=None), [2, 3])
    f = one(load(b, tmp_path), "QDQ002")
    assert (f.node, f.tensors, f.values["problem"]) == ("q", (), "QuantizeLinear cannot produce int32")


@pytest.mark.parametrize(
    ("dtype", "name"), [(ml_dtypes.float8_e4m3fn, "float8e4m3fn"), (ml_dtypes.float8_e5m2, "float8e5m2")]
)
def test_qdq002_float8_zero_point_not_zero(tmp_path, dtype, name):
    # float8 Q/DQ exist from opset 19.
    b = GraphBuilder(opset=19)
    b.output(qdq(b, b.input("x", [2, 3]), "a", zp=np.asarray(1.0, dtype)), [2, 3])
    findings = by_node(found(load(b, tmp_path), "QDQ002"))
    assert set(findings) == {"a_q", "a_dq"}
    assert findings["a_q"].tensors == ("a_zp",)
    assert findings["a_q"].values == {"op": "QuantizeLinear", "problem": f"{name} zero-point must be 0"}


@pytest.mark.parametrize(("zp", "type_name"), [(f32(0), "float"), (np.int64(0), "int64")])
def test_qdq002_zero_point_of_a_non_quantized_type(tmp_path, zp, type_name):
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [2, 3]), "a", zp=zp), [2, 3])
    findings = by_node(found(load(b, tmp_path), "QDQ002"))
    assert set(findings) == {"a_q", "a_dq"}
    assert findings["a_dq"].values == {"op": "DequantizeLinear", "problem": f"type {type_name} is not a quantized type"}


@pytest.mark.parametrize(
    ("opset", "zp"),
    [
        (17, i8(-3)),
        (17, np.uint8(128)),
        (17, np.int16(-1000)),
        (19, np.asarray(0.0, ml_dtypes.float8_e4m3fn)),
        (21, np.asarray(-2, ml_dtypes.int4)),
    ],
)
def test_qdq002_clean_zero_points(tmp_path, opset, zp):
    b = GraphBuilder(opset=opset)
    b.output(qdq(b, b.input("x", [2, 3]), "a", zp=zp), [2, 3])
    assert found(load(b, tmp_path), "QDQ002") == []


def test_qdq002_int32_bias_dequantize_and_default_uint8_are_clean(tmp_path):
    b = GraphBuilder()
    b.output(dq(b, b.init("bias", np.int32([5, -7])), "dq_bias", zp=None), [2])
    b.output(dq(b, q(b, b.input("x", [2]), "q_u8", zp=None), "dq_u8", zp=None), [2])
    assert found(load(b, tmp_path), "QDQ002") == []


def test_qdq002_empty_zero_point_does_not_crash(tmp_path):
    # An empty scale is QDQ001's problem; QDQ002 used to crash on min() of the empty zero-point.
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [2, 3]), "a", scale=f32([]), zp=i8([])), [2, 3])
    model = load(b, tmp_path)
    assert found(model, "QDQ002") == []
    assert {f.values["problem"] for f in found(model, "QDQ001")} == {"scale is empty"}


# --- QDQ003 invalid-axis ----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [2, -3, 7])
def test_qdq003_axis_out_of_range(tmp_path, axis):
    b = GraphBuilder()
    b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=axis), [4, 3])
    f = one(load(b, tmp_path), "QDQ003")
    assert (f.node, f.tensors, f.fix) == ("w", ("w_w", "w_scale"), None)
    assert f.values == {"op": "DequantizeLinear", "problem": f"axis {axis} is out of range for a rank-2 input"}


def test_qdq003_per_axis_length_mismatch(tmp_path):
    # 4 scales, but axis 1 (the default) has size 3: the classic "forgot axis=0" bug.
    b = GraphBuilder()
    b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4]), [4, 3])
    f = one(load(b, tmp_path), "QDQ003")
    assert (f.node, f.tensors) == ("w", ("w_w", "w_scale"))
    assert f.values == {"op": "DequantizeLinear", "problem": "4 scales for axis 1, whose size is 3"}


def test_qdq003_per_axis_activation_mismatch(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 3, 5])
    xq = q(b, x, "q", scale=f32([0.1, 0.2, 0.3]), zp=i8([0, 0, 0]), axis=2)
    b.output(dq(b, xq, "dq", scale=f32([0.1, 0.2, 0.3]), zp=i8([0, 0, 0]), axis=1), [2, 3, 5])
    f = one(load(b, tmp_path), "QDQ003")
    assert (f.node, f.tensors) == ("q", ("x", "q_scale"))
    assert f.values["problem"] == "3 scales for axis 2, whose size is 5"


@pytest.mark.parametrize("axis", [0, -2])
def test_qdq003_correct_per_channel_weight_is_clean(tmp_path, axis):
    b = GraphBuilder()
    b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=axis), [4, 3])
    model = load(b, tmp_path)
    assert found(model, "QDQ003") == []
    assert lint_codes(model) == []


def test_qdq003_per_tensor_ignores_axis_and_blocked_is_clean(tmp_path):
    # A per-tensor scale makes `axis` meaningless; a valid blocked DQ (opset 21) is fine too.
    b = GraphBuilder(opset=21)
    b.output(weight_dq(b, "pt", (4, 3), 0.1, axis=5), [4, 3])
    b.output(weight_dq(b, "blk", (4, 6), np.full((4, 2), 0.1), axis=1, block_size=3), [4, 6])
    assert found(load(b, tmp_path), "QDQ003") == []


def test_qdq003_model_the_checker_rejects_is_checked_unvalidated(tmp_path):
    # `axis` only exists from opset 13: onnx.checker rejects this opset-10 model, so load_model does
    # too. The rule itself still works on the graph, imported without the checker.
    b = GraphBuilder(opset=10)
    b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=2), [4, 3])
    with pytest.raises(ModelLoadError, match="invalid ONNX model"):
        load(b, tmp_path)
    f = one(load_unchecked(b, tmp_path), "QDQ003")
    assert (f.node, f.values["problem"]) == ("w", "axis 2 is out of range for a rank-2 input")


# --- QDQ004 qparam-shape-mismatch -------------------------------------------------------------------


def test_qdq004_zero_point_shape_differs_from_scale(tmp_path):
    b = GraphBuilder()
    b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], zp=i8(0), axis=0), [4, 3])
    f = one(load(b, tmp_path), "QDQ004")
    assert (f.node, f.tensors, f.fix) == ("w", ("w_scale", "w_zp"), None)
    assert f.values == {"op": "DequantizeLinear", "problem": "zero-point shape [] differs from scale shape [4]"}


def test_qdq004_two_dimensional_scale_without_block_size(tmp_path):
    b = GraphBuilder()
    b.output(weight_dq(b, "w", (4, 3), np.full((4, 1), 0.1), axis=0), [4, 3])
    f = one(load(b, tmp_path), "QDQ004")
    assert (f.node, f.tensors) == ("w", ("w_scale", "w_zp"))
    assert f.values["problem"] == "scale of shape [4, 1] needs block_size (only scalar or 1-D scales otherwise)"


def test_qdq004_blocked_scale_of_the_wrong_rank(tmp_path):
    b = GraphBuilder(opset=21)
    b.output(weight_dq(b, "w", (4, 6), np.full(8, 0.1), axis=1, block_size=3), [4, 6])
    f = one(load(b, tmp_path), "QDQ004")
    assert f.values["problem"] == "blocked scale has rank 1, the input has rank 2"


def test_qdq004_one_element_scale_with_scalar_zero_point_is_left_to_qdq201(tmp_path):
    # onnxruntime's quantizer writes int32 bias DQs with a [1] scale and a 0-d zero-point, and runs
    # them: not an error (it used to be), only QDQ201's non-scalar warning. A [1, 1] zero-point next to
    # a [1] scale is rejected by onnxruntime, so that one stays QDQ004.
    b = GraphBuilder()
    b.output(dq(b, b.init("bias", np.int32([5, -7])), "bias_dq", scale=f32([0.001]), zp=np.int32(0)), [2])
    b.output(dq(b, b.init("w", i8([1, 2])), "bad_dq", scale=f32([0.1]), zp=i8([[0]])), [2])
    model = load(b, tmp_path)
    f = one(model, "QDQ004")
    assert (f.node, f.values["problem"]) == ("bad_dq", "zero-point shape [1, 1] differs from scale shape [1]")
    assert {(f.node, f.values["what"], tuple(f.values["shape"])) for f in found(model, "QDQ201")} == {
        ("bias_dq", "scale", (1,)), ("bad_dq", "scale and zero-point", (1,)),
    }
    assert len(found(model, "QDQ201")) == 2


def test_qdq004_matching_shapes_are_clean(tmp_path):
    b = GraphBuilder(opset=21)
    b.output(weight_dq(b, "pc", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=0), [4, 3])
    b.output(weight_dq(b, "pt", (4, 3), 0.1), [4, 3])
    b.output(weight_dq(b, "nozp", (4, 3), [0.1, 0.2, 0.3, 0.4], zp=None, axis=0), [4, 3])
    b.output(weight_dq(b, "blk", (4, 6), np.full((4, 2), 0.1), axis=1, block_size=3), [4, 6])
    model = load(b, tmp_path)
    assert found(model, "QDQ004") == []
    assert lint_codes(model) == []


# --- QDQ005 dynamic-qparams -------------------------------------------------------------------------


def test_qdq005_scale_computed_by_div(tmp_path):
    # Dynamic quantization: scale = ReduceMax(Abs(x)) / 127.
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    amax = b.node("ReduceMax", [b.node("Abs", [x], name="abs")], name="amax", keepdims=0)
    scale = b.node("Div", [amax, b.init("c127", f32(127))], name="div")
    xq = b.node("QuantizeLinear", [x, scale, b.init("zp", i8(0))], name="q")
    b.output(b.node("DequantizeLinear", [xq, scale, "zp"], name="dq"), [2, 3])
    findings = by_node(found(load(b, tmp_path), "QDQ005"))
    assert set(findings) == {"q", "dq"}
    assert findings["q"].tensors == ("div_out",)
    assert findings["q"].values == {"op": "QuantizeLinear", "what": "scale"}
    assert findings["dq"].message == "DequantizeLinear dq reads a scale computed at run time"
    assert findings["dq"].fix is None


def test_qdq005_zero_point_from_a_graph_input(tmp_path):
    b = GraphBuilder()
    zp = b.input("zp", [], TensorProto.INT8)
    b.output(b.node("DequantizeLinear", [b.init("w", i8([1, 2])), b.init("s", f32(0.5)), zp], name="dq"), [2])
    f = one(load(b, tmp_path), "QDQ005")
    assert (f.node, f.tensors, f.values) == ("dq", ("zp",), {"op": "DequantizeLinear", "what": "zero-point"})


def test_qdq005_constant_node_and_initializer_are_clean(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    s = b.node("Constant", [], name="s", value=helper.make_tensor("s_v", TensorProto.FLOAT, [], [0.05]))
    z = b.node("Constant", [], name="z", value=helper.make_tensor("z_v", TensorProto.INT8, [], [0]))
    xq = b.node("QuantizeLinear", [x, s, z], name="q")
    b.output(b.node("DequantizeLinear", [xq, s, z], name="dq"), [2, 3])
    b.output(qdq(b, b.input("y", [2, 3]), "init"), [2, 3])
    model = load(b, tmp_path)
    assert found(model, "QDQ005") == []
    assert lint_codes(model) == []


# --- QDQ101 qdq-param-mismatch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dq_scale", "dq_zp", "detail"),
    [
        (0.04, i8(0), "different scale"),
        (0.02, i8(3), "different zero-point"),
        (0.02, np.uint8(0), "different types"),
    ],
)
def test_qdq101_dequantize_with_other_params(tmp_path, dq_scale, dq_zp, detail):
    b = GraphBuilder()
    xq = q(b, b.input("x", [2, 3]), "q", scale=0.02)
    b.output(dq(b, xq, "dq", scale=dq_scale, zp=dq_zp), [2, 3])
    f = one(load(b, tmp_path), "QDQ101")
    assert (f.node, f.tensors, f.fix) == ("dq", ("q_out", "q_scale", "dq_scale"), None)
    assert (f.values["quantize"], f.values["detail"]) == ("q", detail)
    assert f.values["q"] == {"dtype": "int8", "granularity": "per-tensor", "scale": float(f32(0.02)), "zero_point": 0.0}
    assert f.values["dq"]["scale"] == float(f32(dq_scale))
    assert f.message == f"DequantizeLinear dq reads q with different parameters ({detail})"


def test_qdq101_sees_through_a_cast_between_q_and_dq(tmp_path):
    b = GraphBuilder()
    xq = q(b, b.input("x", [2, 3]), "q", scale=0.02)
    cast = b.node("Cast", [xq], name="cast", to=TensorProto.INT8)
    b.output(dq(b, cast, "dq", scale=0.04), [2, 3])
    f = one(load(b, tmp_path), "QDQ101")
    assert (f.node, f.values["quantize"], f.values["detail"]) == ("dq", "q", "different scale")


def test_qdq101_per_axis_scales_of_different_length(tmp_path):
    # Used to be reported as "different zero-point" because only equal-length scales were compared.
    b = GraphBuilder()
    xq = q(b, b.input("x", [2, 3]), "q", scale=f32([0.1, 0.2, 0.3]), zp=i8([0, 0, 0]))
    b.output(dq(b, xq, "dq", scale=f32([0.1, 0.2]), zp=i8([0, 0])), [2, 3])
    assert one(load(b, tmp_path), "QDQ101").values["detail"] == "different scale"


def test_qdq101_equal_params_in_separate_initializers_are_clean(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    b.output(dq(b, q(b, x, "q", scale=0.02, zp=i8(1)), "dq", scale=0.02, zp=i8(1)), [2, 3])
    b.output(qdq(b, b.input("y", [2, 3]), "shared", scale=0.5), [2, 3])
    b.output(dq(b, q(b, b.input("z", [2, 3]), "q_nozp", zp=None), "dq_u8", zp=np.uint8(0)), [2, 3])
    model = load(b, tmp_path)
    assert found(model, "QDQ101") == []
    assert lint_codes(model) == []


# --- QDQ102 noop-requantize / QDQ103 requantize-chain -----------------------------------------------


def dq_then_q(
    b: GraphBuilder, first_scale, second_scale, via_identity: bool = False, out_is_output: bool = False
) -> str:
    """x → a_q → a_dq (→ Identity) → b_q → b_dq → y (or b_q's output as the graph output)."""
    a = qdq(b, b.input("x", [4, 8]), "a", scale=first_scale)
    if via_identity:
        a = b.node("Identity", [a], name="id")
    bq = b.node("QuantizeLinear", [a, b.init("b_scale", f32(second_scale)), b.init("b_zp", i8(0))], name="b_q")
    if out_is_output:
        b.output(bq, [4, 8], TensorProto.INT8)
        return bq
    return b.output(b.node("DequantizeLinear", [bq, "b_scale", "b_zp"], ["y"], name="b_dq"), [4, 8])


@pytest.mark.parametrize("via_identity", [False, True])
def test_qdq102_noop_requantize(tmp_path, via_identity):
    b = GraphBuilder()
    dq_then_q(b, 0.05, 0.05, via_identity)
    model = load(b, tmp_path)
    f = one(model, "QDQ102")
    assert (f.node, f.tensors, f.fix) == ("b_q", ("a_q_out", "b_q_out"), EXACT)
    assert f.values == {"dequantize": "a_dq"}
    assert f.message == "DequantizeLinear a_dq → QuantizeLinear b_q with identical parameters is a no-op"
    assert found(model, "QDQ103") == []


@pytest.mark.parametrize("via_identity", [False, True])
def test_qdq102_fix_is_exact_and_idempotent(tmp_path, via_identity):
    b = GraphBuilder()
    dq_then_q(b, 0.05, 0.05, via_identity)
    changes, fixed = assert_exact_fix(save(b, tmp_path), "QDQ102", tmp_path, {"x": rand(4, 8)})
    assert [(c.node, c.old, c.new) for c in changes] == [("b_q", "b_q_out", "a_q_out")]
    assert [n.name for n in fixed.graph.nodes] == ["a_q", "b_dq"]
    assert fixed.graph.nodes[1].inputs[0].name == "a_q_out"


def test_qdq102_quantize_writing_a_graph_output_is_not_fixed(tmp_path):
    b = GraphBuilder()
    dq_then_q(b, 0.05, 0.05, out_is_output=True)
    model = load(b, tmp_path)
    assert one(model, "QDQ102").fix is None
    assert_fix_leaves_alone(model, "QDQ102")


@pytest.mark.parametrize("via_identity", [False, True])
def test_qdq103_requantize_chain(tmp_path, via_identity):
    b = GraphBuilder()
    dq_then_q(b, 0.05, 0.1, via_identity)
    model = load(b, tmp_path)
    f = one(model, "QDQ103")
    assert (f.node, f.tensors, f.fix) == ("b_q", ("a_q_out", "b_q_out"), None)
    assert f.values == {"dequantize": "a_dq", "old_scale": "0.05", "new_scale": "0.1"}
    assert f.message == "DequantizeLinear a_dq → QuantizeLinear b_q requantizes (scale 0.05 → 0.1)"
    assert found(model, "QDQ102") == []


def test_qdq103_per_axis_weight_requantized_per_tensor(tmp_path):
    b = GraphBuilder()
    w = weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=0)
    b.output(dq(b, q(b, w, "q", scale=0.1), "dq", scale=0.1), [4, 3])
    f = one(load(b, tmp_path), "QDQ103")
    assert (f.node, f.values["old_scale"], f.values["new_scale"]) == ("q", "4 per-axis values", "0.1")


def test_qdq102_and_qdq103_ignore_a_plain_pair_and_an_op_in_between(tmp_path):
    # DQ → Relu → Q is a real computation, not a requantization of the same value.
    b = GraphBuilder()
    a = qdq(b, b.input("x", [4, 8]), "a")
    b.output(qdq(b, b.node("Relu", [a], name="relu"), "b", scale=0.1), [4, 8])
    model = load(b, tmp_path)
    assert found(model, "QDQ102") == [] and found(model, "QDQ103") == []
    assert lint_codes(model) == []


# --- QDQ104 duplicate-quantize ----------------------------------------------------------------------


def two_quantizes(b: GraphBuilder, second_scale: float, second_is_output: bool = False) -> None:
    x = b.input("x", [4, 8])
    b.output(dq(b, q(b, x, "q1", scale=0.1), "dq1", scale=0.1), [4, 8])
    q2 = q(b, x, "q2", scale=second_scale)
    if second_is_output:
        b.output(q2, [4, 8], TensorProto.INT8)
    else:
        b.output(dq(b, q2, "dq2", scale=second_scale), [4, 8])


def test_qdq104_duplicate_with_same_params(tmp_path):
    b = GraphBuilder()
    two_quantizes(b, 0.1)
    f = one(load(b, tmp_path), "QDQ104")
    assert (f.node, f.tensors, f.fix) == ("q2", ("x", "q2_out"), EXACT)
    assert f.values == {"tensor": "x", "first": "q1", "detail": ""}
    assert f.message == "x is quantized again by q2 (first by q1)"


def test_qdq104_duplicate_with_different_params_has_no_fix(tmp_path):
    b = GraphBuilder()
    two_quantizes(b, 0.2)
    model = load(b, tmp_path)
    f = one(model, "QDQ104")
    assert (f.node, f.fix, f.values["detail"]) == ("q2", None, " with different parameters")
    assert f.message == "x is quantized again by q2 (first by q1) with different parameters"
    assert_fix_leaves_alone(model, "QDQ104")


def test_qdq104_duplicate_writing_a_graph_output_has_no_fix(tmp_path):
    b = GraphBuilder()
    two_quantizes(b, 0.1, second_is_output=True)
    model = load(b, tmp_path)
    assert one(model, "QDQ104").fix is None
    assert_fix_leaves_alone(model, "QDQ104")


def test_qdq104_fix_is_exact_and_idempotent(tmp_path):
    b = GraphBuilder()
    two_quantizes(b, 0.1)
    changes, fixed = assert_exact_fix(save(b, tmp_path), "QDQ104", tmp_path, {"x": rand(4, 8)})
    assert [(c.node, c.old, c.new) for c in changes] == [("q2", "q2_out", "q1_out")]
    assert "q2" not in {n.name for n in fixed.graph.nodes}
    assert found(fixed, "QDQ104") == []


def test_qdq104_one_quantize_per_tensor_is_clean(tmp_path):
    # One Q read by two DQs (fan-out) is the normal case, not a duplicate.
    b = GraphBuilder()
    xq = q(b, b.input("x", [4, 8]), "q", scale=0.1)
    b.output(dq(b, xq, "dq1", scale=0.1), [4, 8])
    b.output(dq(b, xq, "dq2", scale=0.1), [4, 8])
    model = load(b, tmp_path)
    assert found(model, "QDQ104") == []
    assert lint_codes(model) == []


# --- QDQ201 non-scalar-qparams ----------------------------------------------------------------------


def save_inferred(b: GraphBuilder, tmp_path: Path, name: str = "m.onnx") -> Path:
    """Save with shape inference run first, so intermediate tensors carry value_info as in real exports."""
    path = tmp_path / name
    onnx.save(onnx.shape_inference.infer_shapes(b.model(), strict_mode=True), str(path))
    return path


def test_qdq201_one_element_scale_and_zero_point_shared_by_q_and_dq(tmp_path):
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [4, 8]), "a", scale=f32([0.05]), zp=i8([0])), [4, 8])
    findings = found(load(b, tmp_path), "QDQ201")
    got = {(f.node, f.tensors, f.values["what"]) for f in findings}
    assert got == {
        ("a_q", ("a_scale", "a_zp"), "scale and zero-point"),
        ("a_dq", ("a_scale", "a_zp"), "scale and zero-point"),
    }
    assert len(findings) == 2
    assert all(f.values["shape"] == [1] and f.fix is EXACT for f in findings)
    assert (
        "QuantizeLinear a_q has a 1-element scale and zero-point of shape [1]; per-tensor parameters should be scalars"
        in {f.message for f in findings}
    )


def test_qdq201_scalar_per_axis_and_empty_params_are_clean(tmp_path):
    # An empty scale is not "1-element": it is QDQ001's error, and reshaping it to 0-d would crash.
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [4, 8]), "scalar", scale=0.05), [4, 8])
    b.output(weight_dq(b, "pc", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=0), [4, 3])
    b.output(qdq(b, b.input("y", [4, 8]), "empty", scale=f32([]), zp=i8([])), [4, 8])
    model = load(b, tmp_path)
    assert found(model, "QDQ201") == []
    assert lint_codes(model) == ["QDQ001", "QDQ001"]


@pytest.mark.parametrize(
    ("opset", "zp"),
    [
        (17, i8([3])),
        (17, np.uint8([128])),
        (19, np.asarray([0.0], ml_dtypes.float8_e4m3fn)),
        (21, np.asarray([-1], ml_dtypes.int4)),
    ],
)
def test_qdq201_fix_is_exact_and_idempotent(tmp_path, opset, zp):
    b = GraphBuilder(opset=opset)
    b.output(qdq(b, b.input("x", [4, 8]), "a", scale=f32([0.05]), zp=zp), [4, 8])
    changes, fixed = assert_exact_fix(save_inferred(b, tmp_path), "QDQ201", tmp_path, {"x": rand(4, 8)})
    # The shared initializers are reshaped in place, once each.
    assert sorted((c.tensor, c.old, c.new) for c in changes) == [("a_scale", [1], []), ("a_zp", [1], [])]
    tensors = fixed.graph.tensors()
    assert tuple(tensors["a_scale"].shape) == () and tuple(tensors["a_zp"].shape) == ()
    assert found(fixed, "QDQ201") == []


def test_qdq201_fix_keeps_the_shape_other_readers_see(tmp_path):
    # The [1] scale is also read by a Mul and, through an Identity, is a graph output: those keep [1],
    # Q and DQ get one new scalar each parameter, still shared. (The Identity-to-output case used to
    # be reshaped in place, which changed the output's shape.)
    b = GraphBuilder()
    x = b.input("x", [4, 8])
    b.output(qdq(b, x, "a", scale=f32([0.05]), zp=i8([0])), [4, 8])
    b.output(b.node("Mul", [b.input("one", []), "a_scale"], ["scaled"], name="mul"), [1])
    b.output(b.node("Identity", ["a_zp"], ["zp_copy"], name="copy"), [1], TensorProto.INT8)
    feeds = {"x": rand(4, 8), "one": f32(1.0)}
    changes, fixed = assert_exact_fix(save_inferred(b, tmp_path), "QDQ201", tmp_path, feeds)
    assert sorted((c.node, c.tensor) for c in changes) == [
        ("a_dq", "a_scale_scalar"), ("a_dq", "a_zp_scalar"), ("a_q", "a_scale_scalar"), ("a_q", "a_zp_scalar"),
    ]
    tensors = fixed.graph.tensors()
    assert tuple(tensors["a_scale"].shape) == (1,) and tuple(tensors["a_zp"].shape) == (1,)
    assert tuple(tensors["a_scale_scalar"].shape) == () and tensors["a_scale_scalar"].values == f32(0.05)


def test_qdq201_fix_of_a_constant_node_read_by_another_op(tmp_path):
    # A Constant node's value is not an initializer: its readers are those of the node's output.
    b = GraphBuilder()
    s = b.node("Constant", [], ["s"], name="s_const", value=helper.make_tensor("s_v", TensorProto.FLOAT, [1], [0.05]))
    xq = b.node("QuantizeLinear", [b.input("x", [4, 8]), s, b.init("zp", i8(0))], name="q")
    b.output(b.node("DequantizeLinear", [xq, s, "zp"], name="dq"), [4, 8])
    b.output(b.node("Identity", [s], ["s_copy"], name="copy"), [1])
    findings = found(load(b, tmp_path), "QDQ201")
    got = {(f.node, f.tensors, f.values["what"]) for f in findings}
    assert got == {("q", ("s",), "scale"), ("dq", ("s",), "scale")}
    changes, fixed = assert_exact_fix(save_inferred(b, tmp_path), "QDQ201", tmp_path, {"x": rand(4, 8)})
    assert sorted((c.node, c.tensor) for c in changes) == [("dq", "s_v_scalar"), ("q", "s_v_scalar")]
    q_node = next(n for n in fixed.graph.nodes if n.name == "q")
    assert q_node.inputs[1].name == "s_v_scalar" and tuple(q_node.inputs[1].shape) == ()


def test_qdq201_fix_through_identity_with_value_info(tmp_path):
    # The PyTorch layout: [1] initializer → Identity → Q/DQ, with value_info on the Identity output.
    b = GraphBuilder()
    s = b.node("Identity", [b.init("s", f32([0.05]))], ["s_id"], name="s_identity")
    z = b.node("Identity", [b.init("z", i8([2]))], ["z_id"], name="z_identity")
    xq = b.node("QuantizeLinear", [b.input("x", [4, 8]), s, z], name="q")
    b.output(b.node("DequantizeLinear", [xq, s, z], name="dq"), [4, 8])
    assert sorted((f.node, f.tensors) for f in found(load(b, tmp_path), "QDQ201")) == [
        ("dq", ("s_id", "z_id")), ("q", ("s_id", "z_id")),
    ]
    assert_exact_fix(save_inferred(b, tmp_path), "QDQ201", tmp_path, {"x": rand(4, 8)})


def test_qdq201_fix_of_a_cast_scale_read_elsewhere_keeps_the_cast_type(tmp_path):
    # float64 [1] → Cast(float) → Q/DQ, the float64 tensor also a graph output: the new scalar must be
    # the float32 value the Q/DQ read, not the float64 initializer (which would be an invalid scale).
    b = GraphBuilder()
    s = b.node("Cast", [b.init("s64", np.float64([0.1]))], ["s32"], name="cast", to=TensorProto.FLOAT)
    xq = b.node("QuantizeLinear", [b.input("x", [4, 8]), s, b.init("zp", i8(0))], name="q")
    b.output(b.node("DequantizeLinear", [xq, s, "zp"], name="dq"), [4, 8])
    b.output(b.node("Identity", ["s64"], ["s_copy"], name="copy"), [1], TensorProto.DOUBLE)
    changes, fixed = assert_exact_fix(save_inferred(b, tmp_path), "QDQ201", tmp_path, {"x": rand(4, 8)})
    scalar = fixed.graph.tensors()["s64_scalar"]
    assert scalar.dtype == np.float32 and scalar.values == f32(0.1)
    assert lint_codes(fixed) == []  # the Q/DQ read the scalar directly: no Cast left in the way (QDQ202)


# --- QDQ202 qparam-pass-through ---------------------------------------------------------------------


def pass_through_model(b: GraphBuilder) -> None:
    """Four Q/DQ pairs, each reading a parameter through a different Identity/Cast chain."""
    # a: zero-point through an Identity (the FX export's zero-points).
    zp = b.node("Identity", [b.init("a_zp", i8(3))], ["a_zp_id"], name="a_zp_identity")
    xq = b.node("QuantizeLinear", [b.input("x", [4, 8]), b.init("a_scale", f32(0.05)), zp], name="a_q")
    b.output(b.node("DequantizeLinear", [xq, "a_scale", zp], name="a_dq"), [4, 8])
    # b: a float64 scale cast to float32.
    s = b.node("Cast", [b.init("b_s64", np.float64(0.0123))], ["b_s32"], name="b_cast", to=TensorProto.FLOAT)
    xq = b.node("QuantizeLinear", [b.input("y", [4, 8]), s, b.init("b_zp", i8(0))], name="b_q")
    b.output(b.node("DequantizeLinear", [xq, s, "b_zp"], name="b_dq"), [4, 8])
    # c: scale through two Identities.
    s = b.node("Identity", [b.node("Identity", [b.init("c_scale", f32(0.2))], name="c_id1")], ["c_s"], name="c_id2")
    xq = b.node("QuantizeLinear", [b.input("z", [4, 8]), s, b.init("c_zp", i8(0))], name="c_q")
    b.output(b.node("DequantizeLinear", [xq, s, "c_zp"], name="c_dq"), [4, 8])
    # d: a Constant node's scale through an Identity.
    value = helper.make_tensor("d_v", TensorProto.FLOAT, [], [0.5])
    c = b.node("Constant", [], ["d_const"], name="d_constant", value=value)
    s = b.node("Identity", [c], ["d_s"], name="d_identity")
    xq = b.node("QuantizeLinear", [b.input("w", [4, 8]), s, b.init("d_zp", i8(0))], name="d_q")
    b.output(b.node("DequantizeLinear", [xq, s, "d_zp"], name="d_dq"), [4, 8])


PASS_THROUGH_FEEDS = {name: rand(4, 8, seed=i) for i, name in enumerate("xyzw")}


def test_qdq202_parameters_through_identity_and_cast(tmp_path):
    b = GraphBuilder()
    pass_through_model(b)
    model = load(b, tmp_path)
    got = {(f.node, f.tensors, f.values["what"], f.values["chain"]) for f in found(model, "QDQ202")}
    assert got == {
        ("a_q", ("a_zp_id",), "zero-point", "Identity"), ("a_dq", ("a_zp_id",), "zero-point", "Identity"),
        ("b_q", ("b_s32",), "scale", "Cast"), ("b_dq", ("b_s32",), "scale", "Cast"),
        ("c_q", ("c_s",), "scale", "Identity → Identity"), ("c_dq", ("c_s",), "scale", "Identity → Identity"),
        ("d_q", ("d_s",), "scale", "Identity"), ("d_dq", ("d_s",), "scale", "Identity"),
    }
    f = by_node(found(model, "QDQ202"))["a_q"]
    assert f.fix is EXACT and f.message == "QuantizeLinear a_q reads its zero-point through Identity"
    assert set(lint_codes(model)) == {"QDQ202"}


def test_qdq202_initializer_and_constant_node_are_clean(tmp_path):
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [4, 8]), "a"), [4, 8])
    s = b.node("Constant", [], ["c_s"], name="c_const", value=helper.make_tensor("c_v", TensorProto.FLOAT, [], [0.5]))
    xq = b.node("QuantizeLinear", [b.input("y", [4, 8]), s, b.init("c_zp", i8(0))], name="c_q")
    b.output(b.node("DequantizeLinear", [xq, s, "c_zp"], name="c_dq"), [4, 8])
    model = load(b, tmp_path)
    assert found(model, "QDQ202") == []
    assert lint_codes(model) == []


def test_qdq202_fix_is_exact_and_idempotent(tmp_path):
    b = GraphBuilder()
    pass_through_model(b)
    changes, fixed = assert_exact_fix(save_inferred(b, tmp_path), "QDQ202", tmp_path, PASS_THROUGH_FEEDS)
    assert len(changes) == 8
    nodes = {n.name: n for n in fixed.graph.nodes}
    assert not any(n.op in ("Identity", "Cast") for n in fixed.graph.nodes)
    assert nodes["a_q"].inputs[2].name == nodes["a_dq"].inputs[2].name == "a_zp"
    # The cast scale is computed ahead of time, once for both nodes, as float32.
    b_scale = nodes["b_q"].inputs[1]
    assert b_scale is nodes["b_dq"].inputs[1] and b_scale.values.dtype == np.float32
    assert b_scale.values == f32(0.0123)
    assert nodes["d_q"].inputs[1].name == "d_const"
    assert lint_codes(fixed) == []


def test_qdq202_fix_applies_every_cast_in_order(tmp_path):
    # float64 → float16 → float32: the Q sees the float16-rounded value. Casting the float64 straight
    # to the last Cast's type (float32) gave a different scale, so the "exact" fix changed outputs.
    b = GraphBuilder()
    s16 = b.node("Cast", [b.init("s64", np.float64(0.0123))], name="to16", to=TensorProto.FLOAT16)
    s = b.node("Cast", [s16], ["s32"], name="to32", to=TensorProto.FLOAT)
    xq = b.node("QuantizeLinear", [b.input("x", [4, 8]), s, b.init("zp", i8(0))], name="q")
    b.output(b.node("DequantizeLinear", [xq, s, "zp"], name="dq"), [4, 8])
    assert {f.values["chain"] for f in found(load(b, tmp_path), "QDQ202")} == {"Cast → Cast"}
    _, fixed = assert_exact_fix(save_inferred(b, tmp_path), "QDQ202", tmp_path, {"x": rand(4, 8)})
    scale = next(n for n in fixed.graph.nodes if n.name == "q").inputs[1]
    assert scale.values == np.float32(np.float16(0.0123)) != f32(0.0123)


# --- QDQ203 pass-through-between-qdq ----------------------------------------------------------------


def q_through_dq(b: GraphBuilder, op: str) -> None:
    """x → q → (Cast to int8 | Identity) → dq → y: the TorchScript reference export's pattern."""
    xq = q(b, b.input("x", [4, 8]), "q")
    attrs = {"to": TensorProto.INT8} if op == "Cast" else {}
    mid = b.node(op, [xq], ["mid"], name="mid", **attrs)
    b.output(dq(b, mid, "dq"), [4, 8])


@pytest.mark.parametrize("op", ["Cast", "Identity"])
def test_qdq203_no_op_between_q_and_dq(tmp_path, op):
    b = GraphBuilder()
    q_through_dq(b, op)
    model = load(b, tmp_path)
    f = one(model, "QDQ203")
    assert (f.node, f.tensors, f.fix) == ("dq", ("q_out", "mid"), EXACT)
    assert f.values == {"quantize": "q", "chain": op}
    assert f.message == f"{op} between QuantizeLinear q and DequantizeLinear dq does nothing"
    assert lint_codes(model) == ["QDQ203"]


@pytest.mark.parametrize("op", ["Cast", "Identity"])
def test_qdq203_fix_is_exact_and_idempotent(tmp_path, op):
    b = GraphBuilder()
    q_through_dq(b, op)
    changes, fixed = assert_exact_fix(save(b, tmp_path), "QDQ203", tmp_path, {"x": rand(4, 8)})
    assert [(c.node, c.old, c.new) for c in changes] == [("dq", "mid", "q_out")]
    assert [n.op for n in fixed.graph.nodes] == ["QuantizeLinear", "DequantizeLinear"]


def test_qdq203_direct_pair_and_a_type_changing_cast_are_clean(tmp_path):
    # Cast(to=UINT8) of an int8 tensor changes the values (wraps negatives): it is not a no-op.
    b = GraphBuilder()
    b.output(qdq(b, b.input("x", [4, 8]), "a"), [4, 8])
    xq = q(b, b.input("y", [4, 8]), "q")
    cast = b.node("Cast", [xq], name="cast", to=TensorProto.UINT8)
    b.output(dq(b, cast, "dq", zp=np.uint8(0)), [4, 8])
    model = load(b, tmp_path)
    assert found(model, "QDQ203") == []
    assert lint_codes(model) == []


# --- QDQ301 dangling-qdq ----------------------------------------------------------------------------


def dangling_model(b: GraphBuilder) -> None:
    """A used pair, a Q nobody reads, and a weight DQ nobody reads."""
    x = b.input("x", [4, 8])
    b.output(qdq(b, x, "used"), [4, 8])
    q(b, x, "lost_q", scale=0.1)
    weight_dq(b, "lost_dq", (2, 2), 0.1)


def test_qdq301_dangling_q_and_dq(tmp_path):
    b = GraphBuilder()
    dangling_model(b)
    findings = by_node(found(load(b, tmp_path), "QDQ301"))
    assert set(findings) == {"lost_q", "lost_dq"}
    assert findings["lost_q"].tensors == ("lost_q_out",)
    assert findings["lost_q"].values == {"op": "QuantizeLinear"}
    assert findings["lost_dq"].message == "DequantizeLinear lost_dq has no consumers"
    assert all(f.fix is EXACT for f in findings.values())


def test_qdq301_fix_is_exact_and_idempotent(tmp_path):
    b = GraphBuilder()
    dangling_model(b)
    changes, fixed = assert_exact_fix(save(b, tmp_path), "QDQ301", tmp_path, {"x": rand(4, 8)})
    assert sorted((c.node, c.old) for c in changes) == [("lost_dq", "DequantizeLinear"), ("lost_q", "QuantizeLinear")]
    assert sorted(n.name for n in fixed.graph.nodes) == ["used_dq", "used_q"]
    assert sorted(fixed.graph.tensors()) == ["used_dq_out", "used_q_out", "used_scale", "used_zp", "x"]


def test_qdq301_q_or_dq_writing_a_graph_output_is_not_dangling(tmp_path):
    b = GraphBuilder()
    xq = q(b, b.input("x", [4, 8]), "q")
    b.output(xq, [4, 8], TensorProto.INT8)
    b.output(dq(b, xq, "dq"), [4, 8])
    model = load(b, tmp_path)
    assert found(model, "QDQ301") == []
    assert lint_codes(model) == []


# --- a PyTorch reference-export artefact chain (torch-fx-export.md §5.3) ----------------------------


def torch_reference_export(b: GraphBuilder) -> None:
    """x → Q → Cast(to=INT8) → DQ → Conv(W: float → Q → Cast → DQ) → Q → Cast → DQ → y, as the
    TorchScript exporter writes an FX reference model: every scale and zero-point a [1] tensor that
    each Q and DQ reads through its own Identity."""

    def qcd(x: str, name: str, scale: float) -> str:
        s, z = b.init(f"{name}_scale", f32([scale])), b.init(f"{name}_zp", i8([0]))
        ids = [b.node("Identity", [t], [f"{t}_{op}"], name=f"{t}_{op}_identity") for op in ("q", "dq") for t in (s, z)]
        xq = b.node("QuantizeLinear", [x, ids[0], ids[1]], name=f"{name}_q")
        cast = b.node("Cast", [xq], name=f"{name}_cast", to=TensorProto.INT8)
        return b.node("DequantizeLinear", [cast, ids[2], ids[3]], name=f"{name}_dq")

    x = qcd(b.input("x", [1, 3, 8, 8]), "x", 0.0625)
    w = qcd(b.init("w", rand(4, 3, 3, 3, seed=1, spread=0.2)), "w", 0.005)
    conv = b.node("Conv", [x, w, b.init("bias", rand(4, seed=2, spread=0.1))], name="conv", pads=[1, 1, 1, 1])
    b.output(qcd(conv, "y", 0.125), [1, 4, 8, 8])


def test_torch_reference_export_triggers_exactly_the_artefact_rules(tmp_path):
    b = GraphBuilder(opset=13)
    torch_reference_export(b)
    codes = lint_codes(load(b, tmp_path))
    # 3 Q/DQ pairs: 6 Q/DQ nodes with [1]-shaped parameters (one finding each, scale and zero-point
    # together), 12 Identity-routed parameters, 3 no-op Casts.
    assert {code: codes.count(code) for code in set(codes)} == {"QDQ201": 6, "QDQ202": 12, "QDQ203": 3}


@pytest.mark.parametrize("order", [("QDQ201", "QDQ202", "QDQ203"), ("QDQ203", "QDQ202", "QDQ201")])
def test_torch_reference_export_fixes_to_a_clean_identical_model(tmp_path, order):
    b = GraphBuilder(opset=13)
    torch_reference_export(b)
    path = save_inferred(b, tmp_path)
    feeds = {"x": rand(1, 3, 8, 8, seed=3, spread=4.0)}
    before = run_ort(path, feeds)
    model = load_model(path)
    for code in order:
        assert apply_fix(model, code)
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    fixed = load_model(out)
    assert lint_codes(fixed) == []
    assert sorted(n.op for n in fixed.graph.nodes) == ["Conv"] + ["DequantizeLinear"] * 3 + ["QuantizeLinear"] * 3
    after = run_ort(out, feeds)
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))


# --- rule metadata ----------------------------------------------------------------------------------


def test_common_set_is_the_fifteen_common_rules():
    assert COMMON == [
        "QDQ001", "QDQ002", "QDQ003", "QDQ004", "QDQ005", "QDQ006",
        "QDQ101", "QDQ102", "QDQ103", "QDQ104",
        "QDQ201", "QDQ202", "QDQ203", "QDQ204", "QDQ301",
    ]


@pytest.mark.parametrize("code", sorted(all_rules()))
def test_rule_metadata(code):
    rule = all_rules()[code]
    assert rule.code == code and re.fullmatch(r"[A-Z]{3}\d{3}", code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    doc = rule.doc()
    summary = doc.splitlines()[0] if doc else ""
    assert summary.strip() and "Why:" in doc and "Example:" in doc
    fields = {name for _, name, _, _ in string.Formatter().parse(rule.message) if name}
    assert fields and all(re.fullmatch(r"[a-z_][a-z0-9_]*", name) for name in fields)
    # A rule declares a fix safety exactly when it implements a fix.
    assert (rule.fix_safety is not None) == (rule.fix is not Rule.fix)


# One small model per rule; each must produce findings whose message formats from their own values.
EXAMPLES = {
    "QDQ001": lambda b: b.output(qdq(b, b.input("x", [2]), "a", scale=0.0), [2]),
    "QDQ002": lambda b: b.output(dq(b, q(b, b.input("x", [2]), "q", zp=np.int32(0)), "dq", zp=np.int32(0)), [2]),
    "QDQ003": lambda b: b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], axis=2), [4, 3]),
    "QDQ004": lambda b: b.output(weight_dq(b, "w", (4, 3), [0.1, 0.2, 0.3, 0.4], zp=i8(0), axis=0), [4, 3]),
    "QDQ005": lambda b: b.output(b.node("DequantizeLinear", [b.init("w", i8([1])), b.input("s", [])], name="dq"), [1]),
    "QDQ006": lambda b: b.output(b.node("MatMulInteger", [b.input("a", [2, 2], TensorProto.UINT8),
                                                          b.init("w", np.ones((2, 2), np.uint8))], name="mmi"),
                                 [2, 2], TensorProto.INT32),
    "QDQ101": lambda b: b.output(dq(b, q(b, b.input("x", [2]), "q", scale=0.02), "dq", scale=0.04), [2]),
    "QDQ102": lambda b: dq_then_q(b, 0.05, 0.05),
    "QDQ103": lambda b: dq_then_q(b, 0.05, 0.1),
    "QDQ104": lambda b: two_quantizes(b, 0.1),
    "QDQ201": lambda b: b.output(qdq(b, b.input("x", [2]), "a", scale=f32([0.05]), zp=i8([0])), [2]),
    "QDQ202": pass_through_model,
    "QDQ203": lambda b: q_through_dq(b, "Cast"),
    "QDQ204": lambda b: b.output(b.node("Mul", [b.node("Conv", [
        qdq(b, b.input("x", [1, 3, 4, 4]), "x"), weight_dq(b, "w", (4, 3, 1, 1), 0.01)], name="conv"),
        b.init("m", f32(0.5))], name="mul"), [1, 4, 4, 4]),
    "QDQ301": dangling_model,
}


@pytest.mark.parametrize("code", COMMON)
def test_rule_message_formats_with_the_values_of_its_findings(tmp_path, code):
    b = GraphBuilder()
    EXAMPLES[code](b)
    findings = found(load(b, tmp_path), code)  # found() checks each message against its template
    assert findings
    fields = {name for _, name, _, _ in string.Formatter().parse(all_rules()[code].message) if name}
    for f in findings:
        assert fields <= set(f.values) | {"node"}
        assert "{" not in f.message and f.node and f.node in f.message
        json.dumps(f.to_dict())  # reports serialise findings

