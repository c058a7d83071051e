"""qdq's graph in memory (`qdq.graph.ir`): both ends of every edge agree after any list operation,
constants decode lazily and forget their protobuf when replaced, copies share nothing mutable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qdq.graph import ir
from qdq.graph.read import import_graph


def linked(nodes: list[ir.Node], tensors: list[ir.Tensor]) -> bool:
    """Each tensor's readers are exactly the nodes listing it as an input, once per use, and likewise for writers."""
    for tensor in tensors:
        for side, mirror in (("outputs", "inputs"), ("inputs", "outputs")):
            expected = sorted(id(n) for n in nodes for t in getattr(n, mirror) if t is tensor)
            if sorted(id(n) for n in getattr(tensor, side)) != expected:
                return False
    return True


OPERATIONS = st.lists(st.tuples(st.sampled_from(["append", "insert", "set", "set_slice", "del", "del_slice", "pop",
                                                 "remove", "clear", "extend", "iadd"]),
                                st.integers(0, 5), st.integers(0, 5)), max_size=25)


@settings(deadline=None, derandomize=True, max_examples=200)
@given(OPERATIONS)
def test_edges_stay_in_sync_under_any_list_operation(operations):
    tensors = [ir.Variable(f"t{i}") for i in range(6)]
    nodes = [ir.Node("Add", f"n{i}", inputs=tensors[i:i + 2], outputs=[ir.Variable(f"o{i}")]) for i in range(3)]
    node = nodes[0]
    for operation, a, b in operations:
        edges, size = node.inputs, len(node.inputs)
        if operation == "append":
            edges.append(tensors[a])
        elif operation == "insert":
            edges.insert(a, tensors[b])
        elif operation == "set" and size:
            edges[a % size] = tensors[b]
        elif operation == "set_slice":
            edges[a:a + 1] = [tensors[b], tensors[a]]
        elif operation == "del" and size:
            del edges[a % size]
        elif operation == "del_slice":
            del edges[a:b]
        elif operation == "pop" and size:
            edges.pop(a % size)
        elif operation == "remove" and tensors[a] in edges:
            edges.remove(tensors[a])
        elif operation == "clear":
            edges.clear()
        elif operation == "extend":
            edges.extend(tensors[a:b])
        elif operation == "iadd":
            edges += tensors[b:a]
        assert linked(nodes, tensors), (operation, a, b)


def test_remove_finds_the_element_itself_not_an_equal_one():
    first, second = ir.Variable("same"), ir.Variable("same")
    node = ir.Node("Add", "n", inputs=[first, second])
    node.inputs.remove(second)
    assert list(node.inputs) == [first] and first.outputs == [node] and second.outputs == []


def test_a_stored_constant_decodes_on_first_use_and_forgets_its_protobuf_when_replaced(monkeypatch):
    proto = numpy_helper.from_array(np.arange(6, dtype=np.int8).reshape(2, 3), "w")
    constant = ir.Constant.stored(proto)
    assert (constant.dtype, tuple(constant.shape), constant.proto) == (np.dtype(np.int8), (2, 3), proto)
    decoded = []
    monkeypatch.setattr(ir, "decode", lambda p: decoded.append(p.name) or np.zeros((2, 3), np.int8))
    _ = constant.values, constant.values
    assert decoded == ["w"]
    constant.values = np.ones(4, np.float32)
    assert constant.proto is None and (constant.dtype, constant.shape) == (np.dtype(np.float32), (4,))


def test_types_numpy_lacks_are_held_as_the_onnx_enum():
    assert ir.element_dtype(TensorProto.BFLOAT16) == TensorProto.BFLOAT16
    assert ir.element_dtype(TensorProto.FLOAT8E4M3FN) == TensorProto.FLOAT8E4M3FN
    assert ir.element_dtype(TensorProto.UINT8) == np.dtype(np.uint8)


@pytest.mark.parametrize("indices", [np.array([1, 5], np.int64), np.array([[0, 1], [1, 2]], np.int64)])
def test_a_sparse_tensor_decodes_to_its_dense_values(indices):
    values = numpy_helper.from_array(np.array([7.0, 9.0], np.float32), "s")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(indices, "s_indices"), [2, 3])
    constant = ir.Constant.stored(sparse)
    expected = np.zeros((2, 3), np.float32)
    expected.reshape(-1)[[1, 5]] = [7.0, 9.0]
    assert constant.name == "s" and np.array_equal(constant.values, expected)


def _model_with_loop_body() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="inner_add")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("Relu", ["x_in"], ["x"], name="relu"),
             helper.make_node("Loop", ["n", "cond"], ["out"], name="loop", body=body)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in
                                           (("x_in", TensorProto.FLOAT, [1]), ("n", TensorProto.INT64, []),
                                            ("cond", TensorProto.BOOL, []))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 1])],
                              [numpy_helper.from_array(np.ones(1, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_copy_shares_no_node_or_tensor_and_keeps_subgraphs_reading_the_copy():
    graph = import_graph(_model_with_loop_body())
    copy = graph.copy()
    originals = {id(x) for n in graph.nodes for x in (n, *n.inputs, *n.outputs)}
    assert not originals & {id(x) for n in copy.nodes for x in (n, *n.inputs, *n.outputs)}
    relu, loop = copy.nodes
    inner = loop.attrs["body"].nodes[0]
    assert inner.inputs[0] is relu.outputs[0] and inner in relu.outputs[0].outputs
    assert inner.inputs[1].proto is graph.nodes[1].attrs["body"].nodes[0].inputs[1].proto  # shared, not copied
    relu.outputs[0].name = "renamed"
    assert graph.nodes[0].outputs[0].name == "x"


def test_tensors_lists_each_named_tensor_once_in_graph_order():
    graph = import_graph(_model_with_loop_body())
    assert list(graph.tensors()) == ["x_in", "n", "cond", "x", "out"]  # a body's reads are its own
