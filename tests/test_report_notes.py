"""Reports say what qdq could not check and what reading a model changed, on real tools' files.

AMD Quark's BF16 configuration quantizes with its own ExtendedQuantizeLinear/DequantizeLinear
(com.amd.quark), which qdq does not read: lint must report them (QDQ006) instead of calling the
model one with nothing to check. Quark's XINT8 files have nodes out of topological order, which reading
sorts: the written file is sorted too, so `qdq fix` reports it as `qdq lint` does. Node names
used twice pass the ONNX checker but not onnxruntime, and lint says so.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from cli_run import qdq

CORPUS = Path(__file__).resolve().parent / "corpus"
QUARK_BF16 = CORPUS / "quark" / "resnet_bf16.onnx"
QUARK_UNSORTED = CORPUS / "quark" / "resnet_xint8.onnx"


def op_counts(proto: onnx.ModelProto) -> Counter:
    return Counter((node.domain, node.op_type) for node in proto.graph.node)


@pytest.mark.parametrize("target", ["npu", "trt", "ort"])
def test_lint_names_the_quantization_ops_it_does_not_read(target):
    counts = op_counts(onnx.load(str(QUARK_BF16)))
    extended = {op: n for (domain, op), n in counts.items() if domain == "com.amd.quark"}
    assert set(extended) == {"ExtendedQuantizeLinear", "ExtendedDequantizeLinear"}
    run = qdq("lint", QUARK_BF16, "--target", target, "--format", "json")
    assert run.code == 1, run.err
    [finding] = run.json()["findings"]
    assert finding["code"] == "QDQ006" and finding["severity"] == "error"
    for op, n in extended.items():
        assert f"{n} com.amd.quark {op}" in finding["message"]
    assert run.json()["notes"] == ["the model has no QuantizeLinear or DequantizeLinear nodes"]


def test_unread_quantization_ops_beside_qdq_are_named(tmp_path):
    proto = onnx.load(str(CORPUS / "quark" / "yolo_a8w8.onnx"))
    renamed = next(node for node in proto.graph.node if node.op_type == "DequantizeLinear")
    renamed.op_type, renamed.domain = "VendorDequantizeLinear", "com.example"
    proto.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    path = tmp_path / "mixed.onnx"
    onnx.save(proto, str(path))
    findings = qdq("lint", path, "--target", "trt", "--format", "json").json()["findings"]
    [unread] = [f for f in findings if f["code"] == "QDQ006"]
    assert "quantized with 1 op(s) qdq does not read (1 com.example VendorDequantizeLinear)" in unread["message"]


def written_in_order(path: Path) -> bool:
    graph = onnx.load(str(path)).graph
    known = {t.name for t in graph.initializer} | {t.name for t in graph.input} | {""}
    for node in graph.node:
        if not set(node.input) <= known:
            return False
        known |= set(node.output)
    return True


def test_fix_reports_what_reading_repaired_in_the_file_it_writes(tmp_path):
    assert not written_in_order(QUARK_UNSORTED)  # as Quark writes it
    out = tmp_path / "fixed.onnx"
    report = tmp_path / "fix.json"
    html = tmp_path / "fix.html"
    run = qdq("fix", QUARK_UNSORTED, "--target", "trt", "-o", out, "--report", report, "--report-html", html)
    assert run.code in (0, 1), run.err
    assert written_in_order(out)
    sorted_note = "its nodes were not in topological order; qdq sorted them"
    assert run.out.splitlines()[0] == f"note: {sorted_note}"
    assert json.loads(report.read_text())["notes"] == [sorted_note]
    assert sorted_note in html.read_text()


def test_lint_says_onnxruntime_refuses_a_model_whose_node_names_repeat(tmp_path):
    source = CORPUS / "quark" / "yolo_a8w8.onnx"
    assert qdq("lint", source, "--target", "trt", "--format", "json").json()["notes"] == []
    proto = onnx.load(str(source))
    proto.graph.node[3].name = proto.graph.node[2].name  # what a graph-surgery script can leave
    path = tmp_path / "renamed.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(Exception, match="same node name"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    notes = qdq("lint", path, "--target", "trt", "--format", "json").json()["notes"]
    assert notes == [f"1 node name(s) used more than once ({proto.graph.node[2].name!r}): onnxruntime refuses "
                     "the model, and findings on those nodes cannot be told apart"]
