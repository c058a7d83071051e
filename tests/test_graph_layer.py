"""qdq's graph layer reads a model as onnx-graphsurgeon reads it and tidies it as graphsurgeon does.

qdq holds graphs in its own representation (`qdq.graph.ir`, read by `qdq.graph.read`, cleaned and
sorted by `qdq.graph.tidy`). graphsurgeon is the independent oracle: on random QDQ graphs, the
bundled model and graphs with subgraphs, both readers see the same nodes, links, declarations
and constants, and after shuffling the nodes and adding dead ones both tidies keep the same
nodes in the same order.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from random_graphs import qdq_models

from qdq.graph import ir
from qdq.graph.read import import_graph
from qdq.graph.tidy import tidy
from qdq.graph.write import export_model
from qdq.support.errors import QdqError

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "examples" / "models" / "demo_fx_qat.onnx"
PROFILE = settings(deadline=None, derandomize=True, max_examples=40)


def seen(graph) -> dict:
    """What a reader holds of a graph, comparable across qdq's and graphsurgeon's objects."""
    def tensor(t):
        kind = "constant" if isinstance(t, (ir.Constant, gs.Constant)) else "variable"
        dtype = t.dtype if t.dtype is None or isinstance(t.dtype, int) else np.dtype(t.dtype)
        values = np.asarray(t.values).tobytes() if kind == "constant" else None
        shape = None if t.shape is None else tuple(t.shape)
        return t.name, kind, dtype, shape, values, [p.name for p in t.inputs], sorted(c.name for c in t.outputs)

    def attribute(value):
        if isinstance(value, (ir.Graph, gs.Graph)):
            return seen(value)
        if isinstance(value, (ir.Constant, gs.Constant)):
            return tensor(value)
        return value

    return {
        "nodes": [(n.op, n.domain or None, n.name, [tensor(t) for t in n.inputs], [tensor(t) for t in n.outputs],
                   {key: attribute(value) for key, value in n.attrs.items()}) for n in graph.nodes],
        "inputs": [tensor(t) for t in graph.inputs],
        "outputs": [tensor(t) for t in graph.outputs],
    }


def assert_linked(graph: ir.Graph) -> None:
    """Every edge is recorded on both ends, once per use."""
    for node in graph.nodes:
        for tensor in node.inputs:
            assert sum(c is node for c in tensor.outputs) == sum(t is tensor for t in node.inputs)
        for tensor in node.outputs:
            assert any(p is node for p in tensor.inputs)


@PROFILE
@given(qdq_models())
def test_import_matches_graphsurgeon_on_random_models(proto):
    ours = import_graph(proto)
    assert seen(ours) == seen(gs.import_onnx(proto))
    assert_linked(ours)


def test_import_matches_graphsurgeon_on_the_bundled_model():
    proto = onnx.load(str(BUNDLED))
    ours = import_graph(proto)
    assert seen(ours) == seen(gs.import_onnx(proto))
    assert_linked(ours)


def _with_if(outer_reader: bool = False) -> onnx.ModelProto:
    """c, x → If(then: Identity(x), else: Neg(x)) → out: both branches read x from the outer graph."""
    def branch(op: str, name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"], name=f"{name}_node")], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", onnx.TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("Relu", ["x_in"], ["x"], name="relu"),
             helper.make_node("If", ["c"], ["out"], name="if", then_branch=branch("Identity", "then"),
                              else_branch=branch("Neg", "else"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
                                           helper.make_tensor_value_info("x_in", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraphs_read_the_enclosing_graphs_tensors():
    proto = _with_if()
    graph = import_graph(proto)
    relu, if_node = graph.nodes
    then_node = if_node.attrs["then_branch"].nodes[0]
    assert then_node.inputs[0] is relu.outputs[0]
    assert seen(graph) == seen(gs.import_onnx(proto))


def test_a_rewired_subgraph_reader_is_written_and_tidied():
    """A fix that gives the outer tensor's readers another tensor reaches into the branches; the
    producer of what only a branch reads survives tidy, and the written model checks."""
    proto = _with_if()
    graph = import_graph(proto)
    relu, if_node = graph.nodes
    doubled = ir.Variable("x_doubled", np.float32, [1])
    graph.nodes.append(ir.Node("Add", "double", inputs=[relu.outputs[0], relu.outputs[0]], outputs=[doubled]))
    for reader in [n for n in relu.outputs[0].outputs if n.op != "Add"]:
        reader.inputs[0] = doubled
    tidy(graph)
    assert [n.name for n in graph.nodes] == ["relu", "double", "if"]
    written = export_model(graph, proto)
    onnx.checker.check_model(written, full_check=True)
    branches = {a.name: a.g for a in written.graph.node[2].attribute}
    assert [list(n.input) for n in branches["then_branch"].node] == [["x_doubled"]]
    assert seen(import_graph(written)) == seen(graph)


@PROFILE
@given(qdq_models(), st.integers(0, 2**16))
def test_tidy_matches_cleanup_and_toposort(proto, seed):
    ours, theirs = import_graph(proto), gs.import_onnx(proto)
    for graph, library in ((ours, ir), (theirs, gs)):
        random.Random(seed).shuffle(graph.nodes)
        first = graph.nodes[0]
        # A dead branch: reads a live tensor, feeds nothing the outputs need.
        graph.nodes.append(library.Node("Relu", name="dead", inputs=[first.outputs[0]],
                                        outputs=[library.Variable("dead_out")]))
    theirs.cleanup().toposort()
    tidy(ours)
    assert "dead" not in {n.name for n in ours.nodes}
    assert seen(ours) == seen(theirs)


def test_tidy_refuses_a_cycle():
    graph = import_graph(onnx.load(str(BUNDLED)))
    first, last = graph.nodes[0], graph.nodes[-1]
    first.inputs.append(last.outputs[0])  # the first node now needs the last one's output
    with pytest.raises(QdqError, match="cycle"):
        tidy(graph)
