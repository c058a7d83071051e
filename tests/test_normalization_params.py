"""A normalization's scale and B are its weight and bias, not activations.

onnxruntime's `quantize_static` quantizes a standalone BatchNormalization (PP-OCR's detector has
one) as it does a Conv: scale an int8 weight, B an int32 bias at input × scale. Read as
activations, the int32 bias was an unfixable QDQ501 error left in every NPU and TensorRT fix of
that detector, and the ort rule set asked for the int8 scale to become uint8.
"""

from __future__ import annotations

import npu_constraints
import numpy as np
from builders import GraphBuilder
from conftest import findings_of

from qdq.engine.fix import fix
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model, save_model

C = 4
X_SCALE, GAMMA_SCALE = 0.05, 0.01


def quantized_batchnorm(tmp_path):
    """x → Q/DQ → BatchNormalization(DQ(int8 scale), DQ(int32 B), mean, var) → Q/DQ, as onnxruntime writes it."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, C, 3, 3]), X_SCALE, 128, np.uint8)
    gamma = b.weight("gamma", np.linspace(0.5, 1.2, C, dtype=np.float32), GAMMA_SCALE)
    b.init("beta_q", np.array([40, -12, 7, 300], np.int32))
    beta = b.node("DequantizeLinear", ["beta_q", b.init("beta_s", np.float32(X_SCALE * GAMMA_SCALE))], name="beta_dq")
    mean, var = b.init("mean", np.zeros(C, np.float32)), b.init("var", np.ones(C, np.float32))
    y = b.node("BatchNormalization", [x, gamma, beta, mean, var], name="bn")
    b.node("Identity", [b.qdq(y, 0.04, 128, np.uint8)], ["y"])
    b.output("y", [1, C, 3, 3])
    return load_model(b.save(tmp_path / "bn.onnx"))


def test_npu_accepts_the_int32_bias_and_puts_it_at_input_times_scale(tmp_path):
    """QDQ504 leaves int32 biases to QDQ606, so QDQ606 must know the normalization's: its scale becomes a power of two."""
    model = quantized_batchnorm(tmp_path)
    assert not findings_of(model, "QDQ501", "npu")
    result = fix(model, load_target("npu"))
    assert not [f for f in result.result.findings if f.code == "QDQ501"]
    save_model(result.model, tmp_path / "npu.onnx")
    assert npu_constraints.check(tmp_path / "npu.onnx") == []


def test_trt_takes_both_parameters_in_float(tmp_path):
    model = quantized_batchnorm(tmp_path)
    assert not findings_of(model, "QDQ501", "trt")
    assert sorted(f.values["what"] for f in findings_of(model, "QDQ609", "trt")) == [
        "bias", "input 1 of the BatchNormalization"]
    fixed = fix(model, load_target("trt").narrowed(select=["QDQ609"])).model
    bn = next(node for node in fixed.graph.nodes if node.op == "BatchNormalization")
    assert [[producer.op for producer in t.inputs] for t in bn.inputs[1:3]] == [[], []]  # float constants


def test_ort_keeps_the_int8_scale(tmp_path):
    model = quantized_batchnorm(tmp_path)
    assert not [f for f in findings_of(model, "QDQ505", "ort") if "gamma" in " ".join(f.tensors)]
