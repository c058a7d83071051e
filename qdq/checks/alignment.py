"""QDQ4xx: values that a target requires to share one scale (Concat, pools, shape ops).

A Concat whose inputs and output use different scales forces a requantize per input; a MaxPool
whose output is quantized differently from its input cannot run as an integer kernel. The ops
come from the rule set; the fix gives the whole group one scale.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from qdq.graph import ir
from qdq.quant.index import QTensor, is_uniform
from qdq.quant.operands import input_value, output_value, scale_of
from qdq.rewrite.requantize import describe, set_params, why_grid_is_fixed
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError

_PREFER = ("coarser", "output")


class _SharedScale(Rule):
    """A group of quantized values (output last) that must have identical parameters."""

    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE

    def groups(self, ctx: CheckContext) -> Iterable[tuple[ir.Node, list[QTensor]]]:
        raise NotImplementedError

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, members in self.groups(ctx):
            params = [ctx.index.params(qt.nodes[0]) for qt in members]
            first = params[0]
            if all(first.same_values(p, equal_nan=True) for p in params[1:]):
                continue
            fixable = can_share(ctx, members)
            # Members quantized unlike the output: each is one requantize for an integer kernel.
            mismatched = sum(1 for p in params[:-1] if not p.same_values(params[-1], equal_nan=True))
            yield self.finding(
                ctx, node, [ctx.value_name(qt) for qt in members], subject=(node, members), fixable=fixable,
                op=node.op, scales=", ".join(describe(p.scale, p.zero_point) for p in params), mismatched=mismatched,
            )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, members = finding.subject
        reason = f"{mention(node)} ({node.op}) needs one scale for its inputs and output"
        return share_params(ctx, members, self.code, reason, ctx.params.get("prefer", "coarser"))


def can_share(ctx: CheckContext, members: list[QTensor]) -> bool:
    """Whether one per-tensor scale and zero-point can serve every member (same type, constant parameters,
    integers only their own Q/DQs write and read)."""
    params = [ctx.index.params(qt.nodes[0]) for qt in members]
    return (
        all(scale_of(ctx.index, qt) is not None and why_grid_is_fixed(ctx, qt) is None for qt in members)
        and len({p.elem_type for p in params}) == 1
        and all(is_uniform(p.zero_point) for p in params)
    )


def share_params(ctx: FixContext, members: list[QTensor], code: str, reason: str, prefer: str) -> list[Change]:
    """Give every member the parameters of one of them (the coarsest scale, or the last member's).

    A member another fix needs finer (`ctx.ceilings`) caps the group: it gets the coarsest scale
    all of them allow, and the cap then binds every member for the groups they also belong to.
    """
    winner = _winner(ctx, members, prefer)
    target = ctx.index.params(winner.nodes[0])
    scale, zero_point = target.scale.reshape(()), target.zero_point.reshape(())
    source = f"{ctx.value_name(winner)}'s"
    cap = ctx.ceilings.lowest(ctx.value_name(qt) for qt in members)
    if cap is not None and cap < float(scale):
        scale, source = np.asarray(cap), f"the finest another rule allows ({describe(np.asarray(cap), zero_point)})"
        for qt in members:
            ctx.ceilings.lower(ctx.value_name(qt), cap)
    changes: list[Change] = []
    for qt in members:
        changes += set_params(ctx, qt, scale, code, f"{reason}; took {source}", zero_point=zero_point)
    return changes


def _winner(ctx: CheckContext, members: list[QTensor], prefer: str) -> QTensor:
    """The value whose parameters the group takes: the coarsest scale (nothing saturates) or the output."""
    if prefer not in _PREFER:
        raise RuleSetError(f"prefer must be one of {', '.join(_PREFER)}, got {prefer!r}")
    if prefer == "output":
        return members[-1]
    # max() keeps the first of equal keys; reversed so that ties go to the output.
    return max(reversed(members), key=lambda qt: _coarseness(ctx, qt))


def _coarseness(ctx: CheckContext, qt: QTensor) -> tuple[float, float, float]:
    """Scale first; equal scales rank by zero-point (nearest the type's midpoint), a total order, so
    groups that share a member settle on one zero-point instead of trading it back and forth."""
    params = ctx.index.params(qt.nodes[0])
    zero_point = float(params.zero_point.ravel()[0])
    qtype = params.qtype
    midpoint = 0.0 if qtype is None or qtype.signed else (qtype.qmax + 1) / 2
    return scale_of(ctx.index, qt), -abs(zero_point - midpoint), zero_point



def _unique(values: Iterable[QTensor | None]) -> list[QTensor]:
    seen: dict[int, QTensor] = {}
    for qt in values:
        if qt is not None:
            seen.setdefault(id(qt), qt)
    return list(seen.values())


@register
class ConcatScaleMismatch(_SharedScale):
    """The quantized inputs and the output of a Concat should share one scale and zero-point.

    Why: with one scale a Concat only copies bytes. With different scales every input is
    requantized: TensorRT keeps the extra kernels (the YOLOv7 QAT engine ran slower than PTQ
    until concat inputs shared scales), and the AMD NPU compiler rejects the model.

    Example: `DQ(s=2^-6) → Concat ← DQ(s=2^-1)`, output `Q(s=2^-1)`. The fix gives every input
    and the output the coarsest scale, 2^-1 (parameter `prefer = "coarser"`, so no value that
    fitted before saturates), or the output's (`prefer = "output"`). Approximate: the finer
    branches lose precision, and the change report says how many bits.
    """

    code = "QDQ401"
    name = "concat-scale-mismatch"
    message = "{node}: {op} inputs and output use different quantization parameters ({scales})"
    parameters = {"ops": ["Concat"], "prefer": "coarser", "output_through": [], "output_through_mul": []}

    def groups(self, ctx: CheckContext) -> Iterable[tuple[ir.Node, list[QTensor]]]:
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            output = output_value(ctx.index, node, ctx.params["output_through"], ctx.params["output_through_mul"])
            inputs = [input_value(ctx.index, node, i) for i in range(len(node.inputs))]
            members = _unique(inputs + [output])
            if len(members) > 1:
                # The output goes last so that `prefer = "output"` and ties find it. A float
                # output still needs one scale on the inputs: the concatenated integers share one grid.
                yield node, [qt for qt in members if qt is not output] + ([output] if output is not None else [])


@register
class InOutScaleMismatch(_SharedScale):
    """Ops that only move or select values should quantize their output like their input.

    Why: MaxPool, Pad, Slice, Resize (nearest), Reshape, Transpose and friends do not change
    values, so an integer kernel can run them only when input and output share one scale. The
    AMD NPU requires it (in = out fix position); TensorRT fuses the Q after a MaxPool only when
    it matches the DQ before it.

    Example: `DQ(s=2^-5) → MaxPool → Q(s=2^-6)`. The fix sets both to the coarser 2^-5
    (parameter `prefer`; `"output"` keeps the output's). Approximate.
    """

    code = "QDQ402"
    name = "in-out-scale-mismatch"
    message = "{node}: {op} input and output use different quantization parameters ({scales})"
    parameters = {
        "ops": ["MaxPool", "Resize", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Pad"],
        "prefer": "coarser",
        "output_through": [],
        "output_through_mul": [],
    }

    def groups(self, ctx: CheckContext) -> Iterable[tuple[ir.Node, list[QTensor]]]:
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            source = input_value(ctx.index, node, 0)
            output = output_value(ctx.index, node, ctx.params["output_through"], ctx.params["output_through_mul"])
            if source is not None and output is not None and source is not output:
                yield node, [source, output]


@register
class ReshapeScaleMismatch(InOutScaleMismatch):
    """Reshape-like ops (Reshape, Flatten, Squeeze, Unsqueeze, Transpose) should keep their input's scale.

    Why: these ops move bytes without computing, so an output position different from the
    input's is a requantize the target must add. The AMD NPU
    compiler accepts it (a Vitis AI–compiled MobileNetV2 with a Flatten from 2^-4 to 2^-5 ran 347
    of its 349 nodes on the DPU), unlike a pool or a Concat with mismatched positions (QDQ401,
    QDQ402), so this is its own rule with its own severity: a rule set lists these ops here
    instead of under QDQ402.

    Example: `DQ(s=2^-4) → Flatten → Q(s=2^-5)`. The fix sets both to the coarser 2^-4
    (parameter `prefer`; `"output"` keeps the output's). Approximate.
    """

    code = "QDQ403"
    name = "reshape-scale-mismatch"
    parameters = {**InOutScaleMismatch.parameters, "ops": ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"]}
