"""Integers that another op reads or writes keep their grid: fixes move only integers their own Q/DQs hold.

onnxruntime's QOperator format (`quantize_static(quant_format=QOperator)`) quantizes a model with
QLinearConv, QLinearAdd and QGemm, which read and write integers with scales of their own; only
the input's QuantizeLinear and the output's DequantizeLinear are Q/DQ nodes. A new scale on that
Q would hand QLinearConv integers on a grid it does not know. Checked on the file onnxruntime
wrote, with onnx reading the results; the whole corpus asserts the same in
`test_conformance.held_grids`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import onnx
import pytest

from cli_run import qdq
from qdq.engine.fix import fix
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model, save_model

CORPUS = Path(__file__).parent / "corpus"
QOPERATOR = CORPUS / "ort" / "resnet_qoperator.onnx"
# A DequantizeLinear that reads integers a Cast makes from floats (onnxruntime's own test model).
CAST_INTEGERS = CORPUS / "public" / "onnxruntime" / "ort_github_issue_19590.onnx"


def boundary_nodes(path: Path) -> dict[str, onnx.NodeProto]:
    """The Q/DQ nodes whose integers a node other than a Q/DQ reads or writes, by name."""
    model = onnx.load(str(path))
    producers = {out: node for node in model.graph.node for out in node.output}
    found = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            if any(node.output[0] in other.input and other.op_type != "DequantizeLinear" for other in model.graph.node):
                found[node.name] = node
        elif node.op_type == "DequantizeLinear":
            producer = producers.get(node.input[0])
            if producer is not None and producer.op_type != "QuantizeLinear":
                found[node.name] = node
    return found


def grids(path: Path, nodes: dict[str, onnx.NodeProto]) -> dict[str, list]:
    """Each named node's scale and zero-point values, as stored in the file at `path`."""
    model = onnx.load(str(path))
    constants = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    by_name = {node.name: node for node in model.graph.node}
    return {name: [constants.get(tensor) for tensor in by_name[name].input[1:3]] for name in nodes}


def test_the_qoperator_file_is_what_onnxruntime_wrote():
    """Guards the tests below: the Q/DQ nodes at its two ends hand integers to and from integer ops."""
    ops = Counter(node.op_type for node in onnx.load(str(QOPERATOR)).graph.node)
    assert ops["QLinearConv"] >= 1 and ops["QGemm"] == 1 and ops["QuantizeLinear"] == ops["DequantizeLinear"] == 1
    assert len(boundary_nodes(QOPERATOR)) == 2


@pytest.mark.parametrize("target", ["npu", "trt", "ort"])
def test_lint_names_the_integer_ops_and_offers_no_fix_that_would_move_their_integers(target):
    run = qdq("lint", QOPERATOR, "--target", target, "--format", "json")
    report = run.json()
    ops = Counter(node.op_type for node in onnx.load(str(QOPERATOR)).graph.node
                  if node.op_type not in ("QuantizeLinear", "DequantizeLinear", "Flatten"))
    [unread] = [f for f in report["findings"] if f["code"] == "QDQ006"]  # an error: never clean
    for op, count in ops.items():
        assert f"{count} {op}" in unread["message"] or f"{count} com.microsoft {op}" in unread["message"], (op, count)
    assert run.code == 1
    on_boundary = [f for f in report["findings"] if f["node"] in boundary_nodes(QOPERATOR)]
    assert all(f["fix"] is None for f in on_boundary), on_boundary


@pytest.mark.parametrize("target", ["npu", "trt"])
def test_fix_leaves_the_grid_of_integers_other_ops_read(target, tmp_path):
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", QOPERATOR, "--target", target, "-o", out, "--format", "json")
    assert run.code in (0, 1), run.err
    assert out.exists()
    boundary = boundary_nodes(QOPERATOR)
    assert grids(out, boundary) == grids(QOPERATOR, boundary)
    assert not [c for c in json.loads(run.out)["changes"] if c["node"] in boundary]


def test_a_dequantize_of_cast_integers_keeps_its_grid(tmp_path):
    """Before, the NPU fix gave this DQ scale 2^6 and zero-point 128 for the uint8 integers a Cast
    makes: every value it hands on changed (cosine 0 against the input's outputs)."""
    boundary = boundary_nodes(CAST_INTEGERS)
    assert boundary, "the model no longer has a DQ of integers another op writes"
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", CAST_INTEGERS, "--target", "npu", "-o", out, "--keep-failed")
    assert run.code in (0, 1), run.err
    assert collapsed(grids(out, boundary)) == collapsed(grids(CAST_INTEGERS, boundary))


def collapsed(found: dict[str, list]) -> dict[str, list]:
    """Grids with a one-element list read as its element (QDQ201 stores [s] as s: the same grid)."""
    return {name: [v[0] if isinstance(v, list) and len(v) == 1 else v for v in values] for name, values in found.items()}


def test_both_ends_of_a_narrow_range_clip_take_the_same_new_grid(tmp_path):
    """PT2E writes per-channel int8 weights as Q → Clip(-127, 127) → DQ. The Clip's bounds are steps
    from the zero-point, so a new scale (QDQ502, QDQ504) may move both ends, and must move them alike."""
    model = load_model(CORPUS / "torch" / "yolo_pt2e_xnnpack_unfolded.onnx")
    fix(model, load_target("npu").narrowed(select=["QDQ502", "QDQ504"]))
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    proto = onnx.load(str(out))
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output}
    pairs = 0
    for dq in (n for n in proto.graph.node if n.op_type == "DequantizeLinear"):
        clip = producers.get(dq.input[0])
        q = producers.get(clip.input[0]) if clip is not None and clip.op_type == "Clip" else None
        if q is None or q.op_type != "QuantizeLinear":
            continue
        pairs += 1
        scale = constants[q.input[1]]
        assert scale.size == 1 and math.log2(float(scale)).is_integer(), (q.name, scale)  # one power of two
        for slot in (1, 2):
            assert (constants[q.input[slot]] == constants[dq.input[slot]]).all(), (q.name, dq.name, slot)
    assert pairs == 28
