"""Read what onnxruntime runs: repair the harmless ways real exports differ from the ONNX checker's rules.

The ONNX checker is stricter than the runtimes users deploy on. AMD Quark writes graphs whose
nodes are not in topological order; exporters leave `value_info` entries without a type and graph
outputs without a shape. onnxruntime loads all of these, so qdq must too: each repair here is
made on the loaded model only (the input file is never touched) and returns a note saying what
was done, so nothing changes silently. What cannot be repaired (a real cycle, an input nothing
produces) is left as it is for the checker to refuse.
"""

from __future__ import annotations

import heapq

import onnx

_LARGE_BYTES = 1 << 16


def normalize(proto: onnx.ModelProto, checked: bool = False) -> list[str]:
    """Repair `proto.graph` in place; one note per kind of repair made.

    `checked`: the ONNX checker accepts the model as it is, which proves its nodes are in order and
    its tensor outputs have shapes, so only the untyped value_info is left to look for (the order
    test alone takes a second on a 100k-node model).
    """
    notes = []
    if not checked and _sort_nodes(proto.graph):
        notes.append("its nodes were not in topological order; qdq sorted them")
    untyped = _drop_untyped_value_info(proto.graph)
    if untyped:
        notes.append(f"{untyped} value_info entr{'y has' if untyped == 1 else 'ies have'} no element type; qdq dropped them")
    shapeless = [] if checked else _shape_graph_outputs(proto)
    if shapeless:
        notes.append(f"graph output(s) {', '.join(map(repr, shapeless))} declare no shape; qdq took it from shape inference")
    return notes


def without_weight_data(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` for shape inference: weights keep their dims but not their data, small tensors
    (a Reshape's shape) their values. Inference reads no more, and the copy of a model with GBs of weights is small."""
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    for tensor in light.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.raw_data) > _LARGE_BYTES:
            tensor.ClearField("raw_data")
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
    return light


def _sort_nodes(graph: onnx.GraphProto) -> bool:
    """Order the nodes topologically, keeping file order among ready nodes; False if already sorted.

    A graph with a cycle or an input no node produces cannot be sorted and stays as it is.
    """
    available = {value.name for value in graph.input} | {t.name for t in graph.initializer} | {""}
    available |= {t.values.name for t in graph.sparse_initializer}
    produced = {name for node in graph.node for name in node.output}
    # In order when no node reads a value a later node produces: `pending` is what is still to come.
    # Only nodes with attributes can have subgraphs, whose outer reads `_reads` collects.
    pending = produced - available
    for node in graph.node:
        if not pending.isdisjoint(_reads(node) if node.attribute else node.input):
            break
        pending.difference_update(node.output)
    else:
        return False
    waiting: dict[int, int] = {}
    readers: dict[str, list[int]] = {}
    ready: list[int] = []
    for index, node in enumerate(graph.node):
        needs = {name for name in _reads(node) if name in produced and name not in available}
        waiting[index] = len(needs)
        for name in needs:
            readers.setdefault(name, []).append(index)
        if not needs:
            heapq.heappush(ready, index)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for name in graph.node[index].output:
            for reader in readers.pop(name, ()):
                waiting[reader] -= 1
                if waiting[reader] == 0:
                    heapq.heappush(ready, reader)
    if len(order) != len(graph.node):
        return False  # a cycle: the checker will name it
    nodes = [graph.node[index] for index in order]
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    return True


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values a node reads, including those its subgraphs read from the outer scope."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {value.name for value in sub.input} | {t.name for t in sub.initializer}
            for inner_node in sub.node:
                names |= _reads(inner_node) - inner
                inner |= set(inner_node.output)
    return names


def _drop_untyped_value_info(graph: onnx.GraphProto) -> int:
    kept = [info for info in graph.value_info if _has_element_type(info)]
    dropped = len(graph.value_info) - len(kept)
    if dropped:
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return dropped


def _has_element_type(info: onnx.ValueInfoProto) -> bool:
    kind = info.type.WhichOneof("value")
    if kind is None:
        return False
    if kind in ("tensor_type", "sparse_tensor_type"):
        return getattr(info.type, kind).elem_type != onnx.TensorProto.UNDEFINED
    return True


def _shape_graph_outputs(proto: onnx.ModelProto) -> list[str]:
    """Give tensor graph outputs without a shape the one shape inference finds; the names it filled."""
    missing = [out for out in proto.graph.output
               if out.type.WhichOneof("value") == "tensor_type" and not out.type.tensor_type.HasField("shape")]
    if not missing:
        return []
    inferred = inferred_types(proto)
    filled = []
    for out in missing:
        found = inferred.get(out.name)
        if found is not None and found.tensor_type.HasField("shape"):
            out.type.tensor_type.shape.CopyFrom(found.tensor_type.shape)
            if out.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
                out.type.tensor_type.elem_type = found.tensor_type.elem_type
            filled.append(out.name)
    return filled


def inferred_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every value's type as onnx's (non-strict) shape inference sees it, without the weights' data."""
    try:
        inferred = onnx.shape_inference.infer_shapes(without_weight_data(proto), strict_mode=False)
    except Exception:  # inference is a help here, not a gate
        return {}
    values = list(inferred.graph.value_info) + list(inferred.graph.output)
    return {value.name: value.type for value in values if value.type.tensor_type.HasField("shape")}
