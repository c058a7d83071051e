"""Write qdq's graph back as an ONNX model, reusing what did not change since it was read.

Rebuilding every node, declaration and initializer from Python objects (as `gs.export_onnx`
does) took 3-7 s after a fix of a 100k-node model, where `onnx.save` of it takes 0.4 s. A fix
changes a fraction of the graph, and the importer keeps the protobuf behind each node and
constant (`qdq.graph.read`). So the model is written from the ModelProto it was read from:
every field but the graph's nodes, tensors and declarations as it was (opset imports,
metadata, functions, doc strings, IR version, producer); a node's NodeProto while the node
still says what it said (op, domain, name, inputs, outputs, attributes); a constant's
TensorProto, external-data reference included, while its values were not replaced; a graph
input's, output's or value_info's ValueInfoProto while its type and shape still agree.

Fixes change no node inside a subgraph, only what its nodes read from the enclosing graph: a
subgraph is written as it was read, its nodes brought up to date, and the outer tensors it
reads are written by the graph that defines them.
"""

from __future__ import annotations

import numbers
from functools import cache

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from qdq.graph import ir
from qdq.graph.read import PLAIN_ATTRIBUTES, dimension
from qdq.support import progress

# The parts of the GraphProto that follow qdq's graph; the rest is the input's. Quantization
# annotations name tensors a fix may have replaced: dropped.
_FROM_GRAPH = ("node", "initializer", "sparse_initializer", "input", "output", "value_info",
               "quantization_annotation")
# How a tensor of each kind is declared (`Variable.type`).
_DECLARE = {
    "tensor_type": helper.make_tensor_value_info,
    "sparse_tensor_type": helper.make_sparse_tensor_value_info,
}
_PLAIN_VALUES = (numbers.Real, str, bytes)


def export_model(graph: ir.Graph, source: onnx.ModelProto) -> onnx.ModelProto:
    """`graph` as a ModelProto: `source`, the model it was imported from, with the graph brought up to date."""
    model = onnx.ModelProto()
    _copy_fields(source, model, skip=("graph",))
    _copy_fields(source.graph, model.graph, skip=_FROM_GRAPH)
    _write_graph(graph, source.graph, model.graph)
    # A domain some node uses is imported, at version 1, if it was not (every model qdq loads
    # imports the default domain, under either of its names).
    imported = {entry.domain for entry in model.opset_import} | {"", "ai.onnx"}
    for domain in sorted({node.domain for node in graph.nodes} - imported - {None}):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def _write_graph(graph: ir.Graph, source: onnx.GraphProto, out: onnx.GraphProto) -> None:
    # Every tensor by name in the order of `ir.Graph.tensors`, with what subgraphs read from this
    # graph after their node's own inputs; initializers and value_info follow it.
    tensors: dict[str, ir.Tensor] = {tensor.name: tensor for tensor in graph.inputs}
    nodes = []
    for node in progress.each(graph.nodes, None):
        for tensor in node.inputs:
            tensors[tensor.name] = tensor
        for tensor in node.outputs:
            tensors[tensor.name] = tensor
        nodes.append(_node(node, tensors))
    for tensor in graph.outputs:
        tensors[tensor.name] = tensor
    tensors.pop("", None)  # omitted optional inputs and outputs
    out.node.extend(nodes)
    declared = {info.name: info for field in (source.value_info, source.output, source.input) for info in field}
    out.input.extend(_declaration(tensor, declared) for tensor in graph.inputs)
    out.output.extend(_declaration(tensor, declared) for tensor in graph.outputs)
    for tensor in progress.each(tensors.values(), None):
        if isinstance(tensor, ir.Constant):
            stored = _tensor_proto(tensor)
            if isinstance(stored, onnx.SparseTensorProto):
                out.sparse_initializer.append(stored)
            else:
                out.initializer.append(stored)
    interface = {tensor.name for tensor in (*graph.inputs, *graph.outputs)}
    out.value_info.extend(
        _declaration(tensor, declared) for name, tensor in tensors.items()
        if name not in interface and isinstance(tensor, ir.Variable)
        and (tensor.dtype is not None or tensor.shape is not None or tensor.type != "tensor_type")
    )


def _node(node: ir.Node, reads: dict[str, ir.Tensor]) -> onnx.NodeProto:
    """The NodeProto the node was read from if it still says the same, else a new one.

    The outer tensors the node's subgraphs read are added to `reads`.
    """
    subgraphs = node.subgraphs()
    if node.proto is not None and not subgraphs and _says(node.proto, node):
        return node.proto
    built = helper.make_node(node.op, [t.name for t in node.inputs], [t.name for t in node.outputs],
                             name=node.name, domain=node.domain)
    if not subgraphs:
        built.attribute.extend(_attribute(name, value) for name, value in node.attrs.items())
        return built
    sources = {attribute.name: attribute for attribute in node.proto.attribute}
    for name, value in node.attrs.items():
        if isinstance(value, ir.Graph):
            built.attribute.append(helper.make_attribute(name, _subgraph(value, sources[name].g, reads)))
        elif isinstance(value, list) and value and isinstance(value[0], ir.Graph):
            written = [_subgraph(sub, source, reads) for sub, source in zip(value, sources[name].graphs)]
            built.attribute.append(helper.make_attribute(name, written))
        else:
            built.attribute.append(_attribute(name, value))
    return built


def node_proto(node: ir.Node) -> onnx.NodeProto:
    """The node as ONNX writes it, outside any graph (to run it on its own)."""
    return _node(node, {})


def _subgraph(graph: ir.Graph, source: onnx.GraphProto, outer_reads: dict[str, ir.Tensor]) -> onnx.GraphProto:
    """A subgraph as it was read with its nodes brought up to date; what it reads from outside goes to `outer_reads`."""
    out = onnx.GraphProto()
    out.CopyFrom(source)
    del out.node[:]
    local = {info.name for info in source.input} | {t.name for t in source.initializer}
    local |= {t.values.name for t in source.sparse_initializer}
    reads: dict[str, ir.Tensor] = {}
    for node in graph.nodes:
        for tensor in node.inputs:
            reads.setdefault(tensor.name, tensor)
        out.node.append(_node(node, reads))
        local.update(tensor.name for tensor in node.outputs)
    for tensor in graph.outputs:
        reads.setdefault(tensor.name, tensor)
    for name, tensor in reads.items():
        if name and name not in local:
            outer_reads.setdefault(name, tensor)
    return out


def _says(proto: onnx.NodeProto, node: ir.Node) -> bool:
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
        if isinstance(value, AttributeProto):
            if value is not attribute and value != attribute:
                return False
        elif attribute.type == AttributeProto.TENSOR:
            if not isinstance(value, ir.Constant) or _stored(value) != attribute.t:
                return False
        elif PLAIN_ATTRIBUTES[attribute.type](attribute) != value:
            return False
    return True


def _attribute(name: str, value: object) -> onnx.AttributeProto:
    if isinstance(value, ir.Constant):
        return helper.make_attribute(name, _tensor_proto(value))
    if isinstance(value, AttributeProto):  # one qdq does not interpret, as it was read
        copy = AttributeProto()
        copy.CopyFrom(value)
        copy.name = name
        return copy
    if not isinstance(value, _PLAIN_VALUES) and not (
        isinstance(value, list) and all(isinstance(v, _PLAIN_VALUES) for v in value)
    ):
        raise TypeError(f"attribute {name!r} holds a {type(value).__name__}, which qdq cannot write")
    return helper.make_attribute(name, value)


def _tensor_proto(constant: ir.Constant) -> TensorProto | onnx.SparseTensorProto:
    """The constant's stored TensorProto while its values are the stored ones, else its values converted.

    numpy_helper packs int4, uint4, int2, float8 and float4 values as ONNX stores them.
    """
    stored = _stored(constant)
    if stored is not None:
        return stored
    return numpy_helper.from_array(np.asarray(constant.values), constant.name)


def _stored(constant: ir.Constant) -> TensorProto | onnx.SparseTensorProto | None:
    """The protobuf holding the constant's values as read (renamed with the constant), if they were not replaced."""
    proto = constant.proto
    if proto is None:
        return None
    if ir.values_proto(proto).name == constant.name:
        return proto
    renamed = type(proto)()
    renamed.CopyFrom(proto)
    ir.values_proto(renamed).name = constant.name
    return renamed


def _declaration(tensor: ir.Tensor, declared: dict[str, onnx.ValueInfoProto]) -> onnx.ValueInfoProto:
    """The ValueInfoProto the tensor was read with while it says the same type and shape, else a new one.

    Sequences, maps and optionals keep their declaration: qdq reads no more of them than the kind.
    """
    kind = "tensor_type" if isinstance(tensor, ir.Constant) else tensor.type
    original = declared.get(tensor.name)
    if original is not None and (kind not in _DECLARE or _declares(original, tensor)):
        return original
    if tensor.dtype is None or kind not in _DECLARE:
        return helper.make_empty_tensor_value_info(tensor.name)
    return _DECLARE[kind](tensor.name, _element_type(tensor.dtype), tensor.shape)


def _declares(info: onnx.ValueInfoProto, tensor: ir.Tensor) -> bool:
    if tensor.dtype is None or not info.type.HasField("tensor_type"):
        return False
    if not isinstance(tensor, ir.Constant) and tensor.type != "tensor_type":
        return False
    declared = info.type.tensor_type
    if declared.elem_type != _element_type(tensor.dtype):
        return False
    shape = tensor.shape
    if shape is None or not declared.HasField("shape"):
        return shape is None and not declared.HasField("shape")
    dims = declared.shape.dim
    return len(dims) == len(shape) and all(dimension(dim) == size for dim, size in zip(dims, shape))


@cache
def _element_type(dtype: object) -> int:
    """The ONNX element type of a tensor's dtype: a numpy dtype, or the ONNX enum for types numpy lacks."""
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
