"""QDQ2xx and QDQ3xx: exporter artefacts and dangling nodes.

PyTorch's exporters write per-tensor parameters as 1-element tensors, route them through
Identity nodes, and put no-op Casts between Q and DQ. All are harmless to the math but block
pattern matching in onnxruntime and TensorRT. Every fix here is exact.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from qdq.graph import ir
from qdq.quant.index import PER_TENSOR, ConstantSource, QParams, QuantIndex, source_values
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register

_SCALE, _ZERO_POINT = 1, 2


def _param_slots(p: QParams) -> list[tuple[int, ir.Tensor, ConstantSource | None]]:
    slots = [(_SCALE, p.scale_input, p.scale_source)]
    if p.zero_point_input is not None:
        slots.append((_ZERO_POINT, p.zero_point_input, p.zero_point_source))
    return slots


def _slot_name(slot: int) -> str:
    return "scale" if slot == _SCALE else "zero-point"


@register
class NonScalarQParams(Rule):
    """Per-tensor scales and zero-points should be scalars, not 1-element tensors.

    Why: the TorchScript exporter writes them with shape [1]. That is legal ONNX, but onnxruntime
    fuses a uint8 Add into QLinearAdd and then rejects the session ("Scale and Zero-point must be
    a scalar"), and several fusion checks (Relu/Clip absorption) need a 0-d zero-point.

    Example: `QuantizeLinear(x, scale=[0.05], zp=[0])`; the fix reshapes them to 0-d. Exact.
    """

    code = "QDQ201"
    name = "non-scalar-qparams"
    message = "{op} {node} has a 1-element {what} of shape {shape}; per-tensor parameters should be scalars"
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        for row in np.flatnonzero(~table.scalar_params()):  # 0-d parameters have nothing to report
            p = table.rows[row]
            if p.granularity != PER_TENSOR or p.block_size:
                continue
            # Only 1-element tensors: an empty scale is QDQ001's error and has no scalar form.
            slots = [
                (slot, tensor, source)
                for slot, tensor, source in _param_slots(p)
                if source is not None and source.constant.shape and int(np.prod(source.constant.shape)) == 1
            ]
            if slots:
                # One finding per node: exporters shape scale and zero-point alike, so one line says it.
                yield self.finding(
                    ctx, p.node, [tensor for _, tensor, _ in slots], subject=(p, slots), op=p.node.op,
                    what=" and ".join(_slot_name(slot) for slot, _, _ in slots),
                    shape=list(slots[0][2].constant.shape),
                )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        p, slots = finding.subject
        changes = []
        for slot, _, source in slots:
            change = self._make_scalar(ctx, p, slot, source)
            if change is not None:
                changes.append(change)
        return changes

    def _make_scalar(self, ctx: FixContext, p: QParams, slot: int, source: ConstantSource) -> Change | None:
        constant = source.constant
        old_shape = list(constant.shape)
        if not old_shape:
            return None  # an earlier finding on a shared constant already fixed it
        # What the graph reads: the initializer itself, or the output of the Constant node holding it.
        held = source.via[-1].outputs[0] if source.via and source.via[-1].op == "Constant" else constant
        chain = _qparam_only_chain(held, ctx.index)
        if chain is not None:
            # Every reader is a Q/DQ parameter: reshape in place, and the shapes known along the way.
            ctx.edits.set_values(constant, ctx.model.constant_values(constant).reshape(()))
            for tensor in chain:
                if isinstance(tensor, ir.Variable) and tensor.shape is not None:
                    tensor.shape = []
            target = held.name
        else:
            # Someone else reads the [1] tensor too: give this Q/DQ its own scalar (one per constant),
            # with the values the Q/DQ saw, Casts on the way applied.
            values = source_values(ctx.model, source).reshape(())
            scalar = _existing_constant(ctx.graph, f"{constant.name}_scalar", values)
            if scalar is None:
                scalar = ir.Constant(ctx.new_name(f"{constant.name}_scalar"), values)
            ctx.edits.set_input(p.node, slot, scalar)
            target = scalar.name
        return Change(self.code, mention(p.node), target, old_shape, [], f"{_slot_name(slot)} reshaped to a scalar")


def _qparam_only_chain(tensor: ir.Tensor, index: QuantIndex) -> list[ir.Tensor] | None:
    """The tensors from `tensor` through Identity/Cast to Q/DQ parameter inputs, or None when anything
    else reads them (another op, a Q/DQ data input, a blocked Q/DQ, or a graph output): then reshaping
    in place would change what that reader sees."""
    if index.is_graph_output(tensor):
        return None
    chain = [tensor]
    for reader in tensor.outputs:
        if reader.op in ("QuantizeLinear", "DequantizeLinear"):
            if reader.inputs[0] is tensor or reader.attrs.get("block_size"):
                return None
        elif reader.op in ("Identity", "Cast"):
            for out in reader.outputs:
                sub = _qparam_only_chain(out, index)
                if sub is None:
                    return None
                chain.extend(sub)
        else:
            return None
    return chain


def _existing_constant(graph: ir.Graph, base: str, values: np.ndarray) -> ir.Constant | None:
    """A constant an earlier finding made with the same values (named base, base_1, ...), to share it.

    So a Q and a DQ that shared one parameter still share one after the fix."""
    tensors = graph.tensors()
    name, i = base, 0
    while name in tensors:
        tensor = tensors[name]
        if isinstance(tensor, ir.Constant) and tuple(tensor.shape) == values.shape and tensor.dtype == values.dtype:
            if np.array_equal(np.asarray(tensor.values), values):
                return tensor
        i += 1
        name = f"{base}_{i}"
    return None


@register
class QParamPassThrough(Rule):
    """A scale or zero-point should come straight from a constant, not through Identity or Cast.

    Why: the PyTorch exporters route zero-points (and, in the reference export, scales) through
    Identity nodes. Tools and runtimes that look for a constant parameter see a computed one and
    skip the fusion.

    Example: `zp (initializer) → Identity → QuantizeLinear`; the fix reads the initializer (cast
    ahead of time where a Cast was in the way). Exact.
    """

    code = "QDQ202"
    name = "qparam-pass-through"
    message = "{op} {node} reads its {what} through {chain}"
    severity = Severity.INFO
    fix_safety = FixSafety.EXACT

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for p in ctx.index.all_params():
            for slot, tensor, source in _param_slots(p):
                chain = [n for n in (source.via if source else []) if n.op in ("Identity", "Cast")]
                if chain:
                    yield self.finding(
                        ctx, p.node, [tensor], subject=(p, slot, source), op=p.node.op,
                        what=_slot_name(slot), chain=" → ".join(n.op for n in reversed(chain)),
                    )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        p, slot, source = finding.subject
        old = p.node.inputs[slot]
        if source.cast_to is None:
            root = _chain_root(old)
        else:
            values = source_values(ctx.model, source)
            root = _existing_constant(ctx.graph, f"{old.name}_const", values)
            if root is None:
                root = ir.Constant(ctx.new_name(f"{old.name}_const"), values)
        ctx.edits.set_input(p.node, slot, root)
        return [Change(self.code, mention(p.node), old.name, old.name, root.name, f"{_slot_name(slot)} read directly")]


def _chain_root(tensor: ir.Tensor) -> ir.Tensor:
    """The tensor at the start of an Identity/Cast chain: an initializer or a Constant node's output."""
    while tensor.inputs and tensor.inputs[0].op in ("Identity", "Cast"):
        tensor = tensor.inputs[0].inputs[0]
    return tensor


@register
class PassThroughBetweenQDQ(Rule):
    """Nothing should sit between a QuantizeLinear and the DequantizeLinear that reads it.

    Why: PyTorch's reference export writes `Q → Cast(to=int8) → DQ` for every pair; the Cast does
    nothing, but pattern matchers in onnxruntime and TensorRT no longer see a Q/DQ pair.

    Example: `QuantizeLinear → Cast(to=INT8) → DequantizeLinear`; the fix makes the DQ read the Q
    directly. Exact.
    """

    code = "QDQ203"
    name = "pass-through-between-qdq"
    message = "{chain} between QuantizeLinear {quantize} and DequantizeLinear {node} does nothing"
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt in ctx.index.qtensors:
            if qt.quantize is None:
                continue
            for consumer, via in ctx.index.consumers_through(qt.integer):
                if consumer.op == "DequantizeLinear" and via:
                    yield self.finding(
                        ctx, consumer, [qt.integer] + [n.outputs[0] for n in via], subject=(qt.integer, consumer),
                        quantize=mention(qt.quantize), chain=" → ".join(n.op for n in via),
                    )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        integer, dq = finding.subject
        old = dq.inputs[0]
        ctx.edits.set_input(dq, 0, integer)
        return [Change(self.code, mention(dq), old.name, old.name, integer.name, "DequantizeLinear reads the Q directly")]


@register
class DanglingQDQ(Rule):
    """A Q or DQ whose output nobody reads is dead weight.

    Why: it usually marks an incomplete graph edit (a rewired consumer, a deleted branch). It costs
    nothing at run time once a runtime prunes it, but it confuses every tool that reads placement.

    Example: a DequantizeLinear left behind after its Conv was removed; the fix deletes it. Exact.
    """

    code = "QDQ301"
    name = "dangling-qdq"
    message = "{op} {node} has no consumers"
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.index.quantizes + ctx.index.dequantizes:
            out = node.outputs[0] if node.outputs else None
            if out is not None and not out.outputs and not ctx.index.is_graph_output(out):
                yield self.finding(ctx, node, [out], subject=node, op=node.op)

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node = finding.subject
        name, shown = node.outputs[0].name, mention(node)  # before detaching: an unnamed node is named by its output
        ctx.edits.detach(node)
        return [Change(self.code, shown, name, node.op, None, "removed")]
