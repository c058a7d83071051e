"""The trt11 rule set: what a strongly typed TensorRT 11 build makes of a Q/DQ model's float types
(QDQ901 float remainders, QDQ902 scale types, QDQ903 the opset floor), on hand-made graphs and on
NVIDIA ModelOpt 0.47's INT8 exports (FP16 inside by default; FP32 with `dq_only`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import findings_of, run_ort
from onnx import TensorProto, numpy_helper

import cli
from qdq.engine.ruleset import load_target
from qdq.graph import float_types
from qdq.graph.model import load_model

MODELOPT = Path(__file__).parent / "corpus" / "modelopt"


def conv_relu_add(opset: int = 19) -> GraphBuilder:
    """x[1,4,8,8] → Q/DQ → Conv → Relu → Q/DQ → Conv → Add(its input) → y: two FP32 regions."""
    b = GraphBuilder(opset=opset)
    x = b.qdq(b.input("x", [1, 4, 8, 8]), name="in")
    w1 = b.weight("w1", np.ones((4, 4, 1, 1), np.float32) * 0.1)
    r = b.node("Relu", [b.node("Conv", [x, w1], name="conv1")], name="relu1")
    r = b.qdq(r, name="mid")
    w2 = b.weight("w2", np.ones((4, 4, 1, 1), np.float32) * 0.1)
    b.node("Add", [b.node("Conv", [r, w2], name="conv2"), r], ["y"], name="add")
    b.output("y", [1, 4, 8, 8])
    return b


def as_float16(model: onnx.ModelProto, *, scales: bool, activations: bool) -> onnx.ModelProto:
    """The same graph with its Q/DQ scales and/or its float interface in FP16."""
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT and scales and "scale" in init.name:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    if activations:
        for value in list(model.graph.input) + list(model.graph.output):
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def load(tmp_path: Path, model: onnx.ModelProto):
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return load_model(path)


def test_each_connected_fp32_part_is_one_region_with_its_size(tmp_path):
    found = findings_of(load_model(conv_relu_add().save(tmp_path / "m.onnx")), "QDQ901", target="trt11")
    assert [f.values["nodes"] for f in found] == [["conv1", "relu1"], ["conv2", "add"]]
    # Two [1,4,8,8] FP32 tensors each: 512 elements, 1024 bytes more than FP16.
    assert [f.values["elements"] for f in found] == [512, 512] and all(f.values["known_sizes"] for f in found)
    assert "1024 bytes more than FP16" in found[0].message


def test_only_trt11_has_the_strong_typing_rules(tmp_path):
    assert not {"QDQ901", "QDQ902", "QDQ903"} & set(load_target("trt").enabled_codes())
    model = load_model(conv_relu_add(opset=13).save(tmp_path / "m.onnx"))
    assert findings_of(model, "QDQ901", target="trt11") and findings_of(model, "QDQ903", target="trt11")


def test_modelopt_fp16_export_has_no_remainder_and_its_fp32_export_does():
    """ModelOpt 0.47 converts the float parts to FP16 by default (FP32 I/O behind Casts); `dq_only` keeps FP32."""
    assert findings_of(load_model(MODELOPT / "resnet_int8.onnx"), "QDQ901", target="trt11") == []
    found = findings_of(load_model(MODELOPT / "resnet_int8_dq_only_fp32.onnx"), "QDQ901", target="trt11")
    float_model = onnx.load(MODELOPT / "resnet_int8_dq_only_fp32.onnx")
    convs = sum(n.op_type in ("Conv", "Gemm") for n in float_model.graph.node)
    assert sum(f.values["op_counts"].get("Conv", 0) + f.values["op_counts"].get("Gemm", 0) for f in found) == convs


def test_fp16_activation_with_fp32_scale_is_reported(tmp_path):
    """x: float16 → Q(scale float32) → DQ(scale float16): legal ONNX from opset 23 on (QuantizeLinear-19/21
    bind x and y_scale to one type), refused by TensorRT's strong typing."""
    b = GraphBuilder(opset=23)
    x = b.input("x", [1, 4], TensorProto.FLOAT16)
    xq = b.node("QuantizeLinear", [x, b.init("s32", np.float32(0.1)), b.init("z", np.int8(0))], name="q")
    b.node("DequantizeLinear", [xq, b.init("s16", np.float16(0.1)), "z"], ["y"], name="dq")
    b.output("y", [1, 4], TensorProto.FLOAT16)
    found = findings_of(load_model(b.save(tmp_path / "m.onnx")), "QDQ902", target="trt11")
    assert [(f.node, f.values["actual"], f.values["expected"]) for f in found] == [("q", "float", "float16")]


def test_all_fp16_model_is_clean(tmp_path):
    model = load(tmp_path, as_float16(conv_relu_add().model(), scales=True, activations=True))
    for code in ("QDQ901", "QDQ902", "QDQ903"):
        assert findings_of(model, code, target="trt11") == [], code


@pytest.mark.parametrize("opset, reported", [(13, True), (17, True), (19, False)])
def test_opset_floor(tmp_path, opset, reported):
    found = findings_of(load_model(conv_relu_add(opset).save(tmp_path / "m.onnx")), "QDQ903", target="trt11")
    assert bool(found) == reported
    if found:
        assert found[0].values == {"opset": opset, "minimum": 19}


def test_scale_type_fix_gives_the_scale_its_input_type(tmp_path, capsys):
    """x: float16 → Q(scale float32) → DQ(scale float16): the Q's scale becomes FP16, outputs unchanged."""
    b = GraphBuilder(opset=23)
    x = b.input("x", [1, 4], TensorProto.FLOAT16)
    xq = b.node("QuantizeLinear", [x, b.init("s32", np.float32(0.1)), b.init("z", np.int8(0))], name="q")
    b.node("DequantizeLinear", [xq, b.init("s16", np.float16(0.1)), "z"], ["y"], name="dq")
    b.output("y", [1, 4], TensorProto.FLOAT16)
    source = b.save(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    assert cli.main(["fix", str(source), "--target", "trt11", "--select", "QDQ902", "--no-verify", "-o", str(out)]) == 0
    capsys.readouterr()
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    (q,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert {i.name: i.data_type for i in model.graph.initializer}[q.input[1]] == TensorProto.FLOAT16
    assert findings_of(load_model(out), "QDQ902", target="trt11") == []
    # onnxruntime runs no FP16 input with an FP32 scale (the input), so the fixed model is checked by hand.
    x = np.array([[0.1, -0.26, 0.34, 1.0]], np.float16)
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], np.float16([[0.1, -0.3, 0.3, 1.0]]), rtol=1e-3)


def test_tensor_types_follow_onnx_schemas(tmp_path):
    """Shape's output is an integer whatever it reads; Cast's is its `to`; a Constant's its value's; a DQ's its scale's."""
    b = GraphBuilder(opset=19)
    x = b.input("x", [1, 4], TensorProto.FLOAT16)
    shape = b.node("Shape", [x], name="shape")
    as_float = b.node("Cast", [shape], name="cast", to=TensorProto.FLOAT)
    half = b.node("Constant", [], name="const", value=numpy_helper.from_array(np.float16(2.0)))
    dq = b.dq(b.init("q", np.ones((1, 4), np.int8)), 0.5, name="dq")
    b.node("Mul", [x, half], ["y"], name="mul")
    b.output("y", [1, 4], TensorProto.FLOAT16)
    b.output(b.node("Neg", [as_float], name="neg"), [2])  # intermediate tensors are typed by inference only
    b.output(b.node("Neg", [dq], name="neg2"), [1, 4])
    model = load_model(b.save(tmp_path / "m.onnx"))
    types = float_types.infer(model.graph, model.opset)
    assert types[shape] == TensorProto.UNDEFINED  # not a float: Shape's T1 allows only int64
    assert (types[as_float], types[half], types[dq], types["y"]) == (
        TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.FLOAT16)
