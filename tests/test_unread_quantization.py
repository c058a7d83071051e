"""QDQ006: a model that quantizes with ops qdq does not read never lints clean, and `qdq fix` refuses it.

The models are built here the way the tools write them: QONNX `Quant` nodes (Brevitas
`export_qonnx`, FINN) with scale, zero-point and bit width as inputs; a fake-quant op in a domain
qdq has never heard of; onnxruntime's QOperator format from the corpus.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cli_run import qdq

CORPUS = Path(__file__).resolve().parent / "corpus"


def _conv_chain(quantizer, domain: str) -> onnx.ModelProto:
    """x → quantizer → Conv(W quantized by the same op) → Relu → quantizer → y, as QONNX writes it."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(0.0, np.float32), "z"),
        numpy_helper.from_array(np.array(8.0, np.float32), "bits"),
    ]
    nodes = [
        quantizer("x", "xq", "q_in"),
        quantizer("W", "Wq", "q_w"),
        helper.make_node("Conv", ["xq", "Wq"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        quantizer("r", "y", "q_out"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(domain, 1)])


def qonnx_model() -> onnx.ModelProto:
    domain = "qonnx.custom_op.general"
    return _conv_chain(lambda x, y, name: helper.make_node(
        "Quant", [x, "s", "z", "bits"], [y], name=name, domain=domain, signed=1, narrow=0, rounding_mode="ROUND"),
        domain)


def fake_quant_model() -> onnx.ModelProto:
    domain = "com.example.quant"
    return _conv_chain(lambda x, y, name: helper.make_node("MyFakeQuantize", [x, "s", "z"], [y], name=name,
                                                           domain=domain), domain)


def test_a_qonnx_model_is_an_error_for_every_target_and_fix_writes_nothing(tmp_path):
    path = tmp_path / "qonnx.onnx"
    onnx.save(qonnx_model(), str(path))
    for target in ("npu", "trt", "ort"):
        run = qdq("lint", path, "--target", target, "--format", "json")
        assert run.code == 1, run.err
        [finding] = run.json()["findings"]
        assert finding["code"] == "QDQ006" and finding["severity"] == "error"
        assert "3 qonnx.custom_op.general Quant" in finding["message"] and "QuantToQCDQ" in finding["message"]
        out = tmp_path / f"{target}.onnx"
        fix = qdq("fix", path, "--target", target, "-o", out)
        assert fix.code == 2 and not out.exists(), fix.err
        assert fix.err.count("\n") == 1 and "quantized with ops qdq does not read (3 qonnx.custom_op.general Quant)" \
            in fix.err and "Traceback" not in fix.err


def test_a_fake_quant_op_of_an_unknown_domain_is_matched_by_its_name(tmp_path):
    path = tmp_path / "fake.onnx"
    onnx.save(fake_quant_model(), str(path))
    run = qdq("lint", path, "--target", "trt")
    assert run.code == 1 and "QDQ006 [error]" in run.out and "3 com.example.quant MyFakeQuantize" in run.out
    assert "nothing to check" not in run.out
    assert qdq("fix", path, "--target", "trt", "--dry-run").code == 2


def test_the_lists_live_in_the_rule_set(tmp_path):
    """A custom set can name its own quantizer: the rule reads its lists, not the code's."""
    path = tmp_path / "fake.onnx"
    proto = fake_quant_model()
    for node in proto.graph.node:
        if node.op_type == "MyFakeQuantize":
            node.op_type = "Rounder"  # no pattern matches this name
    onnx.save(proto, str(path))
    assert qdq("lint", path, "--target", "trt", "--format", "json").json()["findings"] == []
    rules = tmp_path / "mine.toml"
    rules.write_text('extends = "trt"\n[rules.QDQ006]\nquantizer_ops = ["Rounder"]\n')
    run = qdq("lint", path, "--rules", rules, "--format", "json")
    assert run.code == 1 and "3 com.example.quant Rounder" in run.json()["findings"][0]["message"]


def test_integer_kernels_are_named_but_fix_still_runs(tmp_path):
    path = CORPUS / "ort" / "resnet_qoperator.onnx"
    run = qdq("lint", path, "--target", "ort", "--format", "json")
    assert run.code == 1
    [finding] = [f for f in run.json()["findings"] if f["code"] == "QDQ006"]
    assert "9 QLinearConv" in finding["message"] and "1 com.microsoft QGemm" in finding["message"]
    fix = qdq("fix", path, "--target", "ort", "--dry-run", "--no-verify")
    assert fix.code == 1, fix.err  # the finding remains: never clean


def test_a_float_model_still_has_nothing_to_check(tmp_path):
    path = CORPUS / "float" / "resnet.onnx"
    run = qdq("lint", path, "--target", "npu", "--format", "json")
    assert run.code == 0 and run.json()["notes"] == [
        "the model has no QuantizeLinear or DequantizeLinear nodes: nothing to check"]
