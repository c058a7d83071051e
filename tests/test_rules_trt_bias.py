"""QDQ609 quantized-bias: TensorRT takes a Conv/ConvTranspose/Gemm bias as a float constant.

On the corpus models onnxruntime's `quantize_static` (int32 bias DQs), Quark (int8 bias DQs) and
PyTorch `convert_fx` (int32 DQs with a computed zero-point) wrote, and on hand-built graphs for
each form. What the fixed files hold is checked with plain onnx and onnxruntime, not with qdq.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import GraphBuilder
from cli_run import qdq
from onnx import numpy_helper
from trt_placement import Graph

from qdq.engine.fix import fix
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model

CORPUS = Path(__file__).resolve().parent / "corpus"
RNG = np.random.default_rng(0)


def dequantized_biases(path: Path) -> int:
    """Conv/ConvTranspose/Gemm whose bias a DequantizeLinear makes, counted with plain onnx."""
    model = onnx.load(str(path))
    graph = Graph(model)
    return sum(graph.dequantized_bias(node) for node in model.graph.node)


def outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_feeds(path: Path) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
            for i in session.get_inputs()}


def _dequantized_parameters(path: Path) -> list[str]:
    """LayerNormalization scale/bias and the operands of Add, Sub, Mul and Div dequantized from constants
    (stored integers, or a Q of a float constant), found with onnx alone."""
    model = onnx.load(str(path))
    constants = {t.name for t in model.graph.initializer} | {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    producers = {o: n for n in model.graph.node for o in n.output}
    found = []
    for node in model.graph.node:
        slots = {"LayerNormalization": (1, 2), "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1)}.get(
            node.op_type, ())
        for slot in slots:
            producer = producers.get(node.input[slot]) if slot < len(node.input) else None
            if producer is None or producer.op_type != "DequantizeLinear":
                continue
            quantize = producers.get(producer.input[0])  # DQ(stored integers) or DQ(Q(float constant))
            if producer.input[0] in constants or (quantize is not None and quantize.op_type == "QuantizeLinear"
                                                   and quantize.input[0] in constants):
                found.append(f"{node.name}:{slot}")
    return found


CORPUS_MODELS = sorted(p for folder in ("ort", "quark", "torch") for p in (CORPUS / folder).glob("*.onnx")
                       if dequantized_biases(p))


def test_the_corpus_has_both_forms():
    names = {p.parent.name + "/" + p.name for p in CORPUS_MODELS}
    assert {"ort/resnet_default.onnx", "ort/yolo_u8_per_tensor.onnx", "quark/resnet_xint8.onnx",
            "quark/yolo_xint8.onnx", "torch/resnet_fx_convert_x86.onnx"} <= names


@pytest.mark.parametrize("path", CORPUS_MODELS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_corpus_biases_are_reported_and_folded_exactly(path, tmp_path):
    expected = dequantized_biases(path) + len(_dequantized_parameters(path))
    run = qdq("lint", path, "--target", "trt", "--format", "json", "--exit-zero")
    codes = [f["code"] for f in run.json()["findings"]]
    assert codes.count("QDQ609") == expected

    out = tmp_path / "fixed.onnx"
    run = qdq("fix", path, "--target", "trt", "--select", "QDQ609", "-o", out, "--format", "json")
    assert run.code == 0, run.err
    assert run.json()["changes_by_rule"] == {"QDQ609": expected}
    assert dequantized_biases(out) == 0 and _dequantized_parameters(out) == []
    feeds = random_feeds(path)
    for before, after in zip(outputs(path, feeds), outputs(out, feeds), strict=True):
        assert before.dtype == after.dtype and np.array_equal(before, after, equal_nan=True)
    assert qdq("lint", out, "--target", "trt", "--select", "QDQ609").code == 0


@pytest.mark.parametrize("name", ["ort/resnet_default.onnx", "ort/yolo_u8_per_tensor.onnx",
                                  "quark/resnet_xint8.onnx", "quark/yolo_xint8.onnx"])
def test_the_full_trt_fix_leaves_no_bias_dequantized(name, tmp_path):
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", CORPUS / name, "--target", "trt", "-o", out, "--keep-failed", "-q")
    assert run.code in (0, 1) and out.exists(), run.err
    assert dequantized_biases(out) == 0
    assert not any(f.code in ("QDQ501", "QDQ609") and "bias" in f.message
                   for f in lint(load_model(out), load_target("trt")).findings)


def test_inspect_for_trt_still_predicts(tmp_path):
    path = CORPUS / "ort" / "resnet_default.onnx"
    run = qdq("inspect", path, "--target", "trt", "--format", "json")
    assert run.code == 0, run.err
    result = lint(load_model(path), load_target("trt"))
    assert run.json()["predicted"]["conversion_layers"] == result.predicted_reformats()
    assert any(f.code == "QDQ609" and f.effect.startswith("TensorRT: the ONNX parser fails") for f in result.findings)


# --- hand-built: each form ---------------------------------------------------------------------------


def conv_with_bias(bias: str, b: GraphBuilder, op: str = "Conv") -> GraphBuilder:
    x = b.qdq(b.input("x", [1, 3, 5, 5]), 0.05)
    if op == "Gemm":
        flat = b.node("Flatten", [x])
        w = b.weight("w", (RNG.standard_normal((4, 75)) * 0.1).astype(np.float32), scale=0.01)
        b.node("Gemm", [flat, w, bias], outputs=["y"], name="layer", transB=1)
        b.output("y", [1, 4])
    else:
        shape = (4, 3, 3, 3) if op == "Conv" else (3, 4, 3, 3)
        w = b.weight("w", (RNG.standard_normal(shape) * 0.1).astype(np.float32), scale=0.01)
        b.node(op, [x, w, bias], outputs=["y"], name="layer")
        b.output("y", [1, 4, 3, 3] if op == "Conv" else [1, 4, 7, 7])
    return b


def folded(path: Path, tmp_path: Path) -> tuple[np.ndarray, Path]:
    """Fix with QDQ609 alone; the bias constant the layer reads, and the written file."""
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", path, "--target", "trt", "--select", "QDQ609", "-o", out)
    assert run.code == 0, run.err
    model = onnx.load(str(out))
    layer = next(n for n in model.graph.node if n.name == "layer")
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert not [n for n in model.graph.node if n.op_type == "DequantizeLinear" and "bias" in n.name]
    feeds = {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)}
    assert np.array_equal(outputs(path, feeds)[0], outputs(out, feeds)[0])
    return constants[layer.input[2]], out


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose", "Gemm"])
def test_an_int32_bias_dequantize_becomes_its_float_values(op, tmp_path):
    b = GraphBuilder(opset=13)
    stored = np.array([1234, -7, 0, 2**24 + 1], np.int32)  # 2^24 + 1 rounds in float32, as onnxruntime's does
    bias = b.dq(b.init("bias_q", stored), 0.0005, dtype=np.int32, name="bias_dq")
    path = conv_with_bias(bias, b, op).save(tmp_path / "m.onnx")
    [finding] = [f for f in lint(load_model(path), load_target("trt")).findings if f.code == "QDQ609"]
    assert finding.message == "layer: bias bias_q is a DequantizeLinear (int32); the target takes it in float"
    assert str(finding.fix) == "exact"
    values, _ = folded(path, tmp_path)
    assert values.dtype == np.float32
    assert np.array_equal(values, stored.astype(np.float32) * np.float32(0.0005))


def test_a_quantized_float_bias_keeps_the_rounding_and_clipping_of_its_q(tmp_path):
    b = GraphBuilder(opset=13)
    scale = np.float32(0.01)
    # 0.025 / 0.01 = 2.5 rounds to even (2); 5.0 and -9.0 clip at 127 and -128; a zero point of 3.
    original = np.array([0.025, 5.0, -9.0, 0.013], np.float32)
    params = b.qparams("bias", scale, 3, np.int8)
    bias_q = b.node("QuantizeLinear", [b.init("bias", original), *params], name="bias_q")
    bias = b.node("DequantizeLinear", [bias_q, *params], name="bias_dq")
    path = conv_with_bias(bias, b).save(tmp_path / "m.onnx")
    values, out = folded(path, tmp_path)
    q = np.clip(np.rint(original / scale) + 3, -128, 127)
    assert np.array_equal(values, ((q - 3).astype(np.float32) * scale))
    assert values[1] == np.float32(124) * scale and values[2] == np.float32(-131) * scale
    assert not [n for n in onnx.load(str(out)).graph.node if n.op_type == "QuantizeLinear" and n.name == "bias_q"]


def test_per_channel_bias_through_an_identity(tmp_path):
    b = GraphBuilder(opset=13)
    stored = np.array([10, -20, 30, -40], np.int32)
    scales = np.array([0.001, 0.002, 0.003, 0.004], np.float32)
    bias = b.node("Identity", [b.dq(b.init("bias_q", stored), scales, dtype=np.int32, name="bias_dq", axis=0)])
    path = conv_with_bias(bias, b).save(tmp_path / "m.onnx")
    values, _ = folded(path, tmp_path)
    assert np.array_equal(values, stored.astype(np.float32) * scales)


def test_a_bias_dequantize_two_convs_share_is_folded_for_both(tmp_path):
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 3, 5, 5]), 0.05)
    bias = b.dq(b.init("bias_q", np.array([5, 6, 7, 8], np.int32)), 0.0005, dtype=np.int32, name="bias_dq")
    for name in ("c1", "c2"):
        w = b.weight(f"{name}_w", (RNG.standard_normal((4, 3, 3, 3)) * 0.1).astype(np.float32), scale=0.01)
        b.node("Conv", [x, w, bias], outputs=[f"{name}_y"], name=name)
        b.output(f"{name}_y", [1, 4, 3, 3])
    path = b.save(tmp_path / "m.onnx")
    model = load_model(path)
    result = fix(model, load_target("trt").narrowed(select=["QDQ609"]))
    assert result.converged and [c.node for c in result.changes] == ["c1", "c2"]
    assert result.result.findings == []
    assert not [n for n in model.graph.nodes if n.op == "DequantizeLinear" and n.name == "bias_dq"]


def test_a_bias_computed_from_an_input_is_reported_without_a_fix(tmp_path):
    b = GraphBuilder(opset=13)
    bias = b.qdq(b.input("b", [4]), 0.01)
    path = conv_with_bias(bias, b).save(tmp_path / "m.onnx")
    [finding] = [f for f in lint(load_model(path), load_target("trt")).findings if f.code == "QDQ609"]
    assert finding.fix is None


def test_trt_folds_biases_first_and_does_not_rescale_them():
    trt = load_target("trt")
    assert trt.fix_order[0] == "QDQ609"
    assert "QDQ606" not in {code for code, cfg in trt.rules.items() if cfg.enabled}
    assert "QDQ609" not in {code for code, cfg in load_target("npu").rules.items() if cfg.enabled}


# --- transformers: LayerNorm parameters and bias Adds -------------------------------------------------


@pytest.mark.parametrize("name", ["transformer_default", "transformer_u8_per_channel"])
def test_layernorm_parameters_and_bias_adds_become_float(name, tmp_path):
    """onnxruntime's quantize_static dequantizes LayerNorm's scale and bias and the bias Add after each
    MatMul from integers; TensorRT (and ModelOpt) keep them float. The fold is exact."""
    path = CORPUS / "ort" / f"{name}.onnx"
    assert len(_dequantized_parameters(path)) >= 20
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", path, "--target", "trt", "--select", "QDQ609", "-o", out)
    assert run.code == 0, run.err
    assert _dequantized_parameters(out) == []
    feeds = {"input": np.load(CORPUS / "float" / "transformer.npz")["input"][:1]}
    assert all(np.array_equal(a, b) for a, b in zip(outputs(path, feeds), outputs(out, feeds)))
