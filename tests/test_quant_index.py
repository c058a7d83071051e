"""The quantization index on tiny hand-built graphs: what it lists, resolves and links."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from onnx import TensorProto, helper, numpy_helper

from qdq.graph import ir
from qdq.graph.model import Model, load_model
from qdq.quant.dtypes import DEQUANTIZE_ONLY, QUANT_TYPES_BY_NAME, quant_type, type_name
from qdq.quant.index import BLOCKED, PER_AXIS, PER_TENSOR, QuantIndex, resolve_constant


def build(b: GraphBuilder, tmp_path: Path, model: onnx.ModelProto | None = None) -> tuple[Model, QuantIndex]:
    """Save the builder's model (or a finished proto), load it as qdq does and index it."""
    path = tmp_path / "m.onnx"
    if model is None:
        b.save(path)
    else:
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
    loaded = load_model(path)
    return loaded, QuantIndex(loaded)


def node(model: Model, name: str) -> ir.Node:
    return next(n for n in model.graph.nodes if n.name == name)


def tensor(model: Model, name: str) -> ir.Tensor:
    return model.graph.tensors()[name]


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def f32(value) -> float:
    """A value as the float32 the model stores, widened to float64 as the index reports it."""
    return float(np.float32(value))


# --- Q/DQ lists ------------------------------------------------------------------------------


def test_lists_quantize_and_dequantize_nodes(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 2, 4, 4])
    xd = b.qdq(x, 0.05, name="a")
    w = b.weight("w", np.ones((3, 2, 1, 1), np.float32), 0.02)
    y = b.node("Conv", [xd, w], name="conv")
    b.node("Relu", [b.qdq(y, 0.1, name="o")], ["out"], name="relu")
    b.output("out", [1, 3, 4, 4])
    m, index = build(b, tmp_path)
    assert index.has_qdq
    assert names(index.quantizes) == ["a_q", "o_q"]
    assert names(index.dequantizes) == ["a_dq", "w_dq", "o_dq"]
    assert sorted(p.node.name for p in index.all_params()) == ["a_dq", "a_q", "o_dq", "o_q", "w_dq"]
    assert index.params(node(m, "a_q")).is_quantize
    assert not index.params(node(m, "a_dq")).is_quantize
    assert index.is_graph_output(tensor(m, "out"))
    assert not index.is_graph_output(tensor(m, y))


def test_float_model_has_no_qdq(tmp_path):
    b = GraphBuilder()
    b.node("Relu", [b.input("x", [1, 4])], ["y"])
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    assert not index.has_qdq
    assert index.quantizes == [] and index.dequantizes == [] and index.qtensors == []
    assert names(index.compute_nodes()) == ["relu_1"]


# --- where scale and zero-point come from ---------------------------------------------------------


def test_qparams_from_initializers(tmp_path):
    b = GraphBuilder()
    b.q(b.input("x", [1, 4]), 0.05, 3, np.int8, name="q")
    b.output("q_out", [1, 4], TensorProto.INT8)
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert isinstance(p.scale_input, ir.Constant) and p.scale_input.name == "q_scale1"
    assert p.scale_source.constant is p.scale_input and p.scale_source.via == []
    assert p.scale_source.cast_to is None
    assert p.zero_point_source.constant.name == "q_zp2"
    assert not p.dynamic
    assert p.scale.dtype == np.float64 and p.scale == f32(0.05)
    assert p.zero_point == 3.0
    assert p.elem_type == TensorProto.INT8 and p.qtype.name == "int8"
    assert p.axis == 1 and p.block_size == 0
    assert p.describe() == {"dtype": "int8", "granularity": PER_TENSOR, "scale": f32(0.05), "zero_point": 3.0}


def _q_reading(b: GraphBuilder, scale: str, zero_point: str | None = None, out_type=TensorProto.INT8) -> str:
    inputs = [b.input("x", [1, 4]), scale] + ([zero_point] if zero_point else [])
    out = b.node("QuantizeLinear", inputs, name="q")
    b.output(out, [1, 4], out_type if zero_point else TensorProto.UINT8)
    return out


def test_qparams_via_constant_node_tensor_value(tmp_path):
    b = GraphBuilder()
    s = b.node("Constant", [], name="cs", value=numpy_helper.from_array(np.array(0.25, np.float32), "s"))
    z = b.node("Constant", [], name="cz", value=numpy_helper.from_array(np.array(-2, np.int8), "z"))
    _q_reading(b, s, z)
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert names(p.scale_source.via) == ["cs"] and names(p.zero_point_source.via) == ["cz"]
    assert p.scale == 0.25 and p.zero_point == -2.0
    assert p.elem_type == TensorProto.INT8
    assert not p.dynamic and p.granularity == PER_TENSOR


def test_qparams_via_constant_node_value_float_and_floats(tmp_path):
    b = GraphBuilder()
    s = b.node("Constant", [], name="cs", value_floats=[0.5, 0.25, 0.125, 1.0])
    z = b.init("zp", np.zeros(4, np.uint8))
    b.node("QuantizeLinear", [b.input("x", [1, 4]), s, z], name="q", axis=1)
    b.output("q_out", [1, 4], TensorProto.UINT8)
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert p.scale.tolist() == [0.5, 0.25, 0.125, 1.0]
    assert p.scale_shape == (4,) and p.granularity == PER_AXIS

    b = GraphBuilder()
    _q_reading(b, b.node("Constant", [], name="cs", value_float=0.5))
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert p.scale == 0.5 and p.scale_shape == () and p.elem_type == TensorProto.UINT8


def test_qparams_via_identity_chain(tmp_path):
    b = GraphBuilder()
    s = b.node("Identity", [b.node("Identity", [b.init("s", np.float32(0.125))], name="id_a")], name="id_b")
    z = b.node("Identity", [b.init("z", np.int8(4))], name="id_z")
    _q_reading(b, s, z)
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert p.scale_source.constant.name == "s"
    assert names(p.scale_source.via) == ["id_b", "id_a"]  # from the Q back to the constant
    assert p.scale_source.cast_to is None and p.scale_source.casts == []
    assert p.scale == 0.125 and p.zero_point == 4.0 and p.elem_type == TensorProto.INT8
    assert resolve_constant(p.scale_input).constant is tensor(m, "s")


def test_qparams_via_cast_chain(tmp_path):
    """A zero-point cast to int8 is int8; a scale cast through float16 has float16's rounding."""
    b = GraphBuilder()
    s16 = b.node("Cast", [b.init("s", np.float32(0.1))], name="to_f16", to=TensorProto.FLOAT16)
    s = b.node("Cast", [s16], name="to_f32", to=TensorProto.FLOAT)
    z = b.node("Identity", [b.node("Cast", [b.init("z", np.int32(-7))], name="to_i8", to=TensorProto.INT8)])
    _q_reading(b, s, z)
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert names(p.scale_source.via) == ["to_f32", "to_f16"]
    assert p.scale_source.casts == [TensorProto.FLOAT16, TensorProto.FLOAT]
    assert p.scale_source.cast_to == TensorProto.FLOAT
    assert p.scale == float(np.float16(0.1)) != f32(0.1)
    assert p.zero_point_source.cast_to == TensorProto.INT8
    assert p.zero_point_source.constant.name == "z"
    assert p.elem_type == TensorProto.INT8  # from the Cast, not the int32 initializer
    assert p.zero_point == -7.0


def test_computed_scale_is_dynamic(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    s = b.node("ReduceMax", [x], name="rmax", keepdims=0)
    xq = b.node("QuantizeLinear", [x, s], name="q")
    b.node("DequantizeLinear", [xq, s], ["y"], name="dq")
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    q, dq = index.params(node(m, "q")), index.params(node(m, "dq"))
    assert resolve_constant(tensor(m, s)) is None
    assert q.dynamic and q.scale_source is None and q.scale is None
    assert q.scale_shape is None and q.granularity == PER_TENSOR
    assert q.same_values(dq)  # the same computed tensor on both sides


# --- element types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elem_type", "opset", "name", "bits", "zero_point"),
    [
        (TensorProto.INT8, 13, "int8", 8, -3),
        (TensorProto.UINT8, 13, "uint8", 8, 128),
        (TensorProto.INT16, 21, "int16", 16, -300),
        (TensorProto.UINT16, 21, "uint16", 16, 40000),
        (TensorProto.INT4, 21, "int4", 4, -8),
        (TensorProto.UINT4, 21, "uint4", 4, 15),
        (TensorProto.FLOAT8E4M3FN, 19, "float8e4m3fn", 8, 0),
        (TensorProto.FLOAT8E5M2, 19, "float8e5m2", 8, 0),
    ],
)
def test_recognises_quantized_types(tmp_path, elem_type, opset, name, bits, zero_point):
    b = GraphBuilder(opset=opset)
    b.initializers += [
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        helper.make_tensor("z", elem_type, [], [zero_point]),
    ]
    xq = b.node("QuantizeLinear", [b.input("x", [1, 4]), "s", "z"], name="q")
    b.node("DequantizeLinear", [xq, "s", "z"], ["y"], name="dq")
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    for p in index.all_params():
        assert p.elem_type == elem_type
        assert p.qtype.name == name and p.qtype.bits == bits
        assert p.zero_point == float(zero_point)
    assert index.params(node(m, "q")).same_values(index.params(node(m, "dq")))


def test_int32_bias_dequantize(tmp_path):
    b = GraphBuilder()
    b.init("bias_q", np.array([100, -5], np.int32))
    b.init("bias_s", np.array([0.001, 0.002], np.float32))
    b.node("DequantizeLinear", ["bias_q", "bias_s"], ["bias"], name="dq", axis=0)
    b.output("bias", [2])
    m, index = build(b, tmp_path)
    p = index.params(node(m, "dq"))
    assert p.elem_type == TensorProto.INT32 and p.qtype.name == "int32"
    assert p.elem_type in DEQUANTIZE_ONLY
    assert p.zero_point.tolist() == [0.0, 0.0]
    assert p.granularity == PER_AXIS and p.axis == 0


def test_quantize_without_zero_point_defaults_to_uint8(tmp_path):
    b = GraphBuilder()
    s = b.init("s", np.float32(0.5))
    xq = b.node("QuantizeLinear", [b.input("x", [1, 4]), s], name="q")
    xq2 = b.node("QuantizeLinear", [b.input("x2", [1, 4]), s, ""], name="q_empty_zp")
    dq = b.node("DequantizeLinear", [xq, s], name="dq")
    b.node("Add", [dq, b.node("DequantizeLinear", [xq2, s], name="dq2")], ["y"])
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    for name in ("q", "q_empty_zp", "dq", "dq2"):
        p = index.params(node(m, name))
        assert p.elem_type == TensorProto.UINT8, name
        assert p.zero_point_input is None and p.zero_point_source is None
        assert p.zero_point.shape == () and p.zero_point == 0.0
    assert index.params(node(m, "q")).shares_initializers(index.params(node(m, "dq")))


def test_dequantize_of_typed_graph_input_without_zero_point(tmp_path):
    b = GraphBuilder(opset=21)
    xi = b.input("xi", [1, 4], TensorProto.INT16)
    b.node("DequantizeLinear", [xi, b.init("s", np.float32(0.5))], ["y"], name="dq")
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    assert index.params(node(m, "dq")).elem_type == TensorProto.INT16


def test_output_dtype_attribute(tmp_path):
    b = GraphBuilder(opset=21)
    s = b.init("s", np.float32(0.5))
    xq = b.node("QuantizeLinear", [b.input("x", [1, 4]), s], name="q", output_dtype=TensorProto.INT16)
    b.node("DequantizeLinear", [xq, s], ["y"], name="dq")
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    assert index.params(node(m, "q")).elem_type == TensorProto.INT16
    assert index.params(node(m, "dq")).elem_type == TensorProto.INT16  # read from the Q that makes its input


def test_dtypes_table():
    assert quant_type(TensorProto.FLOAT) is None
    assert quant_type(TensorProto.INT8).qmin == -128 and quant_type(TensorProto.INT8).qmax == 127
    assert (quant_type(TensorProto.UINT4).qmin, quant_type(TensorProto.UINT4).qmax) == (0, 15)
    assert (quant_type(TensorProto.INT4).qmin, quant_type(TensorProto.INT4).qmax) == (-8, 7)
    assert quant_type(TensorProto.INT16).signed and not quant_type(TensorProto.UINT16).signed
    assert QUANT_TYPES_BY_NAME["float8e4m3fn"].qmax == 448.0 and QUANT_TYPES_BY_NAME["float8e4m3fn"].is_float
    assert QUANT_TYPES_BY_NAME["float8e5m2"].qmax == 57344.0
    assert type_name(TensorProto.UINT8) == "uint8"
    assert type_name(TensorProto.FLOAT) == "float"
    assert type_name(9999) == "type9999"


# --- granularity -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "attrs", "granularity", "shape"),
    [
        (np.float32(0.5), {}, PER_TENSOR, ()),
        (np.array([0.5], np.float32), {}, PER_TENSOR, (1,)),
        (np.array([0.5, 0.25, 0.125], np.float32), {"axis": 1}, PER_AXIS, (3,)),
        (np.array([0.5, 0.25], np.float32), {"axis": 0}, PER_AXIS, (2,)),
    ],
)
def test_granularity(tmp_path, scale, attrs, granularity, shape):
    b = GraphBuilder()
    zp = np.zeros(np.shape(scale), np.int8)
    xq = b.node("QuantizeLinear", [b.input("x", [2, 3]), b.init("s", scale), b.init("z", zp)], name="q", **attrs)
    b.output(xq, [2, 3], TensorProto.INT8)
    m, index = build(b, tmp_path)
    p = index.params(node(m, "q"))
    assert p.granularity == granularity
    assert p.scale_shape == shape and p.zero_point_shape == shape
    assert p.axis == attrs.get("axis", 1)
    assert ("axis" in p.describe()) == (granularity == PER_AXIS)


def test_blocked_granularity(tmp_path):
    b = GraphBuilder(opset=21)
    scale = np.full((4, 4), 0.5, np.float32)
    scale[0, 0] = 0.25
    b.init("w_q", np.ones((4, 16), np.int8))
    b.node("DequantizeLinear", ["w_q", b.init("s", scale), b.init("z", np.zeros((4, 4), np.int8))], ["w"],
           name="dq", axis=1, block_size=4)
    b.output("w", [4, 16])
    m, index = build(b, tmp_path)
    p = index.params(node(m, "dq"))
    assert p.granularity == BLOCKED and p.block_size == 4 and p.axis == 1
    assert p.scale_shape == (4, 4)
    assert p.describe() == {
        "dtype": "int8", "granularity": BLOCKED, "axis": 1, "block_size": 4,
        "scale": {"count": 16, "min": 0.25, "max": 0.5}, "zero_point": {"count": 16, "min": 0.0, "max": 0.0},
    }


# --- sharing and equality -----------------------------------------------------------------------


def test_quantizer_pair_shares_initializers(tmp_path):
    b = GraphBuilder()
    b.node("Relu", [b.qdq(b.input("x", [1, 4]), 0.05, 0, name="p")], ["y"])
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    q, dq = index.params(node(m, "p_q")), index.params(node(m, "p_dq"))
    assert q.shares_initializers(dq) and dq.shares_initializers(q)
    assert q.same_values(dq)


def test_separate_equal_copies_are_same_values_but_not_shared(tmp_path):
    b = GraphBuilder()
    xq = b.q(b.input("x", [1, 4]), 0.05, 2, name="q")
    b.node("Relu", [b.dq(xq, 0.05, 2, name="dq")], ["y"])
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    q, dq = index.params(node(m, "q")), index.params(node(m, "dq"))
    assert q.scale_source.constant is not dq.scale_source.constant
    assert not q.shares_initializers(dq)
    assert q.same_values(dq)


def test_different_values_differ(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    first = b.dq(b.q(x, 0.05, name="q1"), 0.1, name="dq1")
    b.node("Add", [first, b.dq(b.q(x, 0.05, 1, name="q2"), 0.05, 0, name="dq2")], ["y"])
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    p = {n: index.params(node(m, n)) for n in ("q1", "dq1", "q2", "dq2")}
    assert not p["q1"].same_values(p["dq1"])  # scale
    assert not p["q2"].same_values(p["dq2"])  # zero-point
    assert p["q1"].same_values(p["dq2"])


def test_shared_constant_node_counts_as_shared(tmp_path):
    b = GraphBuilder()
    s = b.node("Constant", [], name="cs", value_float=0.5)
    xq = b.node("QuantizeLinear", [b.input("x", [1, 4]), s], name="q")
    b.node("DequantizeLinear", [xq, s], ["y"], name="dq")
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    assert index.params(node(m, "q")).shares_initializers(index.params(node(m, "dq")))


def test_negative_axis_matches_its_positive_form(tmp_path):
    b = GraphBuilder()
    scale, zp = np.array([0.5, 0.25, 0.125], np.float32), np.zeros(3, np.int8)
    xq = b.node("QuantizeLinear", [b.input("x", [2, 3]), b.init("s", scale), b.init("z", zp)], name="q", axis=-1)
    b.node("DequantizeLinear", [xq, "s", "z"], ["y"], name="dq", axis=1)
    b.output("y", [2, 3])
    m, index = build(b, tmp_path)
    q, dq = index.params(node(m, "q")), index.params(node(m, "dq"))
    assert q.data_rank == 2 and dq.data_rank is None
    assert q.same_values(dq) and dq.same_values(q)


def test_per_axis_on_different_axes_differ(tmp_path):
    b = GraphBuilder()
    scale, zp = np.array([0.5, 0.25], np.float32), np.zeros(2, np.int8)
    xq = b.node("QuantizeLinear", [b.input("x", [2, 2]), b.init("s", scale), b.init("z", zp)], name="q", axis=0)
    b.node("DequantizeLinear", [xq, "s", "z"], ["y"], name="dq", axis=1)
    b.output("y", [2, 2])
    m, index = build(b, tmp_path)
    assert not index.params(node(m, "q")).same_values(index.params(node(m, "dq")))


# --- quantized tensors -----------------------------------------------------------------------------


def test_qtensor_of_activation_pair(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    xq = b.q(x, 0.05, name="q")
    b.node("Add", [b.dq(xq, 0.05, name="dq_a"), b.dq(xq, 0.05, name="dq_b")], ["y"])
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    [qt] = index.qtensors
    assert qt.integer is tensor(m, xq)
    assert qt.quantize is node(m, "q")
    assert names(qt.dequantizes) == ["dq_a", "dq_b"]
    assert qt.float_input is tensor(m, "x")
    assert not qt.stored


def test_qtensor_of_stored_weight(tmp_path):
    b = GraphBuilder()
    w = b.weight("w", np.array([[1.0, -2.0]], np.float32), 0.5)
    b.node("MatMul", [b.input("x", [1, 1]), w], ["y"])
    b.output("y", [1, 2])
    m, index = build(b, tmp_path)
    [qt] = index.qtensors
    assert isinstance(qt.integer, ir.Constant) and qt.integer.name == "w_q"
    assert qt.quantize is None and qt.float_input is None
    assert names(qt.dequantizes) == ["w_dq"]
    assert qt.stored
    assert m.constant_values(qt.integer).tolist() == [[2, -4]]


def test_qtensor_of_weight_in_constant_node(tmp_path):
    """A weight held by a Constant node is stored too, and its type is read without a zero-point."""
    b = GraphBuilder()
    w = b.node("Constant", [], name="cw", value=numpy_helper.from_array(np.array([[3, -1]], np.int8), "w"))
    wd = b.node("DequantizeLinear", [w, b.init("s", np.float32(0.5))], name="dq")
    b.node("MatMul", [b.input("x", [1, 1]), wd], ["y"])
    b.output("y", [1, 2])
    m, index = build(b, tmp_path)
    [qt] = index.qtensors
    assert qt.quantize is None and qt.stored
    assert index.params(node(m, "dq")).elem_type == TensorProto.INT8


def test_q_cast_dq_is_one_qtensor(tmp_path):
    b = GraphBuilder()
    s, z = b.init("s", np.float32(0.05)), b.init("z", np.int8(0))
    xq = b.node("QuantizeLinear", [b.input("x", [1, 4]), s, z], name="q")
    xc = b.node("Cast", [xq], name="cast", to=TensorProto.INT8)
    b.node("DequantizeLinear", [xc, s, z], ["y"], name="dq")
    b.output("y", [1, 4])
    m, index = build(b, tmp_path)
    assert index.is_noop_cast(node(m, "cast"))
    [qt] = index.qtensors
    assert qt.integer is tensor(m, xq)
    assert qt.quantize is node(m, "q")
    assert names(qt.dequantizes) == ["dq"]
    [(consumer, via)] = index.consumers_through(tensor(m, xq))
    assert consumer is node(m, "dq") and names(via) == ["cast"]


def test_type_changing_cast_is_not_a_pass_through(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    xc = b.node("Cast", [x], name="noop", to=TensorProto.FLOAT)
    b.node("Cast", [xc], ["y"], name="half", to=TensorProto.FLOAT16)
    b.output("y", [1, 4], TensorProto.FLOAT16)
    m, index = build(b, tmp_path)
    assert index.is_noop_cast(node(m, "noop")) and index.is_pass_through(node(m, "noop"))
    assert not index.is_noop_cast(node(m, "half")) and not index.is_pass_through(node(m, "half"))


# --- walking from compute ops ------------------------------------------------------------------------


def test_dequantize_feeding_through_identity(tmp_path):
    b = GraphBuilder()
    xd = b.qdq(b.input("x", [1, 4]), 0.05, name="p")
    i2 = b.node("Identity", [b.node("Identity", [xd], name="id1")], name="id2")
    r = b.node("Relu", [xd], name="relu")
    h = b.node("Cast", [xd], name="half", to=TensorProto.FLOAT16)
    b.node("Add", [i2, r], ["y"])
    b.output("y", [1, 4])
    b.output(h, [1, 4], TensorProto.FLOAT16)
    m, index = build(b, tmp_path)
    dq = node(m, "p_dq")
    assert index.dequantize_feeding(tensor(m, xd)) is dq
    assert index.dequantize_feeding(tensor(m, i2)) is dq
    assert index.dequantize_feeding(tensor(m, r)) is None
    assert index.dequantize_feeding(tensor(m, h)) is None
    assert index.dequantize_feeding(tensor(m, "x")) is None


def _conv_model(b: GraphBuilder, after_conv: str) -> None:
    x = b.input("x", [1, 2, 4, 4])
    xd = b.qdq(x, 0.05, name="act")
    w = b.weight("w", np.ones((3, 2, 1, 1), np.float32), np.array([0.01, 0.02, 0.03], np.float32), axis=0)
    b.init("b_q", np.array([1, 2, 3], np.int32))
    bias = b.node("DequantizeLinear", ["b_q", b.init("b_s", np.array([5e-4, 1e-3, 1.5e-3], np.float32))],
                  name="bias_dq", axis=0)
    y = b.node("Conv", [xd, w, bias], name="conv")
    y = b.node(after_conv, [y], name="after")
    b.node("Relu", [b.qdq(y, 0.1, name="out")], ["z"], name="tail")
    b.output("z", [1, 3, 4, 4])


def test_node_quant_of_conv(tmp_path):
    b = GraphBuilder()
    _conv_model(b, "Identity")
    m, index = build(b, tmp_path)
    nq = index.node_quant(node(m, "conv"))
    data, weight, bias = nq.inputs
    assert data is index.params(node(m, "act_dq")) and data.scale == f32(0.05)
    assert weight.node.name == "w_dq" and weight.granularity == PER_AXIS and weight.axis == 0
    assert weight.scale.tolist() == [f32(0.01), f32(0.02), f32(0.03)]
    assert bias.node.name == "bias_dq" and bias.elem_type == TensorProto.INT32
    assert len(nq.quantized_inputs) == 3
    [[out]] = nq.outputs
    assert out is index.params(node(m, "out_q")) and out.scale == f32(0.1)
    assert [n.name for n in index.compute_nodes()] == ["conv", "tail"]


def test_node_quant_stops_at_a_relu(tmp_path):
    b = GraphBuilder()
    _conv_model(b, "Relu")
    m, index = build(b, tmp_path)
    assert index.node_quant(node(m, "conv")).outputs == [[]]
    assert index.node_quant(node(m, "after")).outputs == [[index.params(node(m, "out_q"))]]
    assert index.node_quant(node(m, "after")).inputs == [None]


def test_node_quant_with_float_bias(tmp_path):
    b = GraphBuilder()
    xd = b.qdq(b.input("x", [1, 1]), 0.05, name="act")
    w = b.weight("w", np.ones((1, 2), np.float32), 0.5)
    b.node("Gemm", [xd, w, b.init("bias", np.zeros(2, np.float32))], ["y"], name="gemm")
    b.output("y", [1, 2])
    m, index = build(b, tmp_path)
    nq = index.node_quant(node(m, "gemm"))
    assert [p.node.name if p else None for p in nq.inputs] == ["act_dq", "w_dq", None]
    assert names(p.node for p in nq.quantized_inputs) == ["act_dq", "w_dq"]
    assert nq.outputs == [[]]


def test_compute_nodes_skip_qdq_constants_and_pass_throughs(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    c = b.node("Constant", [], name="const", value_float=1.0)
    i = b.node("Identity", [b.qdq(x, 0.05, name="p")], name="ident")
    nc = b.node("Cast", [i], name="noop_cast", to=TensorProto.FLOAT)
    a = b.node("Add", [nc, c], name="add")
    b.node("Cast", [a], ["y"], name="half", to=TensorProto.FLOAT16)
    b.output("y", [1, 4], TensorProto.FLOAT16)
    m, index = build(b, tmp_path)
    assert names(index.compute_nodes()) == ["add", "half"]
    assert index.dequantize_feeding(tensor(m, nc)) is node(m, "p_dq")  # DQ → Identity → Cast(float)


# --- other domains ------------------------------------------------------------------------------------


def _domain_model(domain: str) -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    s, z = b.init("s", np.float32(0.5)), b.init("z", np.int16(-3))
    b.nodes.append(helper.make_node("QuantizeLinear", [x, s, z], ["xq"], name="q", domain=domain))
    b.nodes.append(helper.make_node("DequantizeLinear", ["xq", s, z], ["xd"], name="dq", domain=domain))
    b.node("Relu", ["xd"], ["y"], name="relu")
    b.output("y", [1, 4])
    model = b.model()
    model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def test_com_microsoft_qdq_are_recognised(tmp_path):
    m, index = build(None, tmp_path, _domain_model("com.microsoft"))
    assert names(index.quantizes) == ["q"] and names(index.dequantizes) == ["dq"]
    q = index.params(node(m, "q"))
    assert q.qtype.name == "int16" and q.zero_point == -3.0 and q.scale == 0.5
    [qt] = index.qtensors
    assert qt.quantize is node(m, "q") and names(qt.dequantizes) == ["dq"]
    assert index.node_quant(node(m, "relu")).inputs == [index.params(node(m, "dq"))]
    assert names(index.compute_nodes()) == ["relu"]


def test_qdq_of_unknown_domain_is_ignored(tmp_path):
    m, index = build(None, tmp_path, _domain_model("vendor.custom"))
    assert not index.has_qdq and index.qtensors == []
    assert index.dequantize_feeding(tensor(m, "xd")) is None
    assert index.quantizes_of(tensor(m, "x")) == []
    assert index.node_quant(node(m, "relu")).inputs == [None]


# --- laziness ----------------------------------------------------------------------------------------


def test_reads_only_the_constants_asked_for(tmp_path, monkeypatch):
    """Indexing and reading activation scales never touches an external-data weight."""
    b = GraphBuilder()
    x = b.input("x", [1, 64])
    xd = b.qdq(x, 0.05, name="act")
    w = b.weight("w", np.ones((64, 64), np.float32), 0.02)
    b.node("Relu", [b.qdq(b.node("MatMul", [xd, w], name="mm"), 0.1, name="out")], ["y"])
    b.output("y", [1, 64])
    path = tmp_path / "ext.onnx"
    onnx.save(b.model(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=1024)
    externals = [t.name for t in onnx.load(str(path), load_external_data=False).graph.initializer
                 if t.data_location == TensorProto.EXTERNAL]
    assert externals == ["w_q"]

    read: list[str] = []
    original = Model.constant_values

    def recording(self, constant):
        read.append(constant.name)
        return original(self, constant)

    def no_lazy_load(proto):
        raise AssertionError(f"decoded {proto.name}")

    monkeypatch.setattr(Model, "constant_values", recording)
    monkeypatch.setattr(ir, "decode", no_lazy_load)
    m = load_model(path)
    index = QuantIndex(m)
    assert read == []
    _ = index.qtensors, index.compute_nodes(), index.node_quant(node(m, "mm"))
    for p in index.all_params():
        _ = p.elem_type, p.granularity, p.scale_shape
    assert read == []
    act, out = index.params(node(m, "act_q")), index.params(node(m, "out_dq"))
    assert act.scale == f32(0.05)
    assert out.zero_point == 0.0
    assert index.params(node(m, "w_dq")).scale == f32(0.02)
    # Inline parameters come from the index's columns, decoded together; the weight is never read.
    assert index.table.scale.decoded.all() and index.table.zero_point.decoded.all()
    assert read == []
    # Asked for, the weight is read from the data file next to the model.
    assert m.constant_values(tensor(m, "w_q")).shape == (64, 64)


def test_computed_zero_point_gives_its_own_type(tmp_path: Path) -> None:
    # A run-time zero-point still fixes the quantized type: int32 here, not the uint8 default.
    b = GraphBuilder()
    zp = b.input("zp", [], TensorProto.INT32)
    out = b.node("QuantizeLinear", [b.input("x", [2]), b.init("s", np.float32(0.5)), zp], name="q")
    b.output(out, [2], TensorProto.INT32)
    model, index = build(b, tmp_path)
    params = index.params(node(model, "q"))
    assert params.dynamic
    assert params.elem_type == TensorProto.INT32


@pytest.mark.parametrize("ops", [["Conv"], ["Relu", "Conv", "DequantizeLinear"], {"Add": [1], "Gemm": [2]}, ["NoSuchOp"]])
def test_nodes_of_is_the_graph_filtered_by_op_in_order(ops):
    model = load_model(Path(__file__).resolve().parent.parent / "examples" / "models" / "demo_fx_qat.onnx")
    expected = [n for n in model.graph.nodes if n.op in set(ops)]
    got = QuantIndex(model).nodes_of(ops)
    assert [id(n) for n in got] == [id(n) for n in expected] and (expected or ops == ["NoSuchOp"])
