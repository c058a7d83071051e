"""Import an ONNX model into onnx-graphsurgeon objects, fast.

`gs.import_onnx` builds every node and tensor through constructors that validate, log and
keep both ends of each edge in sync one element at a time. On a 100k-node QDQ model that took
about 6 s, more than qdq's whole lint budget. This importer builds the same objects (gs.Node,
gs.Variable, gs.Constant with lazily loaded values, linked the same way) directly. Its nodes and
constants remember the protobuf they were read from (`ImportedNode`, `StoredConstant`), so
saving (`qdq.graph_export`) can write back what a fix did not change instead of rebuilding it.

Models with what it does not cover (subgraphs of If/Loop/Scan, local functions, sparse
initializers, attribute references, unusual attribute types) go through `gs.import_onnx`.
"""

from __future__ import annotations

from collections import OrderedDict

import onnx
import onnx_graphsurgeon as gs
from onnx import AttributeProto
from onnx_graphsurgeon.importers.onnx_importer import OnnxImporter, get_itemsize, get_onnx_tensor_dtype
from onnx_graphsurgeon.util.misc import SynchronizedList

_new = object.__new__
# What a node's attribute holds in graphsurgeon, per attribute kind (tensors are StoredConstants).
PLAIN_ATTRIBUTES = {
    AttributeProto.FLOAT: lambda a: a.f,
    AttributeProto.INT: lambda a: a.i,
    AttributeProto.STRING: lambda a: a.s.decode(),
    AttributeProto.FLOATS: lambda a: list(a.floats),
    AttributeProto.INTS: lambda a: list(a.ints),
    AttributeProto.STRINGS: lambda a: [s.decode() for s in a.strings],
}


class ImportedNode(gs.Node):
    """A graphsurgeon node with the NodeProto it was read from (`proto`), left as read whatever a fix does."""

    proto: onnx.NodeProto


class StoredConstant(gs.Constant):
    """A constant whose values are those of a TensorProto, `proto`, until something replaces them.

    Reading the values does not change `proto`; setting them (`constant.values = ...`) forgets
    it, so a saved model holds the new values.
    """

    proto: onnx.TensorProto | None

    def __init__(self, proto: onnx.TensorProto):
        super().__init__(proto.name, gs.ir.tensor.LazyValues(proto), data_location=_data_location(proto))
        self.proto = proto

    @gs.Constant.values.setter
    def values(self, values) -> None:
        self.proto = None
        gs.Constant.values.fset(self, values)


class _NotCovered(Exception):
    """The model uses something only gs.import_onnx handles."""


def import_graph(proto: onnx.ModelProto) -> gs.Graph:
    """The graphsurgeon graph of `proto`, as `gs.import_onnx` would build it."""
    if proto.functions or proto.graph.sparse_initializer:
        return gs.import_onnx(proto)
    try:
        return _Importer(proto).graph()
    except _NotCovered:
        return gs.import_onnx(proto)


class _Importer:
    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto
        self.tensors: dict[str, gs.Tensor] = {}
        self.lazy_types: dict[int, tuple[object, int]] = {}

    def graph(self) -> gs.Graph:
        graph, tensors = self.proto.graph, self.tensors
        for initializer in graph.initializer:
            if initializer.name not in tensors:
                tensors[initializer.name] = self._constant(initializer)
        for info in graph.value_info:
            self._merge_value_info(info)
        initializers = {t.name for t in graph.initializer}
        inputs = [self._declared(info) for info in graph.input if info.name not in initializers]
        outputs = [self._declared(info) for info in graph.output]
        nodes = [self._node(node) for node in graph.node]
        # The fields gs.Graph.__init__ sets, without its scan for subgraph functions (there are none).
        result = _new(gs.Graph)
        result.__dict__.update(
            nodes=nodes,
            inputs=inputs,
            outputs=outputs,
            name=graph.name,
            __name__=graph.name,
            doc_string=graph.doc_string,
            opset=OnnxImporter.get_opset(self.proto) or gs.Graph.DEFAULT_OPSET,
            producer_name=self.proto.producer_name,
            producer_version=self.proto.producer_version,
            import_domains=self.proto.opset_import,
            ir_version=self.proto.ir_version,
            name_idx=0,
            _functions=[],
        )
        return result

    def _node(self, proto: onnx.NodeProto) -> gs.Node:
        node = _new(ImportedNode)
        fields = node.__dict__
        fields["proto"] = proto
        fields["op"] = proto.op_type
        fields["name"] = proto.name
        fields["attrs"] = self._attributes(proto) if proto.attribute else OrderedDict()
        fields["inputs"] = inputs = _synced(node, "outputs")
        fields["outputs"] = outputs = _synced(node, "inputs")
        fields["domain"] = proto.domain if proto.HasField("domain") else None
        for name in proto.input:
            tensor = self._tensor(name)
            list.append(inputs, tensor)
            list.append(tensor.outputs, node)
        for name in proto.output:
            tensor = self._tensor(name)
            list.append(outputs, tensor)
            list.append(tensor.inputs, node)
        return node

    def _attributes(self, proto: onnx.NodeProto) -> OrderedDict:
        attrs = OrderedDict()
        for attribute in proto.attribute:
            if attribute.ref_attr_name:
                raise _NotCovered
            if attribute.type == AttributeProto.TENSOR:
                attrs[attribute.name] = self._constant(attribute.t)
                continue
            convert = PLAIN_ATTRIBUTES.get(attribute.type)
            if convert is None:
                raise _NotCovered
            attrs[attribute.name] = convert(attribute)
        return attrs

    def _tensor(self, name: str) -> gs.Tensor:
        """The tensor called `name`; a node's omitted optional input or output gets its own empty one."""
        tensor = self.tensors.get(name)
        if tensor is None:
            tensor = _variable(name)
            if name:
                self.tensors[name] = tensor
        return tensor

    def _declared(self, info: onnx.ValueInfoProto) -> gs.Tensor:
        """A graph input or output: the tensor already known by that name, else one built from `info`."""
        tensor = self.tensors.get(info.name)
        if tensor is None:
            tensor = self.tensors[info.name] = OnnxImporter.import_tensor(info)
        return tensor

    def _merge_value_info(self, info: onnx.ValueInfoProto) -> None:
        """Record a shape/type annotation, keeping what an earlier one of the same name already said."""
        known = self.tensors.get(info.name)
        annotated = OnnxImporter.import_tensor(info)
        if known is None:
            self.tensors[info.name] = annotated
        elif isinstance(known, gs.Variable):
            known.dtype = known.dtype or annotated.dtype
            known.shape = known.shape or annotated.shape

    def _constant(self, proto: onnx.TensorProto) -> StoredConstant:
        """What `StoredConstant(proto)` builds, with the element type's facts looked up once."""
        lazy = _new(gs.ir.tensor.LazyValues)
        dtype, itemsize = self._lazy_type(proto.data_type)
        count = 1
        for dim in proto.dims:
            count *= dim
        lazy.__dict__.update(tensor=proto, shape=proto.dims, dtype=dtype, nbytes=count * itemsize)
        constant = _new(StoredConstant)
        constant.__dict__.update(
            name=proto.name,
            inputs=_synced(constant, "outputs"),
            outputs=_synced(constant, "inputs"),
            _values=lazy,
            data_location=_data_location(proto),
            _export_dtype=None,
            proto=proto,
        )
        return constant

    def _lazy_type(self, data_type: int) -> tuple[object, int]:
        """What gs.LazyValues records for an element type (looked up once per type: it is slow)."""
        known = self.lazy_types.get(data_type)
        if known is None:
            probe = onnx.TensorProto(data_type=data_type)
            dtype = get_onnx_tensor_dtype(probe)
            known = self.lazy_types[data_type] = (dtype, get_itemsize(dtype))
        return known


def _data_location(proto: onnx.TensorProto) -> int | None:
    return int(proto.data_location) if proto.HasField("data_location") else None


def _synced(owner: object, field: str) -> SynchronizedList:
    """An empty gs edge list of `owner`, without SynchronizedList.__init__ (half the import time)."""
    edges = list.__new__(SynchronizedList)
    edges.parent_obj = owner
    edges.field_name = field
    return edges


def _variable(name: str) -> gs.Variable:
    variable = _new(gs.Variable)
    variable.__dict__.update(
        name=name,
        inputs=_synced(variable, "outputs"),
        outputs=_synced(variable, "inputs"),
        dtype=None,
        shape=None,
        type="tensor_type",
    )
    return variable
