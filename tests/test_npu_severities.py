"""NPU severities: what the compiler accepts is a warning, what the DPU cannot run is an error.

QDQ403 (reshape-like ops with different in/out positions) is a warning for `--target npu`: a Vitis
AI–compiled MobileNetV2 ran its Flatten 2^-4 → 2^-5 on the DPU. Pools and Concats (QDQ402, QDQ401)
stay errors. QDQ610 reports float Conv/Gemm biases (PyTorch FX/PT2E, NNCF, ModelOpt exports) and
its fix stores them as int32 at input × weight scale; the written files are read back with plain
onnx and numpy, and the independent checker in `npu_constraints.py` grades the result.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from cli_run import qdq
from onnx import numpy_helper

import npu_constraints
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model

CORPUS = Path(__file__).resolve().parent / "corpus"
BIASED = ("Conv", "ConvTranspose", "Gemm")


def npu_findings(path: Path) -> list[tuple[str, str, str]]:
    """(code, severity, op) of the QDQ4xx and QDQ610 findings `qdq lint --target npu` reports."""
    run = qdq("lint", path, "--target", "npu", "--select", "QDQ4,QDQ610", "--format", "json", "--exit-zero")
    assert run.code == 0, run.err
    ops = {n.name: n.op_type for n in onnx.load(str(path)).graph.node}
    return [(f["code"], f["severity"], ops.get(f["node"], "")) for f in run.json()["findings"]]


@pytest.mark.parametrize("name, op", [
    ("quark/mobilenetv2_xint8.onnx", "Flatten"),  # GlobalAveragePool 2^-4 → Flatten → 2^-5, as in the issue
    ("quark/resnet_xint8.onnx", "Flatten"),
    ("torch/transformer_fx_qat_qnnpack.onnx", "Reshape"),
    ("torch/transformer_pt2e_xnnpack_qat.onnx", "Transpose"),
])
def test_a_reshape_like_op_changing_position_is_a_warning(name, op):
    found = npu_findings(CORPUS / name)
    assert ("QDQ403", "warning", op) in found
    assert not [f for f in found if f[0] in ("QDQ401", "QDQ402") and f[2] == op]


@pytest.mark.parametrize("name, expected", [
    ("quark/mobilenetv2_xint8_norefine.onnx", ("QDQ402", "error", "GlobalAveragePool")),
    ("ort/resnet_default.onnx", ("QDQ402", "error", "GlobalAveragePool")),
    ("ort/yolo_u8_per_tensor.onnx", ("QDQ401", "error", "Concat")),
    ("quark/yolo_xint8_norefine.onnx", ("QDQ401", "error", "Concat")),
])
def test_pools_and_concats_stay_errors(name, expected):
    assert expected in npu_findings(CORPUS / name)


def test_maxpool_is_an_error_and_flatten_a_warning_in_one_graph(tmp_path):
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 2, 4, 4]), 2.0**-5)
    pooled = b.qdq(b.node("MaxPool", [x], name="pool", kernel_shape=[2, 2]), 2.0**-6)
    flat = b.node("Flatten", [pooled], name="flatten")
    b.node("QuantizeLinear", [flat, *b.qparams("out", np.float32(2.0**-7))], outputs=["y"])
    b.output("y", [1, 8], onnx.TensorProto.INT8)
    path = b.save(tmp_path / "m.onnx")
    assert sorted(npu_findings(path)) == [("QDQ402", "error", "MaxPool"), ("QDQ403", "warning", "Flatten")]
    # TensorRT's and onnxruntime's sets keep reshape-like ops under QDQ402, with their own severities.
    assert "Flatten" in load_target("trt").rules["QDQ402"].params["ops"]
    assert not load_target("trt").rules.get("QDQ403") or not load_target("trt").rules["QDQ403"].enabled


# --- float biases -----------------------------------------------------------------------------------


def biased_layers(path: Path) -> int:
    """Conv/ConvTranspose/Gemm reading a DQ'd input and weight and a float constant bias (plain onnx)."""
    model = onnx.load(str(path))
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    float_types = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    floats = {t.name for t in model.graph.initializer if t.data_type in float_types}
    floats |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"  # FX exports' biases
               and any(a.name == "value" and a.t.data_type in float_types for a in n.attribute)}
    return sum(1 for n in model.graph.node if n.op_type in BIASED and len(n.input) > 2 and n.input[2] in floats
               and n.input[0] in dequantized and n.input[1] in dequantized)


@pytest.mark.parametrize("name", ["torch/resnet_fx_qat_pow2_qdq.onnx", "nncf/resnet_performance.onnx",
                                  "torch/yolo_fx_qat_qnnpack.onnx", "modelopt/resnet_int8.onnx"])
def test_float_biases_are_errors_for_npu_only(name):
    path = CORPUS / name
    found = Counter(f for f in npu_findings(path) if f[0] == "QDQ610")
    assert sum(found.values()) == biased_layers(path) > 0
    assert {f[1] for f in found} == {"error"}
    for target in ("trt", "ort"):
        assert qdq("lint", path, "--target", target, "--select", "QDQ610").code == 2  # not in their sets


class Graph:
    """The Q/DQ facts the bias check needs, read with onnx and numpy only."""

    def __init__(self, path: Path):
        self.model = onnx.load(str(path))
        self.constants = {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}
        self.producer = {o: n for n in self.model.graph.node for o in n.output}
        self.layers = {n.name: n for n in self.model.graph.node if n.op_type in BIASED}

    def dq(self, tensor: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    def scale(self, dq: onnx.NodeProto) -> np.ndarray:
        return self.constants[dq.input[1]]


def check_int32_biases(fixed: Path, reference: Path) -> int:
    """Every bias of `fixed` is int32 at input × weight scale holding the rounded float bias of `reference`."""
    out, ref = Graph(fixed), Graph(reference)
    checked = 0
    for name, layer in out.layers.items():
        if len(layer.input) < 3 or not layer.input[2] or out.dq(layer.input[0]) is None:
            continue  # no bias, or a float input: QDQ610 leaves the layer alone
        bias_dq = out.dq(layer.input[2])
        assert bias_dq is not None, f"{name}: bias still float"
        integers = out.constants[bias_dq.input[0]]
        assert integers.dtype == np.int32
        assert len(bias_dq.input) < 3 or not np.any(out.constants[bias_dq.input[2]])
        s_in, s_w = (out.scale(out.dq(layer.input[i])) for i in (0, 1))
        expected = np.float32(s_in.ravel()[0]) * s_w.ravel().astype(np.float32)
        scale = out.scale(bias_dq).ravel()
        assert np.array_equal(scale, expected if scale.size > 1 else expected[:1]), name
        original = ref.constants[ref.layers[name].input[2]].astype(np.float64)
        assert np.array_equal(integers, np.clip(np.rint(original / scale), -2**31, 2**31 - 1)), name
        checked += 1
    return checked


@pytest.mark.parametrize("name, inputs", [
    ("torch/resnet_fx_qat_pow2_qdq.onnx", "resnet"),
    ("nncf/resnet_performance.onnx", "resnet"),
])
def test_the_npu_fix_quantizes_float_biases_at_input_times_weight_scale(name, inputs, tmp_path):
    samples = np.load(CORPUS / "float" / f"{inputs}.npz")
    feeds = tmp_path / "one.npz"
    np.savez(feeds, **{k: v[:1] for k, v in samples.items()})
    fixed, reference = tmp_path / "fixed.onnx", tmp_path / "float_bias.onnx"
    # The biases are checked on the written file: NNCF's float scales cost more than the verdict
    # allows once on powers of two, so the file is written regardless (--keep-failed).
    run = qdq("fix", CORPUS / name, "--target", "npu", "-o", fixed, "--inputs", feeds, "--format", "json",
              "--keep-failed")
    assert run.code in (0, 1) and [f for f in run.json()["remaining"] if f["severity"] != "info"] == [], run.err
    assert run.json()["changes_by_rule"]["QDQ610"] == biased_layers(CORPUS / name)
    # The same fix without QDQ610: the float biases (folded BatchNorms included) at the same scales.
    assert qdq("fix", CORPUS / name, "--target", "npu", "--ignore", "QDQ610", "-o", reference,
               "--inputs", feeds, "--keep-failed").code in (0, 1)
    assert check_int32_biases(fixed, reference) == biased_layers(CORPUS / name)
    assert npu_constraints.check(fixed) == []


def test_a_per_channel_weight_gives_per_channel_bias_scales(tmp_path):
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 3, 5, 5]), 2.0**-5)
    scales = np.array([2.0**-7, 2.0**-8, 2.0**-6, 2.0**-9], np.float32)
    rng = np.random.default_rng(0)
    w = b.weight("w", (rng.standard_normal((4, 3, 3, 3)) * 0.02).astype(np.float32), scale=scales, axis=0)
    bias = np.array([0.3, -0.01, 1e-6, 1e6], np.float32)  # 1e6 / 2^-14 saturates int32
    b.node("Conv", [x, w, b.init("bias", bias)], outputs=["y"], name="layer")
    b.output("y", [1, 4, 3, 3])
    path = b.save(tmp_path / "m.onnx")
    [finding] = [f for f in lint(load_model(path), load_target("npu")).findings if f.code == "QDQ610"]
    assert finding.message.startswith("layer: bias bias is float; input and weight are quantized (2^-5 × 4 per-axis")
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", path, "--target", "npu", "--select", "QDQ610", "-o", out, "--format", "json", "--keep-failed")
    assert out.exists(), run.err
    [change] = run.json()["changes"]
    assert change["values"]["saturated"] == 1 and change["values"]["rounded_to_zero"] == 1
    g = Graph(out)
    bias_dq = g.dq(g.layers["layer"].input[2])
    assert np.array_equal(g.scale(bias_dq), np.float32(2.0**-5) * scales)
    assert next(a.i for a in bias_dq.attribute if a.name == "axis") == 0
    assert g.constants[bias_dq.input[0]].tolist() == [
        round(0.3 * 2**12), round(-0.01 * 2**13), 0, 2**31 - 1]


def test_float_biases_are_quantized_after_shift_cut_and_before_the_bias_rules():
    order = load_target("npu").fix_order
    assert order.index("QDQ604") < order.index("QDQ610") < order.index("QDQ606") < order.index("QDQ605")
