"""qdq's exporter writes the model gs.export_onnx writes, reusing the input's protobuf where nothing changed.

`qdq.graph_export` saves by patching the loaded ModelProto instead of rebuilding it with
`gs.export_onnx`. The oracle is graphsurgeon itself: for every model of the conformance corpus,
as loaded and after the engine's fix (one target per model, the three in turn, to keep the run
short), both exports of the same graph must hold the same nodes in the same order (op, domain,
name, inputs, outputs, attribute values), the same initializers (names in order; values,
dtypes and shapes bit for bit), the same graph inputs and outputs and the same value_info
(element type and shape), the same opset imports, IR version, producer and metadata.

Intended differences, not compared: what graphsurgeon drops and qdq keeps from the input (the
model's doc string, domain and version, the graph's doc string and metadata, a node's doc string
and metadata, a declaration's denotation and doc string), and the order of a node's attributes,
which a reused NodeProto keeps as the input had it. graphsurgeon also changes the loaded
protobuf it exports from (it names Constant-node tensors and may import domains there), so qdq's
export runs first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, numpy_helper
from test_conformance import ENTRIES, TARGETS, Entry

from qdq.errors import ModelLoadError, QdqError
from qdq.fix import fix
from qdq.graph_export import export_with_graphsurgeon
from qdq.graph_import import ImportedNode
from qdq.model import Model, load_model, to_proto
from qdq.ruleset import load_target

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "examples" / "models" / "demo_fx_qat.onnx"


def both_exports(model: Model) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """qdq's export, then graphsurgeon's of the same graph (which edits the graph and the loaded protobuf)."""
    ours = to_proto(model)
    return ours, export_with_graphsurgeon(model.graph, model.proto)


def assert_same_model(ours: onnx.ModelProto, theirs: onnx.ModelProto, base_dir: Path) -> None:
    assert ours.ir_version == theirs.ir_version and ours.producer_name == theirs.producer_name
    assert ours.producer_version == theirs.producer_version
    assert list(ours.metadata_props) == list(theirs.metadata_props)
    assert _opsets(ours) == _opsets(theirs)
    a, b = ours.graph, theirs.graph
    assert a.name == b.name
    assert [_node(n) for n in a.node] == [_node(n) for n in b.node]
    assert [t.name for t in a.initializer] == [t.name for t in b.initializer]
    for mine, gs_tensor in zip(a.initializer, b.initializer):
        assert_same_tensor(mine, gs_tensor, base_dir)
    for mine, gs_node in zip(a.node, b.node):
        for x, y in zip(sorted(mine.attribute, key=_name), sorted(gs_node.attribute, key=_name)):
            if x.type == onnx.AttributeProto.TENSOR:
                assert_same_tensor(x.t, y.t, base_dir)
    assert [_declared(v) for v in a.input] == [_declared(v) for v in b.input]
    assert [_declared(v) for v in a.output] == [_declared(v) for v in b.output]
    assert sorted(map(_declared, a.value_info)) == sorted(map(_declared, b.value_info))
    assert not b.sparse_initializer or a.sparse_initializer == b.sparse_initializer


def assert_same_tensor(ours: TensorProto, theirs: TensorProto, base_dir: Path) -> None:
    x = numpy_helper.to_array(ours, base_dir=str(base_dir))
    y = numpy_helper.to_array(theirs, base_dir=str(base_dir))
    assert (ours.name, ours.data_type, x.dtype, x.shape) == (theirs.name, theirs.data_type, y.dtype, y.shape)
    assert x.tobytes() == y.tobytes(), ours.name


def _opsets(model: onnx.ModelProto) -> set[tuple[str, int]]:
    return {(entry.domain, entry.version) for entry in model.opset_import}


def _name(attribute: onnx.AttributeProto) -> str:
    return attribute.name


def _node(node: onnx.NodeProto) -> tuple:
    """A node as compared: tensor attributes by name and type here, by value in `assert_same_model`."""
    attributes = {
        a.name: (a.t.name, a.t.data_type) if a.type == onnx.AttributeProto.TENSOR else onnx.helper.get_attribute_value(a)
        for a in node.attribute
    }
    return node.op_type, node.domain, node.name, list(node.input), list(node.output), attributes


def _declared(info: onnx.ValueInfoProto) -> tuple:
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        return info.name, kind, str(info.type)
    tensor_type = info.type.tensor_type
    shape = None
    if tensor_type.HasField("shape"):
        shape = tuple(d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
                      for d in tensor_type.shape.dim)
    return info.name, kind, tensor_type.elem_type, shape


def loaded(entry: Entry) -> Model:
    try:
        return load_model(entry.path)
    except ModelLoadError:
        pytest.skip("qdq refuses this model: nothing to export")


# --- the corpus --------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_export_matches_graphsurgeon_on_the_corpus(entry: Entry) -> None:
    model = loaded(entry)
    ours, theirs = both_exports(model)
    assert_same_model(ours, theirs, model.base_dir)

    model = loaded(entry)
    target = TARGETS[ENTRIES.index(entry) % len(TARGETS)]
    try:
        fix(model, load_target(target))
    except QdqError:
        pass  # what the fixes left is still a graph to write
    ours, theirs = both_exports(model)
    assert_same_model(ours, theirs, model.base_dir)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_an_unchanged_model_is_written_from_its_own_protobuf(entry: Entry) -> None:
    """Loaded and written back, each node and initializer is the input's (external references included)."""
    model = loaded(entry)
    if not all(isinstance(node, ImportedNode) for node in model.graph.nodes):
        return  # gs.import_onnx read it (subgraphs, functions): gs.export_onnx writes it
    ours = to_proto(model)
    assert list(ours.graph.node) == list(model.proto.graph.node)
    initializers = {t.name: t for t in model.proto.graph.initializer}
    assert all(t == initializers[t.name] for t in ours.graph.initializer)
    assert ours.doc_string == model.proto.doc_string and ours.graph.doc_string == model.proto.graph.doc_string


# --- edits a fix makes ---------------------------------------------------------------------------------


def test_edits_are_written_as_graphsurgeon_writes_them():
    """An attribute changed in place, a rewired input, a Constant node's value and an initializer
    replaced, an initializer renamed, a new node in a new domain: rebuilt; every other node reused."""
    model = load_model(BUNDLED)
    graph = model.graph
    by_op: dict[str, list[gs.Node]] = {}
    for node in graph.nodes:
        by_op.setdefault(node.op, []).append(node)
    first_dq, second_dq = by_op["DequantizeLinear"][:2]
    first_dq.attrs["axis"] = 0 if first_dq.attrs.get("axis") else 1
    second_dq.inputs[1] = gs.Constant("new_scale", np.array(0.25, np.float32))
    scale_node = next(n for n in by_op["Constant"] if np.any(np.asarray(n.attrs["value"].values)))
    scale_node.attrs["value"].values = np.asarray(scale_node.attrs["value"].values) * 2
    bn_weight, bn_bias = by_op["BatchNormalization"][0].inputs[1:3]
    bn_weight.values = np.asarray(bn_weight.values) + 1
    bn_bias.name = f"{bn_bias.name}_renamed"
    custom = gs.Node("Identity", "custom_identity", domain="com.example", inputs=[graph.outputs[0]],
                     outputs=[gs.Variable("custom_out", dtype=np.float32, shape=[1, 10])])
    graph.nodes.append(custom)

    ours = to_proto(model)
    rebuilt = {first_dq.name, second_dq.name, scale_node.name, by_op["BatchNormalization"][0].name}
    written = {n.name: n for n in ours.graph.node}
    for node in graph.nodes[:-1]:
        assert (written[node.name] == node.proto) == (node.name not in rebuilt), node.name
    assert ("com.example", 1) in _opsets(ours)
    initializers = {t.name: t for t in ours.graph.initializer}
    assert "new_scale" in initializers and bn_bias.name in initializers
    assert_same_model(ours, export_with_graphsurgeon(graph, model.proto), model.base_dir)
