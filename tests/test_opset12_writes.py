"""Fixes that create a DequantizeLinear on an opset-12 model write one opset 12 accepts (issue 39).

DequantizeLinear-10 has no `axis` attribute and one scale: NNCF's opset-12 OCR models made the
npu fix's float-bias quantization (QDQ610) write `axis=0` on a per-tensor bias DQ, and the ONNX
checker refused the fixed model. Raising the opset would change what other ops mean, so a fix
quantizes per tensor there instead (a weight TensorRT's float-input fix quantizes gets one scale).
"""

from __future__ import annotations

import numpy as np
import onnx
from builders import GraphBuilder
from cli_run import qdq
from test_rules_placement import float_input_model

RNG = np.random.default_rng(0)


def _dequantizers(path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == "DequantizeLinear"]


def test_npu_float_bias_on_opset_12_writes_a_dq_without_axis(tmp_path):
    b = GraphBuilder(opset=12)
    x = b.qdq(b.input("x", [1, 2, 4, 4]), 0.0625)
    w = b.weight("w", RNG.normal(size=(3, 2, 1, 1)).astype(np.float32), scale=0.0078125)
    y = b.node("Conv", [x, w, b.init("b", np.array([0.1, -0.2, 0.3], np.float32))], ["y"])
    b.node("Relu", [b.qdq(y, 0.125)], ["out"])
    b.output("out", [1, 3, 4, 4])
    path, out = b.save(tmp_path / "m.onnx"), tmp_path / "fixed.onnx"

    run = qdq("fix", path, "--target", "npu", "-o", out, "--format", "json")
    assert run.code == 0, run.err
    assert [c["code"] for c in run.json()["changes"]] == ["QDQ610"]
    onnx.checker.check_model(str(out), full_check=True)
    assert all(not n.attribute for n in _dequantizers(out))


def test_trt_float_weight_on_opset_12_gets_one_scale(tmp_path):
    b = float_input_model(weight_quantized=False)
    b.opset = 12
    path, out = b.save(tmp_path / "m.onnx"), tmp_path / "fixed.onnx"

    run = qdq("fix", path, "--target", "trt", "-o", out, "--format", "json")
    assert run.code in (0, 1), run.err
    weight = [c for c in run.json()["changes"] if c["tensor"] == "conv2_w"]
    assert [c["new"] for c in weight] == ["int8 per-tensor"]
    onnx.checker.check_model(str(out), full_check=True)
    dq = next(n for n in _dequantizers(out) if "conv2_w" in n.input[0])
    assert not dq.attribute
