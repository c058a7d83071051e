"""QDQ1xx: do the Q and DQ nodes pair up, and are there redundant ones?

A quantized tensor should be made by one Q and read back by DQs with the same parameters.
Anything else is either a bug (mismatched pair), wasted work (a no-op requantize, a duplicate Q)
or a real requantization that costs precision and, on most targets, a separate kernel.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from qdq.checks.alignment import can_share, share_params
from qdq.quant.index import PER_TENSOR, QParams
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register


@register
class QDQParamMismatch(Rule):
    """A DequantizeLinear must use the parameters of the QuantizeLinear that produced its input.

    Why: Q(x, s1) followed by DQ(·, s2) rescales every value by s2/s1 — almost always a graph
    surgery or export bug. No runtime can fuse the pair, and the numbers are wrong.

    Example: `Q(x, scale=0.02, zp=0) → DQ(scale=0.04, zp=0)` after a script edited one initializer.
    """

    code = "QDQ101"
    name = "qdq-param-mismatch"
    message = "DequantizeLinear {node} reads {quantize} with different parameters ({detail})"
    severity = Severity.ERROR

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        pairs = [(qt, dq_node) for qt in ctx.index.qtensors if qt.quantize is not None for dq_node in qt.dequantizes]
        # Nearly every pair reads equal per-tensor constants: cleared at once, the rest compared one by one.
        rows = np.array([(table.row_of[id(qt.quantize)], table.row_of[id(dq_node)]) for qt, dq_node in pairs],
                        dtype=np.int64).reshape(-1, 2)
        same = table.same_params(rows[:, 0], rows[:, 1])
        for (qt, dq_node), cleared in zip(pairs, same):
            if cleared:
                continue
            q, dq = ctx.index.params(qt.quantize), ctx.index.params(dq_node)
            # NaN == NaN here: a pair sharing a NaN scale is QDQ001's error, not a mismatch.
            if q.dynamic or dq.dynamic or q.same_values(dq, equal_nan=True):
                continue
            yield self.finding(
                ctx, dq_node, [qt.integer, q.scale_input, dq.scale_input],
                quantize=mention(qt.quantize), detail=_difference(q, dq), q=q.describe(), dq=dq.describe(),
            )


def _difference(a: QParams, b: QParams) -> str:
    if a.elem_type != b.elem_type:
        return "different types"
    if a.granularity != b.granularity or (a.granularity != PER_TENSOR and a.axis != b.axis):
        return "different granularity or axis"
    if a.block_size != b.block_size:
        return "different block size"
    scale_a, scale_b = a.scale.ravel(), b.scale.ravel()
    if scale_a.shape != scale_b.shape or not np.array_equal(scale_a, scale_b):
        return "different scale"
    return "different zero-point"


class _DequantizeQuantize(Rule):
    """Shared matching for DQ → Q pairs: a Q whose float input comes straight from a DQ."""

    def pairs(self, ctx: CheckContext) -> Iterable[tuple[QParams, QParams]]:
        for q_node in ctx.index.quantizes:
            if not q_node.inputs:
                continue
            dq_node = ctx.index.dequantize_feeding(q_node.inputs[0])
            if dq_node is None:
                continue
            dq, q = ctx.index.params(dq_node), ctx.index.params(q_node)
            if not (dq.dynamic or q.dynamic):
                yield dq, q


@register
class NoopRequantize(_DequantizeQuantize):
    """A DequantizeLinear followed by a QuantizeLinear with the same parameters does nothing.

    Why: Q(DQ(q)) == q, so the pair only costs two kernels and, on TensorRT and onnxruntime, can
    split a fusion. Exporters leave these after `.contiguous()` or an Identity module.

    Example: `DQ(s=0.05) → Q(s=0.05) → DQ(s=0.05) → Conv`; the fix makes the Conv's DQ read the
    first integer tensor directly. Exact.
    """

    code = "QDQ102"
    name = "noop-requantize"
    message = "DequantizeLinear {dequantize} → QuantizeLinear {node} with identical parameters is a no-op"
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for dq, q in self.pairs(ctx):
            if dq.same_values(q):
                out = q.node.outputs[0]
                yield self.finding(
                    ctx, q.node, [dq.node.inputs[0], out], subject=(dq, q),
                    fixable=not ctx.index.is_graph_output(out), dequantize=mention(dq.node),
                )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        dq, q = finding.subject
        integer, out = dq.node.inputs[0], q.node.outputs[0]
        ctx.edits.replace_uses(out, integer)
        return [Change(self.code, mention(q.node), out.name, out.name, integer.name,
                       f"readers of {out.name} now read {integer.name}; {mention(q.node)} is unused")]


@register
class RequantizeChain(_DequantizeQuantize):
    """A DequantizeLinear followed by a QuantizeLinear with different parameters requantizes.

    Why: the value is rounded twice, and every target runs it as a separate rescale kernel. It is
    sometimes intended (a scale change between two layers) but is usually a missed scale sharing;
    the target rule sets decide whether it is an error and whether to fix it (`unify = true`).

    Example: `DQ(s=0.05) → Q(s=0.1)` feeding a Concat whose other input uses 0.1. With `unify`,
    both values take the coarser scale 0.1 (`prefer = "coarser"`; `"output"` keeps the Q's), and
    the pair, now a no-op, is removed by QDQ102. Approximate: the first value loses precision.
    """

    code = "QDQ103"
    name = "requantize-chain"
    message = "DequantizeLinear {dequantize} → QuantizeLinear {node} requantizes (scale {old_scale} → {new_scale})"
    severity = Severity.INFO
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"unify": False, "prefer": "coarser"}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for dq, q in self.pairs(ctx):
            if not dq.same_values(q):
                members = [ctx.index.qtensor_of(dq.node), ctx.index.qtensor_of(q.node)]
                fixable = ctx.params["unify"] and None not in members and can_share(ctx, members)
                yield self.finding(
                    ctx, q.node, [dq.node.inputs[0], q.node.outputs[0]], subject=members, fixable=fixable,
                    dequantize=mention(dq.node), old_scale=_short(dq), new_scale=_short(q),
                )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        reason = f"{finding.values['dequantize']} → {finding.node} requantizes; one scale makes the pair a no-op"
        return share_params(ctx, finding.subject, self.code, reason, ctx.params["prefer"])


def _short(p: QParams) -> str:
    values = p.scale.ravel()
    return f"{values[0]:.6g}" if values.size == 1 else f"{values.size} per-axis values"


@register
class DuplicateQuantize(Rule):
    """A float tensor should be quantized by one QuantizeLinear.

    Why: two Qs of the same tensor do the same work twice; with different parameters, consumers
    see two different integer versions and targets cannot share one buffer.

    Example: `x → Q(s=0.1) → DQ → Conv` and `x → Q(s=0.1) → DQ → Add`. With identical parameters
    the fix makes both DQs read the first Q. Exact.
    """

    code = "QDQ104"
    name = "duplicate-quantize"
    message = "{tensor} is quantized again by {node} (first by {first}){detail}"
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        seen: set[int] = set()
        for q_node in ctx.index.quantizes:
            source = q_node.inputs[0] if q_node.inputs else None
            if source is None or id(source) in seen:
                continue
            seen.add(id(source))
            qs = ctx.index.quantizes_of(source)
            first = ctx.index.params(qs[0])
            for other_node in qs[1:]:
                other = ctx.index.params(other_node)
                same = first.same_values(other)
                out = other_node.outputs[0]
                yield self.finding(
                    ctx, other_node, [source, out], subject=(first, other),
                    fixable=same and not ctx.index.is_graph_output(out),
                    tensor=source.name, first=mention(qs[0]), detail="" if same else " with different parameters",
                )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        first, other = finding.subject
        kept, dropped = first.node.outputs[0], other.node.outputs[0]
        ctx.edits.replace_uses(dropped, kept)
        return [Change(self.code, mention(other.node), dropped.name, dropped.name, kept.name,
                       f"readers of {dropped.name} now read {kept.name}; {mention(other.node)} is unused")]
