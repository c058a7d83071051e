"""Lint models made by real tools, not by hand: onnxruntime's quantize_static and PyTorch FX QAT export.

What the common rule set should say about each, and why:

onnxruntime `quantize_static` (QDQ format, per-tensor, symmetric int8):
  - every activation and weight Q/DQ has scalar parameters shared by the pair: nothing to report;
  - each Conv bias is int32 behind a DequantizeLinear whose scale (s_x·s_w) onnxruntime writes
    with shape [1] next to a scalar zero-point: QDQ201 on the scale of those 4 bias DQs, nothing else.
    In particular no QDQ004 error for "[] zero-point next to a [1] scale": onnxruntime runs it.

PyTorch FX QAT → TorchScript exporter (torch-fx-export.md §4.1, path a1):
  - the exporter writes every scale and zero-point as a 1-element tensor of shape [1]: one QDQ201
    on every Q and DQ, covering both its parameters ("scale and zero-point");
  - its initializer de-duplication turns every use of the shared int8 zero-point after the first
    into `Identity(first)`: QDQ202 on each Q/DQ whose zero-point comes through that Identity;
  - no validity errors (QDQ0xx), no mismatched or redundant pairs (QDQ1xx): FX shares one
    observer between a Q and its DQ, and MaxPool/Concat share qparams without a DQ → Q pair.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from optional import torch_or_skip
from onnx import TensorProto, helper, numpy_helper

import cli
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model

ROOT = Path(__file__).resolve().parent.parent
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def build_float_model(path: Path) -> Path:
    """Conv-Relu → MaxPool → two Conv branches → Concat → Conv → residual Add with the pool output."""
    rng = np.random.default_rng(0)

    def weight(name: str, shape: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["p1", "w3", "b3"], ["c3"], name="conv3"),
        helper.make_node("Concat", ["r2", "c3"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "w4", "b4"], ["c4"], name="conv4"),
        helper.make_node("Add", ["c4", "p1"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        [weight("w1", [8, 3, 3, 3]), weight("b1", [8]), weight("w2", [4, 8, 3, 3]), weight("b2", [4]),
         weight("w3", [4, 8, 1, 1]), weight("b3", [4]), weight("w4", [8, 8, 1, 1]), weight("b4", [8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def build_ort_qdq_model(folder: Path) -> Path:
    """quantize_static of the float model: QDQ format, per-tensor, int8 symmetric, random calibration."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    out = folder / "ort_qdq.onnx"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "Please consider pre-processing before quantization"
    try:
        quantize_static(
            str(build_float_model(folder / "float.onnx")), str(out), Reader(), quant_format=QuantFormat.QDQ,
            per_channel=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True},
        )
    finally:
        root.setLevel(level)
    return out


@pytest.fixture(scope="module")
def ort_model(tmp_path_factory) -> Path:
    return build_ort_qdq_model(tmp_path_factory.mktemp("ort"))


@pytest.fixture(scope="module")
def fx_model(tmp_path_factory) -> Path:
    torch_or_skip()
    from fx_models import export_observed

    return export_observed(tmp_path_factory.mktemp("fx") / "fx_qat.onnx")


def run_cli(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def findings_by_code(path: Path) -> dict[str, list]:
    result = lint(load_model(path), load_target("common"))
    grouped: dict[str, list] = {}
    for finding in result.findings:
        grouped.setdefault(finding.code, []).append(finding)
    return grouped


# --- onnxruntime quantize_static ------------------------------------------------------------------


def test_ort_model_is_what_quantize_static_makes(ort_model):
    ops = Counter(n.op_type for n in onnx.load(str(ort_model)).graph.node)
    assert ops["QuantizeLinear"] == 10 and ops["DequantizeLinear"] == 18  # 10 pairs + 4 weights + 4 biases


def test_ort_model_findings(ort_model):
    proto = onnx.load(str(ort_model))
    inits = {t.name: t for t in proto.graph.initializer}
    bias_dqs = {n.name for n in proto.graph.node
                if n.op_type == "DequantizeLinear" and n.input[0] in inits
                and inits[n.input[0]].data_type == TensorProto.INT32}
    assert len(bias_dqs) == 4
    found = findings_by_code(ort_model)
    assert {(f.node, f.values["what"]) for f in found.pop("QDQ201")} == {(n, "scale") for n in bias_dqs}
    assert found == {}


def test_ort_model_has_no_errors_and_runs(ort_model):
    code, out, _ = run_cli("lint", ort_model, "--fail-on", "error")
    assert code == 0, out
    import onnxruntime as ort

    session = ort.InferenceSession(str(ort_model), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
    assert y.shape == (1, 8, 8, 8)


def test_inspect_ort_model(ort_model):
    code, text, err = run_cli("inspect", ort_model)
    assert (code, err) == (0, "")
    assert "Conv" in text and "QuantizeLinear" in text
    code, out, err = run_cli("inspect", ort_model, "--format", "json")
    assert (code, err) == (0, "")
    summary = json.loads(out)
    assert summary["model"]["opset"] == 13


# --- PyTorch FX QAT export ----------------------------------------------------------------------


def qparam_sources(path: Path) -> list[tuple[str, str, str, list[int], bool]]:
    """For every Q/DQ parameter: (node, op, scale|zero-point, constant shape, came through Identity)."""
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    inits = {t.name: t for t in graph.initializer}
    rows = []
    for node in graph.node:
        if node.op_type not in QDQ_OPS:
            continue
        for what, name in zip(("scale", "zero-point"), node.input[1:]):
            via_identity = False
            while name in producer and producer[name].op_type == "Identity":
                via_identity, name = True, producer[name].input[0]
            rows.append((node.name, node.op_type, what, list(inits[name].dims), via_identity))
    return rows


def test_fx_export_has_qdq_with_exporter_artefacts(fx_model):
    ops = Counter(n.op_type for n in onnx.load(str(fx_model)).graph.node)
    # Input, conv1-bn-relu, add-relu, maxpool, 2 branch convs, concat; 4 weights: 12 Q→DQ pairs.
    assert ops["QuantizeLinear"] == ops["DequantizeLinear"] == 12
    assert ops["BatchNormalization"] == 2 and ops["Div"] == 2  # QAT ConvBn left unfolded
    rows = qparam_sources(fx_model)
    assert len(rows) == 48 and all(shape == [1] for *_, shape, _ in rows)  # scale and zp are all [1]
    # The shared zero-point initializer is read directly once, then through Identity copies.
    assert sum(via for *_, via in rows) == 22
    assert not any(via for _, _, what, _, via in rows if what == "scale")


def test_fx_export_lint_reports_exactly_the_artefacts(fx_model):
    rows = qparam_sources(fx_model)
    found = findings_by_code(fx_model)
    assert set(found) == {"QDQ201", "QDQ202", "QDQ204"}, {c: len(f) for c, f in found.items()}
    # One QDQ201 per Q/DQ node, naming every [1]-shaped parameter it reads, in slot order.
    non_scalar: dict[str, list[tuple[str, list[int]]]] = {}
    for node, _, what, shape, _ in rows:
        if shape == [1]:
            non_scalar.setdefault(node, []).append((what, shape))
    assert sorted((f.node, f.values["what"], f.values["shape"]) for f in found["QDQ201"]) == sorted(
        (node, " and ".join(what for what, _ in params), params[0][1]) for node, params in non_scalar.items()
    )
    assert sorted((f.node, f.values["what"]) for f in found["QDQ202"]) == sorted(
        (node, what) for node, _, what, _, via in rows if via
    )
    assert all(f.values["chain"] == "Identity" for f in found["QDQ202"])


def test_fx_export_cli(fx_model):
    digest = hashlib.sha256(fx_model.read_bytes()).hexdigest()
    code, out, err = run_cli("lint", fx_model)
    assert code == 1 and err == ""  # QDQ201 is a warning, the default --fail-on
    assert out.splitlines()[-1].startswith("Found 48 findings (26 warnings, 22 info)")
    assert not any(" QDQ0" in line or " QDQ1" in line for line in out.splitlines())
    assert run_cli("lint", fx_model, "--fail-on", "error")[0] == 0
    code, text, err = run_cli("inspect", fx_model)
    assert (code, err) == (0, "") and "QuantizeLinear" in text
    code, out, _ = run_cli("inspect", fx_model, "--format", "json")
    assert code == 0 and json.loads(out)["model"]["opset"] == 13
    assert hashlib.sha256(fx_model.read_bytes()).hexdigest() == digest


def test_core_imports_and_lints_without_torch(tmp_path) -> None:
    """torch is an extra: the library and the CLI must import and lint with it absent."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import cli\n"
        f"sys.exit(cli.main(['lint', '--exit-zero', {str(ROOT / 'examples/models/demo_fx_qat.onnx')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "QDQ204" in done.stdout
