"""The one way fixes change a graph: every edit is made at once and written down as data.

Fixes read the graph they have just edited, so no edit waits. The fix driver reads the journal
instead of trusting each rule to declare what its fixes do: a structural edit (a node added or
detached, an output moved, an input rewired to or away from a computed tensor, a constant's
values changed in place) costs a tidy and a new quantization index; a constant swapped for a
constant does not. A Q/DQ whose parameters change is re-read by the index as it happens
(`on_params`), because fixes read the parameters they have just set: QDQ503's fix reads the type
QDQ505's gave the value, and the second finding on a value reads what the first one moved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from qdq.graph import ir
from qdq.graph.ops import QDQ_DOMAINS, QDQ_OPS
from qdq.quant.index import PASS_THROUGH_OPS, resolve_constant

# What a record says happened.
PARAMS = "params"  # a Q or DQ reads another scale or zero-point constant (input 1 or 2)
CONSTANT = "constant"  # any other input reads a constant in place of a constant (or of nothing)
INPUT = "input"  # an input now reads, or no longer reads, a computed tensor
OUTPUT = "output"  # a node writes another tensor
ADD = "add"
DETACH = "detach"  # a node's inputs and outputs cleared: nothing reads it, it reads nothing
VALUES = "values"  # a constant's values replaced in place (the log cannot tell who reads them)
ATTRIBUTE = "attribute"
TYPE = "type"  # a computed tensor declared with another element type (its readers' types follow)
STRUCTURAL = frozenset({INPUT, OUTPUT, ADD, DETACH, VALUES, TYPE})

_PARAM_SLOTS = (1, 2)


@dataclass(frozen=True)
class EditRecord:
    """One edit: its kind, the node (None for a constant's values), the input or output slot (an
    attribute's name), and what was there before and after (tensor names, an attribute's value as text)."""

    kind: str
    node: str | None
    slot: int | str | None = None
    old: str | None = None
    new: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EditLog:
    """Applies a fix's edits to `graph` and keeps their records in order.

    `on_params(node)` is called when a Q/DQ's parameters may differ from what was read before: its
    scale or zero-point input or an attribute changed, or it was just added.
    """

    def __init__(self, graph: ir.Graph, on_params: Callable[[ir.Node], None] | None = None):
        self.graph = graph
        self.on_params = on_params
        self.records: list[EditRecord] = []
        self.structural = False  # whether any record is: the index and the node order are stale

    @property
    def touched(self) -> set[str]:
        """The names of the nodes any edit changed or added."""
        return {r.node for r in self.records if r.node is not None}

    @property
    def swapped(self) -> set[str]:
        """The names of the Q/DQ nodes that read another scale or zero-point constant."""
        return {r.node for r in self.records if r.kind == PARAMS}

    def set_input(self, node: ir.Node, slot: int, tensor: ir.Tensor) -> None:
        """Point input `slot` of `node` at `tensor`, padding with empty inputs up to it."""
        self._set_input(node, slot, tensor)
        if slot in _PARAM_SLOTS:
            self._params_changed(node)

    def replace_uses(self, old: ir.Tensor, new: ir.Tensor) -> None:
        """Make every node that reads `old` read `new`; graph outputs stay, their names are the model's interface."""
        for consumer in list(old.outputs):
            for slot, tensor in enumerate(consumer.inputs):
                if tensor is old:
                    self.set_input(consumer, slot, new)

    def swap_params(self, node: ir.Node, scale: ir.Tensor, zero_point: ir.Tensor | None = None, **attrs: Any) -> None:
        """Give a Q or DQ another scale, zero-point (kept when None) and attributes (None drops one), at once."""
        self._set_input(node, 1, scale)
        if zero_point is not None:
            self._set_input(node, 2, zero_point)
        for name, value in attrs.items():
            self._set_attr(node, name, value)
        self._params_changed(node)

    def set_attr(self, node: ir.Node, name: str, value: Any) -> None:
        """Set attribute `name` of `node` (drop it when `value` is None)."""
        self._set_attr(node, name, value)
        self._params_changed(node)

    def add_node(self, node: ir.Node) -> None:
        """Add a node built on the graph's tensors (building it linked it to them already)."""
        self.graph.nodes.append(node)
        self._record(EditRecord(ADD, node.name))
        self._params_changed(node)

    def detach(self, node: ir.Node) -> None:
        """Unlink a node from every tensor; the next tidy drops it."""
        node.inputs.clear()
        node.outputs.clear()
        self._record(EditRecord(DETACH, node.name))

    def set_output(self, node: ir.Node, slot: int, tensor: ir.Tensor) -> None:
        """Make `node` write `tensor` as output `slot`."""
        old = node.outputs[slot].name
        node.outputs[slot] = tensor
        self._record(EditRecord(OUTPUT, node.name, slot, old, tensor.name))

    def set_type(self, tensor: ir.Variable, dtype: Any) -> None:
        """Declare a computed tensor (or a graph input) with another element type."""
        old = tensor.dtype
        tensor.dtype = dtype
        self._record(EditRecord(TYPE, None, None, _text(old), str(np.dtype(dtype))))

    def set_values(self, constant: ir.Constant, values: Any) -> None:
        """Replace a constant's values in place: every reader sees them, and the Q/DQs among them are re-read."""
        constant.values = values
        self._record(EditRecord(VALUES, None, None, constant.name, constant.name))
        for reader in _readers(constant):
            self._params_changed(reader)

    def _set_input(self, node: ir.Node, slot: int, tensor: ir.Tensor) -> None:
        while len(node.inputs) <= slot:
            node.inputs.append(ir.Variable.empty())
        old = node.inputs[slot]
        node.inputs[slot] = tensor
        self._record(EditRecord(_input_kind(node, slot, old, tensor), node.name, slot, old.name or None, tensor.name))

    def _set_attr(self, node: ir.Node, name: str, value: Any) -> None:
        old = node.attrs.get(name)
        if value is None:
            node.attrs.pop(name, None)
        else:
            node.attrs[name] = value
        if not _same_value(old, value):
            self._record(EditRecord(ATTRIBUTE, node.name, name, _text(old), _text(value)))

    def _params_changed(self, node: ir.Node) -> None:
        if self.on_params is not None and _is_qdq(node):
            self.on_params(node)

    def _record(self, record: EditRecord) -> None:
        self.records.append(record)
        self.structural = self.structural or record.kind in STRUCTURAL


def _input_kind(node: ir.Node, slot: int, old: ir.Tensor, new: ir.Tensor) -> str:
    """A constant in place of a constant (or of an empty input) leaves the structure as it was."""
    if not isinstance(new, ir.Constant) or (old.name and resolve_constant(old) is None):
        return INPUT
    return PARAMS if slot in _PARAM_SLOTS and _is_qdq(node) else CONSTANT


def _readers(tensor: ir.Tensor) -> list[ir.Node]:
    """The nodes reading a tensor, through the Identity and Cast nodes that pass a constant on."""
    found = []
    for node in tensor.outputs:
        if node.op in PASS_THROUGH_OPS:
            found += [reader for out in node.outputs for reader in _readers(out)]
        else:
            found.append(node)
    return found


def _is_qdq(node: ir.Node) -> bool:
    return node.op in QDQ_OPS and node.domain in QDQ_DOMAINS


def _same_value(old: Any, new: Any) -> bool:
    """Whether an attribute keeps its value (arrays compared element by element: `!=` would not give one bool)."""
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        return old is not None and new is not None and np.array_equal(old, new)
    return old == new


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
