"""Node names are for people only: tract writes none and AMD Quark leaves some nodes unnamed.

A finding, a change or a picture about an unnamed node must still say which node it is, and a
model must lint and fix the same whether its nodes have names or not.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_ort

import qdq
from qdq.engine.lint import identity
from qdq.engine.suppression import is_ignored
from qdq.graph.model import save_model
from qdq.reports.neighbourhood import neighbourhoods
from qdq.reports.text import describe

CORPUS = Path(__file__).resolve().parent / "corpus"
TARGETS = ("npu", "trt", "ort")
# Written by tract's test suite: none of its nodes has a name.
ALL_UNNAMED = CORPUS / "public" / "tract" / "qtdnn_10x5_101_i32_biases.onnx"
LABEL = re.compile(r"\(unnamed, writes '(.+)'\)")


def unnamed_outputs(path: Path) -> set[str]:
    """The first output of every unnamed node in the file, read with onnx."""
    graph = onnx.load(str(path)).graph
    return {node.output[0] for node in graph.node if not node.name and node.output and node.output[0]}


@pytest.mark.parametrize("target", TARGETS)
def test_findings_name_an_unnamed_node_by_its_output(target):
    result = qdq.lint(ALL_UNNAMED, target=target)
    outputs = unnamed_outputs(ALL_UNNAMED)
    on_nodes = [f for f in result.findings if f.node is not None]
    assert on_nodes, "the model was chosen for its findings on nodes"
    for finding in on_nodes:
        label = LABEL.fullmatch(finding.node)
        assert label is not None and label.group(1) in outputs, finding.node
        line = describe(finding)  # what the text report prints
        assert finding.node in line and "  " not in line, line
    assert len({identity(f) for f in result.findings}) == len(result.findings)


def test_pictures_centre_on_the_unnamed_node_a_finding_names():
    model = qdq.api.as_model(ALL_UNNAMED)
    findings = qdq.lint(model, target="npu").findings
    for finding, drawn in zip(findings, neighbourhoods(model, findings)):
        centre = next(node.id for node in drawn.nodes if node.centre)
        written = {tensor for producer, _, tensor in drawn.edges if producer == centre}
        assert LABEL.fullmatch(finding.node).group(1) in written, (finding.node, written)
        assert all(LABEL.fullmatch(node.name) for node in drawn.nodes)  # every box says which node it is


@pytest.mark.parametrize("name", ["ort/transformer_u8_per_channel.onnx", "quark/resnet_xint8.onnx"])
def test_a_model_lints_and_fixes_the_same_without_node_names(tmp_path, name):
    source = CORPUS / name
    proto = onnx.load(str(source))
    for node in proto.graph.node:
        node.name = ""
    bare = tmp_path / "bare.onnx"
    onnx.save(proto, str(bare))
    for target in TARGETS:
        named, unnamed = qdq.lint(source, target=target), qdq.lint(bare, target=target)
        assert sorted((f.code, f.tensors) for f in named.findings) == sorted((f.code, f.tensors) for f in unnamed.findings)
    written, changes = {}, {}
    for label, path in (("named", source), ("unnamed", bare)):
        result = qdq.fix(path, target="trt")
        written[label] = tmp_path / f"{label}.fixed.onnx"
        save_model(result.model, written[label])
        changes[label] = sorted((c.code, c.tensor) for c in result.changes)
        assert all(c.node for c in result.changes)
    assert changes["named"] == changes["unnamed"]
    read = {(node.op_type, node.output[0]) for node in proto.graph.node}  # nodes a fix added have names
    assert not any(node.name for node in onnx.load(str(written["unnamed"])).graph.node
                   if (node.op_type, node.output[0]) in read)
    data = onnx.load(str(source)).graph.input[0]
    shape = [d.dim_value or 1 for d in data.type.tensor_type.shape.dim]
    feeds = {data.name: np.random.default_rng(0).uniform(-2, 2, shape).astype(np.float32)}
    for a, b in zip(run_ort(written["named"], feeds), run_ort(written["unnamed"], feeds)):
        np.testing.assert_array_equal(a, b)


def test_a_per_node_ignore_matches_an_unnamed_node_as_its_findings_show_it():
    findings = qdq.lint(ALL_UNNAMED, target="npu").findings
    shown = findings[0].node
    ignores = {shown: ["ALL"]}
    assert [f for f in findings if is_ignored(f, ignores)] == [f for f in findings if f.node == shown]
    assert len({f.node for f in findings}) > 1


# Real-tool models whose fixes create tensors named after a node: a folded BatchNorm bias, a
# private copy of a shared bias, a constant folded into an op's input.
NODE_NAMED_TENSORS = [("torch/yolo_fx_qat_x86.onnx", "npu"), ("torch/yolo_fx_convert_x86.onnx", "trt"),
                      ("torch/transformer_fx_qat_qnnpack.onnx", "trt")]


@pytest.mark.parametrize(("name", "target"), NODE_NAMED_TENSORS)
def test_tensors_a_fix_creates_for_an_unnamed_node_are_named_after_its_output(tmp_path, name, target):
    proto = onnx.load(str(CORPUS / name))
    for node in proto.graph.node:
        node.name = ""
    bare = tmp_path / "bare.onnx"
    onnx.save(proto, str(bare))
    before = {t for node in proto.graph.node for t in [*node.input, *node.output] if t}
    before |= {tensor.name for tensor in proto.graph.initializer} | {i.name for i in proto.graph.input}
    created = set(qdq.fix(bare, target=target).model.graph.tensors()) - before
    assert created, "the model was chosen for its fixes"
    unrooted = sorted(t for t in created if not any(t.startswith(old) for old in before))
    assert not unrooted, unrooted[:5]
