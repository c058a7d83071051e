"""Read an ONNX ModelProto into qdq's graph (`qdq.graph.ir`).

Every node and constant keeps the protobuf it was read from, so saving (`qdq.graph.write`)
writes back what a fix did not change instead of rebuilding it. Subgraphs become `ir.Graph`s
whose nodes read the enclosing graph's tensors by name, as ONNX scoping says; attributes qdq
does not interpret (types, sparse tensors, references to a function's attributes) stay the
AttributeProto they were read as.
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto

from qdq.graph import ir
from qdq.support import progress

# What a node's attribute holds in qdq, per plain attribute kind (tensors are constants, graphs graphs).
PLAIN_ATTRIBUTES = {
    AttributeProto.FLOAT: lambda a: a.f,
    AttributeProto.INT: lambda a: a.i,
    AttributeProto.STRING: lambda a: a.s.decode(),
    AttributeProto.FLOATS: lambda a: list(a.floats),
    AttributeProto.INTS: lambda a: list(a.ints),
    AttributeProto.STRINGS: lambda a: [s.decode() for s in a.strings],
}


def import_graph(proto: onnx.ModelProto) -> ir.Graph:
    """The graph of `proto` in qdq's representation."""
    return _Scope(None).graph(proto.graph, default_opset(proto))


def default_opset(proto: onnx.ModelProto) -> int | None:
    """The version of the default (ai.onnx) domain the model imports, under either of its names."""
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return None


def declared_variable(info: onnx.ValueInfoProto) -> ir.Variable:
    """A tensor as a graph input, output or value_info declares it: element type, shape and kind."""
    kind = info.type.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return ir.Variable(info.name, type=kind or "tensor_type")
    declared = getattr(info.type, kind)
    dtype = ir.element_dtype(declared.elem_type) if declared.elem_type else None
    shape = [dimension(dim) for dim in declared.shape.dim] if declared.HasField("shape") else None
    return ir.Variable(info.name, dtype, shape, kind)


def dimension(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A dimension as qdq holds it: its name, its size, or None when it has neither."""
    if dim.HasField("dim_param"):
        return dim.dim_param
    return dim.dim_value if dim.HasField("dim_value") else None


class _Scope:
    """The tensors one graph defines, by name; names it does not define resolve in the enclosing scope."""

    def __init__(self, outer: _Scope | None):
        self.outer = outer
        self.tensors: dict[str, ir.Tensor] = {}

    def graph(self, proto: onnx.GraphProto, opset: int | None) -> ir.Graph:
        tensors = self.tensors
        for initializer in proto.initializer:
            tensors.setdefault(initializer.name, ir.Constant.stored(initializer))
        for sparse in proto.sparse_initializer:
            tensors.setdefault(sparse.values.name, ir.Constant.stored(sparse))
        for info in proto.value_info:
            self._merge_value_info(info)
        inputs = [self._declared(info) for info in proto.input if info.name not in tensors
                  or not isinstance(tensors[info.name], ir.Constant)]
        outputs = [self._declared(info) for info in proto.output]
        nodes = [self._node(node, opset) for node in progress.each(proto.node, None)]
        return ir.Graph(nodes, inputs, outputs, proto.name, proto.doc_string, opset)

    def _node(self, proto: onnx.NodeProto, opset: int | None) -> ir.Node:
        attrs = {attribute.name: self._attribute(attribute, opset) for attribute in proto.attribute}
        node = ir.Node(proto.op_type, proto.name, attrs, [self._read(name) for name in proto.input],
                       [self._written(name) for name in proto.output],
                       proto.domain if proto.HasField("domain") else None)
        node.proto = proto
        return node

    def _attribute(self, attribute: AttributeProto, opset: int | None) -> object:
        if attribute.ref_attr_name:
            return attribute
        convert = PLAIN_ATTRIBUTES.get(attribute.type)
        if convert is not None:
            return convert(attribute)
        if attribute.type == AttributeProto.TENSOR:
            return ir.Constant.stored(attribute.t)
        if attribute.type == AttributeProto.GRAPH:
            return _Scope(self).graph(attribute.g, opset)
        if attribute.type == AttributeProto.GRAPHS:
            return [_Scope(self).graph(g, opset) for g in attribute.graphs]
        return attribute

    def _read(self, name: str) -> ir.Tensor:
        """The tensor a node reads: defined here, in an enclosing graph, or (not yet defined) a new one here."""
        if not name:
            return ir.Variable.empty()
        scope = self
        while scope is not None:
            found = scope.tensors.get(name)
            if found is not None:
                return found
            scope = scope.outer
        return self._written(name)

    def _written(self, name: str) -> ir.Tensor:
        """A tensor this graph defines; an omitted optional output gets its own nameless one."""
        if not name:
            return ir.Variable.empty()
        tensor = self.tensors.get(name)
        if tensor is None:
            tensor = self.tensors[name] = ir.Variable(name)
        return tensor

    def _declared(self, info: onnx.ValueInfoProto) -> ir.Tensor:
        """A graph input or output: the tensor already known by that name, else one built from `info`."""
        tensor = self.tensors.get(info.name)
        if tensor is None:
            tensor = self.tensors[info.name] = declared_variable(info)
        return tensor

    def _merge_value_info(self, info: onnx.ValueInfoProto) -> None:
        """Record a shape/type annotation, keeping what an earlier one of the same name already said."""
        known = self.tensors.get(info.name)
        annotated = declared_variable(info)
        if known is None:
            self.tensors[info.name] = annotated
        elif isinstance(known, ir.Variable):
            known.dtype = known.dtype or annotated.dtype
            known.shape = known.shape or annotated.shape
