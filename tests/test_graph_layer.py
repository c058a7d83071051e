"""qdq's fast graph import and tidy build exactly what onnx-graphsurgeon's own would.

Both replace graphsurgeon code for speed (`qdq/graph_import.py`, `qdq/graph_tidy.py`), so the
check is equivalence: the exported model is byte-identical on random QDQ graphs, on the bundled
model, with nodes shuffled and with dead nodes added.
"""

from __future__ import annotations

import random
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from random_graphs import qdq_models

from qdq.errors import QdqError
from qdq.graph_import import import_graph
from qdq.graph_tidy import tidy

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "examples" / "models" / "demo_fx_qat.onnx"
PROFILE = settings(deadline=None, derandomize=True, max_examples=40)


def exported(graph: gs.Graph) -> bytes:
    return gs.export_onnx(graph).SerializeToString()


@PROFILE
@given(qdq_models())
def test_import_matches_graphsurgeon_on_random_models(proto):
    assert exported(import_graph(proto)) == exported(gs.import_onnx(proto))


def test_import_matches_graphsurgeon_on_the_bundled_model():
    proto = onnx.load(str(BUNDLED))
    ours, theirs = import_graph(proto), gs.import_onnx(proto)
    assert exported(ours) == exported(theirs)
    # The objects are linked the same way: every edge is recorded on both ends.
    for node in ours.nodes:
        assert all(node in t.outputs for t in node.inputs) and all(node in t.inputs for t in node.outputs)


def test_import_hands_subgraphs_to_graphsurgeon():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "branch", [],
                               [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1])])
    proto = helper.make_model(graph)
    assert isinstance(import_graph(proto).nodes[0].attrs["then_branch"], gs.Graph)
    assert exported(import_graph(proto)) == exported(gs.import_onnx(proto))


@PROFILE
@given(qdq_models(), st.integers(0, 2**16))
def test_tidy_matches_cleanup_and_toposort(proto, seed):
    ours, theirs = import_graph(proto), import_graph(proto)
    for graph in (ours, theirs):
        rng = random.Random(seed)
        rng.shuffle(graph.nodes)
        first = graph.nodes[0]
        # A dead branch: reads a live tensor, feeds nothing the outputs need.
        graph.nodes.append(gs.Node("Relu", name="dead", inputs=[first.outputs[0]], outputs=[gs.Variable("dead_out")]))
    theirs.cleanup().toposort()
    tidy(ours)
    assert "dead" not in {n.name for n in ours.nodes}
    assert exported(ours) == exported(theirs)


def test_tidy_refuses_a_cycle():
    graph = import_graph(onnx.load(str(BUNDLED)))
    first, last = graph.nodes[0], graph.nodes[-1]
    first.inputs.append(last.outputs[0])  # the first node now needs the last one's output
    with pytest.raises(QdqError, match="cycle"):
        tidy(graph)
