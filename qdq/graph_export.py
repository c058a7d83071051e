"""Write a graphsurgeon graph back as an ONNX model, reusing what did not change since it was read.

`gs.export_onnx` rebuilds every node, declaration and initializer from Python objects: 3-7 s
after a fix of a 100k-node model, where `onnx.save` of it takes 0.4 s. A fix changes a fraction
of the graph, and qdq's importer keeps the protobuf behind each node and constant
(`qdq.graph_import`). So the model is written from the ModelProto it was read from: every field
but the graph's nodes, tensors and declarations as it was (opset imports, metadata, functions,
doc strings, IR version, producer);
a node's NodeProto while the node still says what it said (op, domain, name, inputs, outputs,
attributes); a constant's TensorProto, external-data reference included, while its values were
not replaced; a graph input's, output's or value_info's ValueInfoProto while its type and shape
still agree. What changed is built as `gs.export_onnx` builds it (tests/test_graph_export.py
compares the two over the conformance corpus).

Models the importer hands to `gs.import_onnx` (local functions, sparse initializers, subgraphs,
attribute kinds beyond the plain ones) still go through `gs.export_onnx`.
"""

from __future__ import annotations

import numbers
from functools import cache

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from qdq.graph_import import PLAIN_ATTRIBUTES, ImportedNode, StoredConstant

# The parts of the GraphProto that follow the graphsurgeon graph; the rest is the input's. Quantization
# annotations name tensors a fix may have replaced: dropped, as gs.export_onnx drops them.
_FROM_GRAPH = ("node", "initializer", "input", "output", "value_info", "quantization_annotation")
# How graphsurgeon declares a tensor of each kind (`Variable.type`).
_DECLARE = {
    "tensor_type": helper.make_tensor_value_info,
    "sequence_type": helper.make_tensor_sequence_value_info,
    "sparse_tensor_type": helper.make_sparse_tensor_value_info,
}
_PLAIN_VALUES = (numbers.Real, str, bytes)


class _NotCovered(Exception):
    """The graph holds something only gs.export_onnx writes."""


def export_model(graph: gs.Graph, source: onnx.ModelProto) -> onnx.ModelProto:
    """`graph` as a ModelProto: `source`, the model it was imported from, with the graph brought up to date."""
    if source.functions or source.graph.sparse_initializer:
        return export_with_graphsurgeon(graph, source)
    model = onnx.ModelProto()
    _copy_fields(source, model, skip=("graph",))
    _copy_fields(source.graph, model.graph, skip=_FROM_GRAPH)
    try:
        _write_graph(graph, source.graph, model.graph)
    except _NotCovered:
        return export_with_graphsurgeon(graph, source)
    # As gs.export_onnx does: a domain some node uses is imported, at version 1, if it was not (every
    # model qdq loads imports the default domain, under either of its names).
    imported = {entry.domain for entry in model.opset_import} | {"", "ai.onnx"}
    for domain in sorted({node.domain for node in graph.nodes} - imported - {None}):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def export_with_graphsurgeon(graph: gs.Graph, source: onnx.ModelProto) -> onnx.ModelProto:
    """`gs.export_onnx`, with the IR version, producer and metadata of `source`, which it does not carry."""
    _pack_low_bit_constants(graph)
    proto = gs.export_onnx(graph)
    proto.ir_version = source.ir_version
    proto.producer_name = source.producer_name or proto.producer_name
    del proto.metadata_props[:]
    proto.metadata_props.extend(source.metadata_props)
    return proto


def _write_graph(graph: gs.Graph, source: onnx.GraphProto, out: onnx.GraphProto) -> None:
    # Every tensor by name in graphsurgeon's order (`gs.Graph.tensors`); initializers and value_info follow it.
    tensors: dict[str, gs.Tensor] = {tensor.name: tensor for tensor in graph.inputs}
    nodes = []
    for node in graph.nodes:
        for tensor in node.inputs:
            tensors[tensor.name] = tensor
        for tensor in node.outputs:
            tensors[tensor.name] = tensor
        nodes.append(_node(node))
    for tensor in graph.outputs:
        tensors[tensor.name] = tensor
    tensors.pop("", None)  # omitted optional inputs and outputs
    out.node.extend(nodes)
    declared = {info.name: info for field in (source.value_info, source.output, source.input) for info in field}
    out.input.extend(_declaration(tensor, declared) for tensor in graph.inputs)
    out.output.extend(_declaration(tensor, declared) for tensor in graph.outputs)
    out.initializer.extend(_tensor_proto(t) for t in tensors.values() if isinstance(t, gs.Constant))
    interface = {tensor.name for tensor in (*graph.inputs, *graph.outputs)}
    out.value_info.extend(
        _declaration(tensor, declared) for name, tensor in tensors.items()
        if name not in interface and isinstance(tensor, gs.Variable)
        and (tensor.dtype is not None or tensor.shape is not None)
    )


def _node(node: gs.Node) -> onnx.NodeProto:
    """The NodeProto the node was read from if it still says the same, else a new one."""
    if isinstance(node, ImportedNode) and _says(node.proto, node):
        return node.proto
    built = helper.make_node(node.op, [t.name for t in node.inputs], [t.name for t in node.outputs],
                             name=node.name, domain=node.domain)
    built.attribute.extend(_attribute(name, value) for name, value in node.attrs.items())
    return built


def _says(proto: onnx.NodeProto, node: gs.Node) -> bool:
    return (
        node.op == proto.op_type
        and node.name == proto.name
        and node.domain == (proto.domain if proto.HasField("domain") else None)
        and [t.name for t in node.inputs] == proto.input
        and [t.name for t in node.outputs] == proto.output
        and _same_attributes(node.attrs, proto.attribute)
    )


def _same_attributes(attrs: dict, protos) -> bool:
    if len(attrs) != len(protos):
        return False
    for attribute in protos:
        value = attrs.get(attribute.name)
        if attribute.type == AttributeProto.TENSOR:
            if not isinstance(value, gs.Constant) or _stored(value) != attribute.t:
                return False
        elif PLAIN_ATTRIBUTES[attribute.type](attribute) != value:
            return False
    return True


def _attribute(name: str, value: object) -> onnx.AttributeProto:
    if isinstance(value, gs.Constant):
        return helper.make_attribute(name, _tensor_proto(value))
    if not isinstance(value, _PLAIN_VALUES) and not (
        isinstance(value, list) and all(isinstance(v, _PLAIN_VALUES) for v in value)
    ):
        raise _NotCovered  # a subgraph, an attribute reference, a type: what gs.import_onnx read
    return helper.make_attribute(name, value)


def _tensor_proto(constant: gs.Constant) -> TensorProto:
    """The constant's stored TensorProto while its values are the stored ones, else its values converted.

    numpy_helper packs int4, uint4, int2, float8 and float4 values as ONNX stores them.
    """
    stored = _stored(constant)
    if stored is not None:
        return stored
    return numpy_helper.from_array(np.asarray(constant.values), constant.name)


def _stored(constant: gs.Constant) -> TensorProto | None:
    """The TensorProto holding the constant's values as read (renamed with the constant), if they were not replaced."""
    proto = constant.proto if isinstance(constant, StoredConstant) else None
    if proto is None or proto.name == constant.name:
        return proto
    renamed = TensorProto()
    renamed.CopyFrom(proto)
    renamed.name = constant.name
    return renamed


def _declaration(tensor: gs.Tensor, declared: dict[str, onnx.ValueInfoProto]) -> onnx.ValueInfoProto:
    """The ValueInfoProto the tensor was read with while it says the same type and shape, else a new one."""
    original = declared.get(tensor.name)
    if original is not None and _declares(original, tensor):
        return original
    if tensor.dtype is None:
        return helper.make_empty_tensor_value_info(tensor.name)
    declare = _DECLARE.get("tensor_type" if isinstance(tensor, gs.Constant) else tensor.type)
    if declare is None:
        raise _NotCovered
    return declare(tensor.name, _element_type(tensor.dtype), tensor.shape)


def _declares(info: onnx.ValueInfoProto, tensor: gs.Tensor) -> bool:
    if tensor.dtype is None or not info.type.HasField("tensor_type"):
        return False
    if not isinstance(tensor, gs.Constant) and tensor.type != "tensor_type":
        return False
    declared = info.type.tensor_type
    if declared.elem_type != _element_type(tensor.dtype):
        return False
    shape = tensor.shape
    if shape is None or not declared.HasField("shape"):
        return shape is None and not declared.HasField("shape")
    dims = declared.shape.dim
    return len(dims) == len(shape) and all(_dim(dim) == size for dim, size in zip(dims, shape))


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A dimension as graphsurgeon holds it: its name, its size, or None when it has neither."""
    if dim.HasField("dim_param"):
        return dim.dim_param
    return dim.dim_value if dim.HasField("dim_value") else None


@cache
def _element_type(dtype: object) -> int:
    """The ONNX element type of a graphsurgeon dtype: a numpy dtype, or the ONNX enum for types numpy lacks."""
    return dtype if isinstance(dtype, int) else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _copy_fields(source, target, skip: tuple[str, ...]) -> None:
    """Copy every field set in the protobuf message `source` into `target`, but those named in `skip`."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        current = getattr(target, field.name)
        if hasattr(current, "extend"):  # a repeated field
            current.extend(value)
        elif hasattr(current, "CopyFrom"):  # a message
            current.CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _pack_low_bit_constants(graph: gs.Graph) -> None:
    """Store computed int4/uint4/int2/float8/float4 values in ONNX's packed layout.

    graphsurgeon writes a numpy array's bytes as they are, one byte per 4-bit value, which the
    checker refuses ("Raw data size does not match"); onnx's own conversion packs them.
    """
    for tensor in graph.tensors().values():
        if not isinstance(tensor, gs.Constant) or isinstance(tensor._values, gs.ir.tensor.LazyValues):
            continue
        values = tensor._values
        if isinstance(values, np.ndarray) and values.dtype.kind == "V":
            tensor._values = gs.ir.tensor.LazyValues(numpy_helper.from_array(values, tensor.name))
