"""qdq's graph in memory: nodes and tensors linked both ways.

A node lists the tensors it reads (`inputs`) and writes (`outputs`); a tensor lists the nodes
that write it (`inputs`) and read it (`outputs`), the vocabulary onnx-graphsurgeon uses. Changing
one side of an edge changes the other (`Edges`), so no edit leaves an edge half linked. Nodes
and tensors are equal only to themselves.

What was read from a file keeps its protobuf: a node its NodeProto, a constant its TensorProto
(external data and all) until its values are replaced. Saving writes those back where nothing
changed (`qdq.graph.write`). A subgraph (If, Loop, Scan) is a `Graph` in its node's attributes
whose nodes read the outer graph's tensors directly; an attribute qdq does not interpret stays
the AttributeProto it was read as.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Element types numpy's own dtypes cannot hold: a tensor of one says its type as the ONNX enum.
_ENUM_ONLY_TYPES = frozenset({
    TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
    TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
})
_DTYPES: dict[int, object] = {}


def element_dtype(onnx_type: int) -> object:
    """The dtype qdq holds for an ONNX element type: numpy's, or the ONNX enum for types without one."""
    known = _DTYPES.get(onnx_type)
    if known is None:
        if onnx_type in _ENUM_ONLY_TYPES or onnx_type not in helper.get_all_tensor_dtypes():
            known = onnx_type
        else:
            known = helper.tensor_dtype_to_np_dtype(onnx_type)
        _DTYPES[onnx_type] = known
    return known


class Edges(list):
    """One end of a set of edges, e.g. a node's inputs: changing it changes each element's `mirror` list.

    Removal finds elements by identity on both sides.
    """

    __slots__ = ("owner", "mirror")

    def __init__(self, owner: object, mirror: str):  # a new list is empty: no list.__init__ needed
        self.owner = owner
        self.mirror = mirror

    def _link(self, item) -> None:
        list.append(getattr(item, self.mirror), self.owner)

    def _unlink(self, item) -> None:
        other = getattr(item, self.mirror)
        owner = self.owner
        for position, element in enumerate(other):
            if element is owner:
                list.__delitem__(other, position)
                return

    def append(self, item) -> None:
        list.append(self, item)
        self._link(item)

    def extend(self, items: Iterable) -> None:
        items = list(items)
        list.extend(self, items)
        owner, mirror = self.owner, self.mirror
        for item in items:
            list.append(getattr(item, mirror), owner)

    def __iadd__(self, items: Iterable) -> Edges:
        self.extend(items)
        return self

    def insert(self, position: int, item) -> None:
        list.insert(self, position, item)
        self._link(item)

    def remove(self, item) -> None:
        for position, element in enumerate(self):
            if element is item:
                del self[position]
                return
        raise ValueError(f"{item!r} is not in the list")

    def pop(self, position: int = -1):
        item = list.pop(self, position)
        self._unlink(item)
        return item

    def clear(self) -> None:
        for item in self:
            self._unlink(item)
        list.clear(self)

    def __setitem__(self, position, item) -> None:
        if isinstance(position, slice):
            old, new = self[position], list(item)
            for element in old:
                self._unlink(element)
            list.__setitem__(self, position, new)
            for element in new:
                self._link(element)
            return
        self._unlink(self[position])
        list.__setitem__(self, position, item)
        self._link(item)

    def __delitem__(self, position) -> None:
        for element in self[position] if isinstance(position, slice) else [self[position]]:
            self._unlink(element)
        list.__delitem__(self, position)


class Tensor:
    """A value of the graph: `inputs` are the nodes that write it (at most one), `outputs` those that read it."""

    __slots__ = ("name", "inputs", "outputs")

    def __init__(self, name: str):
        self.name = name
        self.inputs = Edges(self, "outputs")
        self.outputs = Edges(self, "inputs")

    def __repr__(self) -> str:
        return f"{type(self).__name__} ({self.name}): (shape={self.shape}, dtype={self.dtype})"


class Variable(Tensor):
    """A tensor computed when the model runs: a graph input or some node's output."""

    __slots__ = ("dtype", "shape", "type")

    def __init__(self, name: str, dtype: object = None, shape: list | None = None, type: str = "tensor_type"):
        super().__init__(name)
        self.dtype = dtype
        self.shape = shape
        self.type = type  # the kind of value (tensor_type, sequence_type, ...), as the declaration says

    @staticmethod
    def empty() -> Variable:
        """The nameless tensor of an omitted optional input or output."""
        return Variable("")


class Constant(Tensor):
    """A tensor whose values are known: read from a TensorProto (`proto`) or computed by qdq.

    The values of a read constant are decoded on first use; assigning new values forgets the
    proto, so the saved model holds them. A SparseTensorProto reads as its dense values.
    """

    __slots__ = ("_values", "proto", "data_location")

    def __init__(self, name: str, values: np.ndarray, data_location: int | None = None):
        super().__init__(name)
        self._values = values
        self.proto: TensorProto | onnx.SparseTensorProto | None = None
        self.data_location = data_location

    @classmethod
    def stored(cls, proto: TensorProto | onnx.SparseTensorProto) -> Constant:
        """The constant a TensorProto (or SparseTensorProto) holds, its values not read yet."""
        dense = values_proto(proto)
        constant = cls(dense.name, None, int(dense.data_location) if dense.HasField("data_location") else None)
        constant.proto = proto
        return constant

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = decode(self.proto)
        return self._values

    @values.setter
    def values(self, values: np.ndarray) -> None:
        self._values = values
        self.proto = None

    @property
    def dtype(self) -> object:
        if self.proto is None:
            return self._values.dtype
        return element_dtype(values_proto(self.proto).data_type)

    @property
    def shape(self):
        if self.proto is None:
            return self._values.shape
        return self.proto.dims


def values_proto(proto: TensorProto | onnx.SparseTensorProto) -> TensorProto:
    """The TensorProto with the element type, name and values: the proto itself, or a sparse one's values."""
    return proto.values if isinstance(proto, onnx.SparseTensorProto) else proto


def decode(proto: TensorProto | onnx.SparseTensorProto) -> np.ndarray:
    """The values a TensorProto or SparseTensorProto holds, in a new array (external data read from the cwd)."""
    if not isinstance(proto, onnx.SparseTensorProto):
        return np.array(numpy_helper.to_array(proto))
    values = numpy_helper.to_array(proto.values)
    indices = numpy_helper.to_array(proto.indices)
    dense = np.zeros(tuple(proto.dims), dtype=values.dtype)
    if indices.ndim == 1:  # positions in the flattened tensor
        dense.reshape(-1)[indices] = values
    else:  # one row of coordinates per value
        dense[tuple(indices.T)] = values
    return dense


class Node:
    """An operation: reads `inputs`, writes `outputs`; `proto` is the NodeProto it was read from, if any."""

    __slots__ = ("op", "name", "attrs", "inputs", "outputs", "domain", "proto")

    def __init__(self, op: str, name: str | None = None, attrs: dict | None = None,
                 inputs: Iterable[Tensor] = (), outputs: Iterable[Tensor] = (), domain: str | None = None):
        self.op = op
        self.name = name or ""
        self.attrs = {} if attrs is None else attrs
        self.inputs = Edges(self, "outputs")
        self.outputs = Edges(self, "inputs")
        self.domain = domain
        self.proto: onnx.NodeProto | None = None
        self.inputs.extend(inputs)
        self.outputs.extend(outputs)

    def subgraphs(self) -> list[Graph]:
        """The graphs in this node's attributes (an If's branches, a Loop's body)."""
        found = []
        for value in self.attrs.values():
            if isinstance(value, Graph):
                found.append(value)
            elif isinstance(value, list):
                found.extend(v for v in value if isinstance(v, Graph))
        return found

    def __repr__(self) -> str:
        return (f"{self.name} ({self.op})\n\tInputs: {[t.name for t in self.inputs]}"
                f"\n\tOutputs: {[t.name for t in self.outputs]}" + (f"\nAttributes: {self.attrs}" if self.attrs else ""))


class Graph:
    """Nodes in order, the graph's inputs and outputs, and what the ModelProto says of the graph."""

    def __init__(self, nodes: list[Node] | None = None, inputs: list[Tensor] | None = None,
                 outputs: list[Tensor] | None = None, name: str = "", doc_string: str = "", opset: int | None = None):
        self.nodes = nodes or []
        self.inputs = inputs or []
        self.outputs = outputs or []
        self.name = name
        self.doc_string = doc_string
        self.opset = opset

    def tensors(self) -> dict[str, Tensor]:
        """Every named tensor by name: the inputs, then those of each node in order, then the outputs."""
        found: dict[str, Tensor] = {}
        for tensor in self.inputs:
            found[tensor.name] = tensor
        for node in self.nodes:
            for tensor in node.inputs:
                found[tensor.name] = tensor
            for tensor in node.outputs:
                found[tensor.name] = tensor
        for tensor in self.outputs:
            found[tensor.name] = tensor
        found.pop("", None)
        return found

    def copy(self, outer: dict[int, Tensor] | None = None) -> Graph:
        """A copy with its own nodes and tensors; constants' values and protos are shared, not copied.

        `outer` maps the ids of an enclosing graph's tensors to their copies (for subgraphs).
        """
        copies: dict[int, Tensor] = {} if outer is None else outer

        def copy_of(tensor: Tensor) -> Tensor:
            found = copies.get(id(tensor))
            if found is None:
                if isinstance(tensor, Constant):
                    found = Constant(tensor.name, tensor._values, tensor.data_location)
                    found.proto = tensor.proto
                else:
                    found = Variable(tensor.name, tensor.dtype, tensor.shape, tensor.type)
                copies[id(tensor)] = found
            return found

        nodes = []
        for node in self.nodes:
            attrs = {}
            for key, value in node.attrs.items():
                if isinstance(value, Graph):
                    value = value.copy(copies)
                elif isinstance(value, list) and any(isinstance(v, Graph) for v in value):
                    value = [v.copy(copies) for v in value]
                attrs[key] = value
            copied = Node(node.op, node.name, attrs, [copy_of(t) for t in node.inputs],
                          [copy_of(t) for t in node.outputs], node.domain)
            copied.proto = node.proto
            nodes.append(copied)
        return Graph(nodes, [copy_of(t) for t in self.inputs], [copy_of(t) for t in self.outputs],
                     self.name, self.doc_string, self.opset)
