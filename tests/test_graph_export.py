"""qdq writes what its graph says, reusing the input's protobuf where nothing changed.

`qdq.graph.write` saves by patching the loaded ModelProto instead of rebuilding it. The oracle
is an independent reader, onnx-graphsurgeon: for every model of the conformance corpus, as
loaded and after the engine's fix (one target per model, the three in turn, to keep the run
short), the written model read back by graphsurgeon holds the same nodes in the same order (op,
domain, name, inputs, outputs, attribute values), the same constants (values, dtypes and shapes
bit for bit), and the same declared types and shapes as qdq's graph in memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, numpy_helper
from test_conformance import ENTRIES, TARGETS, Entry

from qdq.engine.fix import fix
from qdq.engine.ruleset import load_target
from qdq.graph import ir
from qdq.graph.model import Model, load_model, to_proto
from qdq.support.errors import ModelLoadError, QdqError

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "examples" / "models" / "demo_fx_qat.onnx"


def assert_written(model: Model, written: onnx.ModelProto) -> None:
    """`written` says what the graph in memory says, as graphsurgeon (an independent reader) reads it back:
    the same nodes in the same order, the same constants bit for bit, the same declarations."""
    ours, theirs = model.graph, gs.import_onnx(written)
    assert [_said(n) for n in ours.nodes] == [_said(n) for n in theirs.nodes]
    assert [(t.name, _type(t)) for t in ours.inputs] == [(t.name, _type(t)) for t in theirs.inputs]
    assert [(t.name, _type(t)) for t in ours.outputs] == [(t.name, _type(t)) for t in theirs.outputs]
    read_back = theirs.tensors()
    for name, tensor in ours.tensors().items():
        other = read_back[name]
        if isinstance(tensor, ir.Constant):
            assert isinstance(other, gs.Constant), name
            stored = _stored_values(_initializer(written, name), model.base_dir)
            assert_same_values(model.constant_values(tensor), stored, name)
        elif tensor.dtype is not None and tensor not in ours.inputs and tensor not in ours.outputs:
            assert _type(tensor) == _type(other), name
    for node, proto in zip(ours.nodes, written.graph.node):
        for key, value in node.attrs.items():
            if isinstance(value, ir.Constant):
                stored = next(a.t for a in proto.attribute if a.name == key)
                assert_same_values(np.asarray(value.values), numpy_helper.to_array(stored), f"{node.name}.{key}")
    assert ours.name == written.graph.name


def _said(node) -> tuple:
    """A node as both readers hold it; tensor attributes by name here, by value in `assert_written`."""
    def attribute(value):
        if isinstance(value, (ir.Graph, gs.Graph)):
            return [_said(n) for n in value.nodes]
        return value.name if isinstance(value, (ir.Constant, gs.Constant)) else value

    attrs = {key: attribute(value) for key, value in node.attrs.items()}
    return node.op, node.domain or None, node.name, [t.name for t in node.inputs], [t.name for t in node.outputs], attrs


def _type(tensor) -> tuple:
    """The ONNX element type and shape (either reader may hold a type numpy lacks as the ONNX enum)."""
    dtype = tensor.dtype
    element = dtype if dtype is None or isinstance(dtype, int) else onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return element, None if tensor.shape is None else tuple(tensor.shape)


def _initializer(model: onnx.ModelProto, name: str) -> TensorProto:
    return next(t for t in model.graph.initializer if t.name == name)


def _stored_values(tensor: TensorProto, base_dir: Path) -> np.ndarray:
    """The values onnx reads for `tensor`. A value a fix computed in a model with external data is held in
    qdq's scratch file (`qdq.graph.spill`) under an absolute location until `save_model` copies it next to the
    output; onnx refuses absolute locations, so that one is read relative to the scratch folder."""
    location = next((entry for entry in tensor.external_data if entry.key == "location"), None)
    if location is not None and Path(location.value).is_absolute():
        scratch = Path(location.value)
        tensor = TensorProto.FromString(tensor.SerializeToString())
        next(entry for entry in tensor.external_data if entry.key == "location").value = scratch.name
        base_dir = scratch.parent
    return numpy_helper.to_array(tensor, base_dir=str(base_dir))


def assert_same_values(ours: np.ndarray, theirs: np.ndarray, name: str) -> None:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), name
    assert ours.tobytes() == theirs.tobytes(), name


def _opsets(model: onnx.ModelProto) -> set[tuple[str, int]]:
    return {(entry.domain, entry.version) for entry in model.opset_import}


def loaded(entry: Entry) -> Model:
    try:
        return load_model(entry.path)
    except ModelLoadError:
        pytest.skip("qdq refuses this model: nothing to export")


# --- the corpus --------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_what_is_written_reads_back_as_the_graph_on_the_corpus(entry: Entry) -> None:
    model = loaded(entry)
    assert_written(model, to_proto(model))

    model = loaded(entry)
    target = TARGETS[ENTRIES.index(entry) % len(TARGETS)]
    try:
        fix(model, load_target(target))
    except QdqError:
        pass  # what the fixes left is still a graph to write
    assert_written(model, to_proto(model))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_an_unchanged_model_is_written_from_its_own_protobuf(entry: Entry) -> None:
    """Loaded and written back, each node and initializer is the input's (external references included)."""
    model = loaded(entry)
    ours = to_proto(model)
    assert list(ours.graph.node) == list(model.proto.graph.node)
    initializers = {t.name: t for t in model.proto.graph.initializer}
    assert all(t == initializers[t.name] for t in ours.graph.initializer)
    assert ours.doc_string == model.proto.doc_string and ours.graph.doc_string == model.proto.graph.doc_string
    assert (ours.ir_version, ours.producer_name, _opsets(ours)) == (model.proto.ir_version, model.proto.producer_name,
                                                                    _opsets(model.proto))
    assert list(ours.metadata_props) == list(model.proto.metadata_props)


# --- edits a fix makes ---------------------------------------------------------------------------------


def test_edits_are_written_and_the_rest_reused():
    """An attribute changed in place, a rewired input, a Constant node's value and an initializer
    replaced, an initializer renamed, a new node in a new domain: rebuilt; every other node reused."""
    model = load_model(BUNDLED)
    graph = model.graph
    by_op: dict[str, list[ir.Node]] = {}
    for node in graph.nodes:
        by_op.setdefault(node.op, []).append(node)
    first_dq, second_dq = by_op["DequantizeLinear"][:2]
    first_dq.attrs["axis"] = 0 if first_dq.attrs.get("axis") else 1
    second_dq.inputs[1] = ir.Constant("new_scale", np.array(0.25, np.float32))
    scale_node = next(n for n in by_op["Constant"] if np.any(np.asarray(n.attrs["value"].values)))
    scale_node.attrs["value"].values = np.asarray(scale_node.attrs["value"].values) * 2
    bn_weight, bn_bias = by_op["BatchNormalization"][0].inputs[1:3]
    bn_weight.values = np.asarray(bn_weight.values) + 1
    bn_bias.name = f"{bn_bias.name}_renamed"
    custom = ir.Node("Identity", "custom_identity", domain="com.example", inputs=[graph.outputs[0]],
                     outputs=[ir.Variable("custom_out", dtype=np.float32, shape=[1, 10])])
    graph.nodes.append(custom)

    ours = to_proto(model)
    rebuilt = {first_dq.name, second_dq.name, scale_node.name, by_op["BatchNormalization"][0].name}
    written = {n.name: n for n in ours.graph.node}
    for node in graph.nodes[:-1]:
        assert (written[node.name] == node.proto) == (node.name not in rebuilt), node.name
    assert ("com.example", 1) in _opsets(ours)
    initializers = {t.name: t for t in ours.graph.initializer}
    assert "new_scale" in initializers and bn_bias.name in initializers
    assert_written(model, ours)
