"""The quantization view of a graph: which tensors are quantized, how, and which op reads what.

Rules never walk Q/DQ chains themselves; they ask this index. It resolves exporter noise
(Identity and no-op Cast between a constant and a Q/DQ, a no-op Cast between Q and DQ) so that
"which scale does this Conv read, which does it write" has one answer everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Iterable

import numpy as np
from onnx import TensorProto, helper

from qdq.graph import ir
from qdq.graph.model import Model
from qdq.graph.ops import DEQUANTIZE, QDQ_DOMAINS, QDQ_OPS, QUANTIZE  # noqa: F401 - re-exported for the rules
from qdq.quant.dtypes import QuantType, quant_type
from qdq.quant.param_table import ParamTable
from qdq.support import progress

# Ops that pass a tensor through unchanged when they do not change its type.
PASS_THROUGH_OPS = ("Identity", "Cast")


class cached_property:  # noqa: N801 - used like functools.cached_property
    """functools.cached_property without its per-access lock (Python 3.11), which cost seconds on 100k Q/DQs.

    After the first access the value sits in the instance dict, which Python looks up first.
    """

    def __init__(self, compute):
        self.compute = compute
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


PER_TENSOR = "per-tensor"
PER_AXIS = "per-axis"
BLOCKED = "blocked"


@dataclass
class ConstantSource:
    """A constant that a Q/DQ parameter resolves to, and the pass-through nodes on the way."""

    constant: ir.Constant
    via: list[ir.Node] = field(default_factory=list)

    @cached_property
    def cast_to(self) -> int | None:
        """The element type the last Cast on the way converts to, if any."""
        casts = self.casts
        return casts[-1] if casts else None

    @cached_property
    def casts(self) -> list[int]:
        """The element types of every Cast on the way, in data-flow order (constant first)."""
        # `via` runs from the Q/DQ back towards the constant.
        return [int(n.attrs.get("to")) for n in reversed(self.via) if n.op == "Cast"]

    @cached_property
    def elem_type(self) -> int:
        """The element type the Q/DQ reads: the last Cast's target, else the constant's own type."""
        return (self.via and self.cast_to) or onnx_type_of(self.constant)  # no Cast to look for without `via`

    @property
    def origin(self) -> ir.Constant | ir.Node:
        """What identifies the stored value: the initializer, or the Constant node that holds it."""
        if self.via and self.via[-1].op == "Constant":
            return self.via[-1]
        return self.constant


@dataclass
class QParams:
    """The quantization parameters one Q or DQ node uses, with their constants resolved."""

    node: ir.Node
    scale_input: ir.Tensor
    zero_point_input: ir.Tensor | None
    scale_source: ConstantSource | None
    zero_point_source: ConstantSource | None
    axis: int
    block_size: int
    elem_type: int
    model: Model = field(repr=False)
    # The index's columns, where the values of this node's parameters may already be decoded.
    columns: ParamTable | None = field(default=None, repr=False)

    @property
    def is_quantize(self) -> bool:
        return self.node.op == QUANTIZE

    @property
    def qtype(self) -> QuantType | None:
        return quant_type(self.elem_type)

    @cached_property
    def dynamic(self) -> bool:
        """True when scale or zero-point is computed at run time instead of being a constant."""
        return self.scale_source is None or (self.zero_point_input is not None and self.zero_point_source is None)

    @property
    def data_rank(self) -> int | None:
        """The rank of the tensor this node quantizes (or dequantizes), when it is known."""
        data = self.node.inputs[0] if self.node.inputs else None
        shape = data.shape if data is not None else None
        return len(shape) if shape is not None else None

    @cached_property
    def scale_shape(self) -> tuple[int, ...] | None:
        if self.scale_source is not None:
            return tuple(self.scale_source.constant.shape)
        shape = self.scale_input.shape
        return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None

    @property
    def zero_point_shape(self) -> tuple[int, ...] | None:
        if self.zero_point_source is None:
            return None
        return tuple(self.zero_point_source.constant.shape)

    @cached_property
    def granularity(self) -> str:
        if self.block_size:
            return BLOCKED
        shape = self.scale_shape
        if shape is None or math.prod(shape) <= 1:
            return PER_TENSOR
        return PER_AXIS

    @cached_property
    def scale(self) -> np.ndarray | None:
        """Scale values as float64 (None when computed at run time)."""
        if self.scale_source is None:
            return None
        decoded = self.columns.values_of(self, "scale") if self.columns is not None else None
        return decoded if decoded is not None else source_values(self.model, self.scale_source).astype(np.float64)

    @cached_property
    def zero_point(self) -> np.ndarray | None:
        """Zero-point values as float64 (zeros when the node has no zero-point input)."""
        if self.zero_point_input is None:
            shape = self.scale_shape or ()
            return np.zeros(shape, dtype=np.float64)
        if self.zero_point_source is None:
            return None
        decoded = self.columns.values_of(self, "zero_point") if self.columns is not None else None
        return decoded if decoded is not None else source_values(self.model, self.zero_point_source).astype(np.float64)

    def same_values(self, other: QParams, equal_nan: bool = False) -> bool:
        """Same scale, zero-point, axis and type: quantizing with one and dequantizing with the other is exact.

        `equal_nan` counts NaN as equal to NaN, for checks that leave invalid values to QDQ001.
        """
        if self.dynamic or other.dynamic:
            return self.scale_input is other.scale_input and self.zero_point_input is other.zero_point_input
        if self.elem_type != other.elem_type or self.block_size != other.block_size:
            return False
        if self.granularity != PER_TENSOR:
            rank = self.data_rank if self.data_rank is not None else other.data_rank
            if _normalized_axis(self.axis, rank) != _normalized_axis(other.axis, rank):
                return False
        return _flat_equal(self.scale, other.scale, equal_nan) and _flat_equal(self.zero_point, other.zero_point, equal_nan)

    def shares_initializers(self, other: QParams) -> bool:
        """True when both nodes read the very same scale and zero-point constants."""
        same_scale = _origin_of(self.scale_source) is _origin_of(other.scale_source) is not None
        same_zp = (self.zero_point_input is None and other.zero_point_input is None) or (
            _origin_of(self.zero_point_source) is _origin_of(other.zero_point_source) is not None
        )
        return same_scale and same_zp

    def describe(self) -> dict:
        """A JSON-friendly summary for findings and reports."""
        out: dict = {
            "dtype": self.qtype.name if self.qtype else str(self.elem_type),
            "granularity": self.granularity,
        }
        if self.granularity != PER_TENSOR:
            out["axis"] = self.axis
        if self.block_size:
            out["block_size"] = self.block_size
        if self.scale is not None:
            out["scale"] = _summarise(self.scale)
        if self.zero_point is not None:
            out["zero_point"] = _summarise(self.zero_point)
        return out


@dataclass
class QTensor:
    """One quantized value: the integer tensor, the Q that makes it (if any) and the DQs that read it."""

    integer: ir.Tensor
    quantize: ir.Node | None
    dequantizes: list[ir.Node]
    float_input: ir.Tensor | None

    @property
    def nodes(self) -> list[ir.Node]:
        """The Q (if any) and every DQ: the nodes that must agree on this value's parameters."""
        return ([self.quantize] if self.quantize is not None else []) + self.dequantizes

    @property
    def stored(self) -> bool:
        """True when the integer values are stored in the model (a quantized weight or bias)."""
        return self.quantize is None and resolve_constant(self.integer) is not None

    @property
    def from_constant(self) -> bool:
        """Stored integers, or a Q of a float constant, also behind integer Clips (Brevitas's weights):
        a parameter, not an activation (checked without walking the graph, which for an activation
        would go back to the model's inputs)."""
        if self.quantize is None:  # stored, or behind Clips of stored integers or of a Q of a constant
            _, source = clipped_integers(self.integer)
            if resolve_constant(source) is not None:
                return True
            producer = source.inputs[0] if source is not self.integer and len(source.inputs) == 1 else None
            return producer is not None and producer.op == QUANTIZE and _quantizes_constant(producer)
        return _quantizes_constant(self.quantize)


@dataclass
class NodeQuant:
    """A compute op seen through its Q/DQ: the params each input was dequantized with, and each output's Qs."""

    node: ir.Node
    inputs: list[QParams | None]
    outputs: list[list[QParams]]

    @property
    def quantized_inputs(self) -> list[QParams]:
        return [p for p in self.inputs if p is not None]


class QuantIndex:
    """All Q/DQ nodes of a graph and the maps rules need, built once per lint or fix round."""

    def __init__(self, model: Model):
        self.model = model
        self.graph = model.graph
        self.quantizes: list[ir.Node] = []
        self.dequantizes: list[ir.Node] = []
        self._params: dict[int, QParams] = {}
        for node in progress.each(self.graph.nodes, None):
            if node.op in QDQ_OPS and node.domain in QDQ_DOMAINS:
                (self.quantizes if node.op == QUANTIZE else self.dequantizes).append(node)
                self._params[id(node)] = self._read_params(node)
        self.table = ParamTable(list(self._params.values()))
        self.graph_outputs = {id(t) for t in self.graph.outputs}
        self.graph_inputs = {id(t) for t in self.graph.inputs}
        # Facts derived from the graph's structure (which the index outlives only while fixes
        # swap constants): computed once per index by whoever needs them, e.g. operands.role.
        self.memo: dict = {}

    @property
    def has_qdq(self) -> bool:
        return bool(self._params)

    def params(self, node: ir.Node) -> QParams:
        """The QParams of a Q or DQ node."""
        return self._params[id(node)]

    def all_params(self) -> Iterable[QParams]:
        return self._params.values()

    # --- walking through exporter pass-throughs -------------------------------------------

    def is_noop_cast(self, node: ir.Node) -> bool:
        """A Cast to the type its input already has (exporters put these between Q and DQ)."""
        if node.op != "Cast" or not node.inputs:
            return False
        return _elem_type_of(self, node.inputs[0]) == node.attrs.get("to")

    def is_pass_through(self, node: ir.Node) -> bool:
        return node.op == "Identity" or self.is_noop_cast(node)

    def dequantize_feeding(self, tensor: ir.Tensor) -> ir.Node | None:
        """The DQ whose output reaches this tensor, looking back through pass-through nodes."""
        while len(tensor.inputs) == 1:
            producer = tensor.inputs[0]
            if self._is_indexed(producer, DEQUANTIZE):
                return producer
            if not self.is_pass_through(producer) or not producer.inputs:
                return None
            tensor = producer.inputs[0]
        return None

    def consumers_through(self, tensor: ir.Tensor) -> list[tuple[ir.Node, list[ir.Node]]]:
        """Each real consumer of a tensor with the pass-through nodes passed on the way."""
        found: list[tuple[ir.Node, list[ir.Node]]] = []
        stack: list[tuple[ir.Tensor, list[ir.Node]]] = [(tensor, [])]
        while stack:
            current, via = stack.pop()
            for consumer in current.outputs:
                if self.is_pass_through(consumer) and consumer.outputs:
                    stack.append((consumer.outputs[0], via + [consumer]))
                else:
                    found.append((consumer, via))
        return found

    def quantizes_of(self, tensor: ir.Tensor) -> list[ir.Node]:
        """The Q nodes that quantize this float tensor."""
        return [n for n in tensor.outputs if self._is_indexed(n, QUANTIZE) and n.inputs and n.inputs[0] is tensor]

    def qtensor_of(self, node: ir.Node) -> QTensor | None:
        """The quantized value a Q or DQ node belongs to."""
        return self._qtensor_by_node.get(id(node))

    def refresh(self, node: ir.Node) -> None:
        """Re-read one Q/DQ node's parameters after a fix swapped its scale or zero-point constant."""
        params = self._params[id(node)] = self._read_params(node)
        self.table.replace(params)

    def _is_indexed(self, node: ir.Node, op: str) -> bool:
        return node.op == op and id(node) in self._params

    def is_graph_output(self, tensor: ir.Tensor) -> bool:
        return id(tensor) in self.graph_outputs

    def is_interface(self, tensor: ir.Tensor) -> bool:
        """A graph input or output: integers there are exchanged with the caller, on the grid they have."""
        return id(tensor) in self.graph_outputs or id(tensor) in self.graph_inputs

    # --- whole-graph views -------------------------------------------------------------------

    @cached_property
    def qtensors(self) -> list[QTensor]:
        """Every quantized value: Q outputs and integer tensors read by a DQ."""
        result: list[QTensor] = []
        seen: set[int] = set()
        for q in self.quantizes:
            if not q.outputs:
                continue
            out = q.outputs[0]
            seen.add(id(out))
            dqs = [c for c, _ in self.consumers_through(out) if self._is_indexed(c, DEQUANTIZE)]
            result.append(QTensor(out, q, dqs, q.inputs[0] if q.inputs else None))
        for dq in self.dequantizes:
            source = dq.inputs[0] if dq.inputs else None
            if source is None or id(source) in seen:
                continue
            origin = self._integer_origin(source)
            if origin is not None and id(origin) in seen:
                continue
            seen.add(id(source))
            dqs = [c for c in source.outputs if self._is_indexed(c, DEQUANTIZE)]
            result.append(QTensor(source, None, dqs, None))
        return result

    @cached_property
    def _qtensor_by_node(self) -> dict[int, QTensor]:
        found: dict[int, QTensor] = {}
        for qt in self.qtensors:
            for node in qt.nodes:
                found[id(node)] = qt
        return found

    def node_quant(self, node: ir.Node) -> NodeQuant:
        """Which params each input of a compute op was dequantized with, and which Qs read each output."""
        inputs: list[QParams | None] = []
        for tensor in node.inputs:
            dq = self.dequantize_feeding(tensor) if tensor is not None else None
            inputs.append(self.params(dq) if dq is not None else None)
        outputs: list[list[QParams]] = []
        for tensor in node.outputs:
            qs = [c for c, _ in self.consumers_through(tensor) if self._is_indexed(c, QUANTIZE)]
            outputs.append([self.params(q) for q in qs])
        return NodeQuant(node, inputs, outputs)

    def nodes_of(self, ops: Iterable[str]) -> list[ir.Node]:
        """The graph's nodes whose op is one of `ops`, in graph order: what a check about those ops walks.

        The graph is grouped by op once per index, not walked by every rule. The fix driver builds
        a new index after any fix that adds or drops nodes, so a check never sees stale groups.
        """
        by_op = self.memo.get("nodes_by_op")
        if by_op is None:
            by_op = self.memo["nodes_by_op"] = {}
            for position, node in enumerate(self.graph.nodes):
                by_op.setdefault(node.op, []).append((position, node))
        groups = [by_op[op] for op in set(ops) if op in by_op]
        if len(groups) == 1:
            return [node for _, node in groups[0]]
        return [node for _, node in sorted(chain.from_iterable(groups), key=itemgetter(0))]

    def compute_nodes(self) -> list[ir.Node]:
        """Every node that is neither a Q/DQ nor an exporter pass-through or Constant."""
        return [
            n
            for n in self.graph.nodes
            if n.op not in QDQ_OPS and n.op != "Constant" and not self.is_pass_through(n)
        ]

    # --- construction --------------------------------------------------------------------------

    def _read_params(self, node: ir.Node) -> QParams:
        # Called for every Q/DQ (75k at 100k nodes): nodes without attributes skip their lookups.
        inputs, attrs = node.inputs, node.attrs
        scale_input = inputs[1] if len(inputs) > 1 else None
        zero_point_input = inputs[2] if len(inputs) > 2 else None
        if zero_point_input is not None and _is_empty_input(zero_point_input):
            zero_point_input = None
        scale_source = resolve_constant(scale_input) if scale_input is not None else None
        zp_source = resolve_constant(zero_point_input) if zero_point_input is not None else None
        return QParams(
            node=node,
            scale_input=scale_input,
            zero_point_input=zero_point_input,
            scale_source=scale_source,
            zero_point_source=zp_source,
            axis=int(attrs.get("axis", 1)) if attrs else 1,
            block_size=int(attrs.get("block_size", 0) or 0) if attrs else 0,
            elem_type=self._quantized_type(node, zero_point_input, zp_source),
            model=self.model,
        )

    def _quantized_type(
        self, node: ir.Node, zero_point_input: ir.Tensor | None, zp_source: ConstantSource | None
    ) -> int:
        """The integer type of a Q's output or a DQ's input, following the spec's defaulting."""
        if zp_source is not None:
            return zp_source.elem_type
        computed = _elem_type_of(self, zero_point_input) if zero_point_input is not None else None
        if computed:
            return computed
        if node.op == QUANTIZE:
            return int(node.attrs.get("output_dtype", 0) or TensorProto.UINT8)
        source = node.inputs[0] if node.inputs else None
        known = _elem_type_of(self, source) if source is not None else None
        return known or TensorProto.UINT8

    def _integer_origin(self, tensor: ir.Tensor) -> ir.Tensor | None:
        """Follow a DQ's input back through pass-through nodes to a Q output, if it came from one."""
        while len(tensor.inputs) == 1 and self.is_pass_through(tensor.inputs[0]) and tensor.inputs[0].inputs:
            tensor = tensor.inputs[0].inputs[0]
        return tensor


def resolve_constant(tensor: ir.Tensor) -> ConstantSource | None:
    """The constant behind a tensor, through Constant nodes, Identity and Cast; None if computed."""
    via: list[ir.Node] = []
    while True:
        if isinstance(tensor, ir.Constant):
            return ConstantSource(tensor, via)
        if len(tensor.inputs) != 1:
            return None
        producer = tensor.inputs[0]
        if producer.op == "Constant":
            value = _constant_node_value(producer)
            return ConstantSource(value, via + [producer]) if value is not None else None
        if producer.op in PASS_THROUGH_OPS and producer.inputs:
            via.append(producer)
            tensor = producer.inputs[0]
            continue
        return None


def _quantizes_constant(quantize: ir.Node) -> bool:
    return bool(quantize.inputs) and resolve_constant(quantize.inputs[0]) is not None


def clipped_integers(tensor: ir.Tensor) -> tuple[list[ir.Node], ir.Tensor]:
    """The integer Clips (first to last) that end at `tensor`, each the only reader of the one
    before, and the tensor the first reads (`tensor` itself when no Clip makes it)."""
    clips: list[ir.Node] = []
    while len(tensor.inputs) == 1 and tensor.inputs[0].op == "Clip" and tensor.inputs[0].inputs:
        clips.insert(0, tensor.inputs[0])
        tensor = tensor.inputs[0].inputs[0]
    return clips, tensor


def _constant_node_value(node: ir.Node) -> ir.Constant | None:
    value = node.attrs.get("value")
    if isinstance(value, ir.Constant):
        return value
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64), ("value_ints", np.int64)):
        if key in node.attrs:
            return ir.Constant(node.outputs[0].name + "_value", np.asarray(node.attrs[key], dtype=dtype))
    return None


def source_values(model: Model, source: ConstantSource) -> np.ndarray:
    """A constant's values as the Q/DQ reading it sees them: every Cast on the way applied in order.

    Casting straight to the last type is not the same: float64 → float16 → float32 rounds to float16.
    """
    values = model.constant_values(source.constant)
    for to in source.casts:
        values = np.asarray(values).astype(helper.tensor_dtype_to_np_dtype(to))
    return np.asarray(values)


def onnx_type_of(constant: ir.Constant) -> int:
    proto = constant.proto
    if proto is not None:
        return int(ir.values_proto(proto).data_type)
    return helper.np_dtype_to_tensor_dtype(np.asarray(constant.values).dtype)


def _elem_type_of(index: QuantIndex, tensor: ir.Tensor) -> int | None:
    """The ONNX element type of a tensor when it is known without running inference."""
    if isinstance(tensor, ir.Constant):
        return onnx_type_of(tensor)
    if len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        if index._is_indexed(producer, QUANTIZE):
            return index.params(producer).elem_type
        if index._is_indexed(producer, DEQUANTIZE):
            return _dequantized_type(index.params(producer))
        if producer.op == "Cast":
            return producer.attrs.get("to")
        if producer.op == "Identity" and producer.inputs:
            return _elem_type_of(index, producer.inputs[0])
        if producer.op == "Constant":
            value = _constant_node_value(producer)
            if value is not None:
                return onnx_type_of(value)
    if isinstance(tensor.dtype, int):
        return tensor.dtype
    if tensor.dtype is not None:
        try:
            return helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype))
        except (TypeError, KeyError, ValueError):
            return None
    return None


def _dequantized_type(params: QParams) -> int | None:
    """The float type a DQ produces: its `output_dtype` (opset 23) or else its scale's type."""
    declared = int(params.node.attrs.get("output_dtype", 0) or 0)
    if declared:
        return declared
    source = params.scale_source
    if source is None:
        return None
    return source.elem_type


def _is_empty_input(tensor: ir.Tensor) -> bool:
    return tensor.name == "" and not isinstance(tensor, ir.Constant)


def _origin_of(source: ConstantSource | None) -> ir.Constant | ir.Node | None:
    return source.origin if source is not None else None


def _normalized_axis(axis: int, rank: int | None) -> int:
    return axis + rank if axis < 0 and rank is not None else axis


def _flat_equal(a: np.ndarray | None, b: np.ndarray | None, equal_nan: bool = False) -> bool:
    if a is None or b is None:
        return False
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.size == 1 == b.size:
        x, y = a[0], b[0]
        return bool(x == y or (equal_nan and x != x and y != y))
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=equal_nan))


def is_uniform(values: np.ndarray) -> bool:
    """True when there are values and all equal the first (a per-axis zero-point that is really one value)."""
    flat = np.asarray(values).ravel()
    return flat.size == 1 or (flat.size > 1 and bool((flat == flat[0]).all()))


def _summarise(values: np.ndarray) -> float | list[float] | dict:
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size == 1:
        return float(flat[0])
    if flat.size <= 8:
        return [float(v) for v in flat]
    return {"count": int(flat.size), "min": float(flat.min()), "max": float(flat.max())}
