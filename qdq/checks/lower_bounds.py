"""QDQ507: the zero-point of an activation that cannot go below a known bound sits at that bound.

The bound comes from the ops that make the value, without data: a table of op → least output in
the rule set (Relu 0, Sigmoid 0, SiLU's x·sigmoid(x) -0.27846...), ops that carry their inputs'
bounds (MaxPool, Concat, Resize, Reshape, ...: the smallest; Add: the sum), Clip's min, and the
grid of a Q/DQ pair in between.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from qdq.checks.reduced_range import clip_bounds
from qdq.graph import ir
from qdq.quant.dtypes import QUANT_TYPES_BY_NAME
from qdq.quant.index import QUANTIZE, QTensor, is_uniform
from qdq.quant.operands import ACTIVATION, output_value, role, scale_of
from qdq.rewrite.requantize import set_params
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError

# The key of `lower_bounds` for SiLU as exporters write it: Mul(x, Sigmoid(x)).
SILU = "Mul(x, Sigmoid(x))"


@register
class ClippedZeroPoint(Rule):
    """An activation that cannot go below a bound lo should have the zero-point that puts lo at the type minimum.

    Why: with a symmetric grid (uint8 zero-point 128) half the integers of a one-sided value are
    never used, and the raw uint8 inputs of the next Conv sit around 128, where onnxruntime's u8×s8
    kernels on x86 without VNNI saturate their 16-bit pair sums (QDQ508); near the type minimum
    almost no pair can. After a Relu (lo = 0) the zero-point is the type minimum, which also lets
    onnxruntime absorb the Relu into the integer op before it: otherwise Conv → Relu → Q and
    Add → Relu → Q stay float (a QAT classifier: 5 of 14 convs fused with zp 128, 14 of 14 with
    zp 0, 2.3x faster).

    The bound is derived from the ops, without data: `lower_bounds` maps an op to its least output
    (Relu, Sigmoid 0; HardSwish -0.375; SiLU written as `Mul(x, Sigmoid(x))` -0.27846, the minimum
    of x·sigmoid(x), or the exact least product when the Sigmoid's output is quantized); a Clip
    bounds by its min; ops in `carry` pass on the smallest bound of their inputs (Resize unless
    cubic) and ops in `sum` the sum (Add); a Q → DQ pair passes on its input's bound rounded on its
    grid. Bounds above 0 count as 0. The new zero-point is the type minimum - round(lo / scale):
    the Q rounds lo to that step, so nothing it can be given falls below the type minimum, and a
    value made from it through a Q/DQ pair (bound rounded on the same grid) gets the same one.

    Example: `SiLU → Q(s=0.05, zp=128 uint8)`. The fix sets zp round(0.27846 / 0.05) = 6 with the
    same scale on the Q and its DQs, and on every value that shares those parameters through ops
    that only move values (`through`: MaxPool, Reshape, ...), so QDQ402 does not see a mismatch.
    The grid points stay where they were: every value the old grid held (down to -128 · 0.05,
    below lo anyway, up to 127 · 0.05) gives the same number as before; values above the old
    maximum, which it saturated, are now represented up to 249 · 0.05. Marked approximate for
    those values only. `types` names the activation types the rule applies to.
    """

    code = "QDQ507"
    name = "clipped-zero-point"
    message = ("{tensor} after {op} {activation} is never below {bound:.6g} but has zero-point {zero_point}; "
               "{expected} keeps its grid and puts that bound at the type minimum")
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {
        "lower_bounds": {"Relu": 0.0, "Sigmoid": 0.0, SILU: -0.2784646},
        "carry": ["MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Resize", "Concat"],
        "sum": ["Add"],
        "through": ["MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Resize"],
        "types": ["uint8", "int8", "uint16", "int16"],
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        integer = [name for name, qtype in QUANT_TYPES_BY_NAME.items() if not qtype.is_float]
        if not set(ctx.params["types"]) <= set(integer):
            raise RuleSetError(f"{self.code}.types must name integer types ({', '.join(integer)}), "
                               f"got {ctx.params['types']!r}")
        bounds = _Bounds(ctx)
        covered: set[int] = set()
        for qt in ctx.index.qtensors:
            scale = scale_of(ctx.index, qt) if qt.quantize is not None and qt.nodes[0] is qt.quantize else None
            if scale is None or id(qt) in covered or role(ctx.index, qt) != ACTIVATION:
                continue
            params = ctx.index.params(qt.quantize)
            qtype, zero_point = params.qtype, params.zero_point
            if qtype is None or qtype.name not in ctx.params["types"] or not is_uniform(zero_point):
                continue
            tensor = qt.quantize.inputs[0]
            if isinstance(tensor, ir.Constant) or not _read_by_its_dequantizes(ctx, qt):
                continue  # a weight that reaches its op indirectly; integers an op reads (a Clip) on the old grid
            low = bounds.of(tensor)
            if low is None:
                continue
            expected = min(qtype.qmax, qtype.qmin - int(np.rint(low / scale)))
            if expected >= zero_point.ravel()[0]:
                continue
            group = [m for m in _zero_point_group(ctx, qt, ctx.params["through"]) if _read_by_its_dequantizes(ctx, m)]
            covered.update(id(m) for m in group)
            producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
            fixable = all(not ctx.index.is_graph_output(m.integer) and scale_of(ctx.index, m) for m in group)
            yield self.finding(ctx, qt.quantize, [ctx.value_name(m) for m in group], subject=group,
                               fixable=fixable, tensor=ctx.value_name(qt), bound=low,
                               op=bounds.op_name(producer) if producer is not None else "?",
                               activation=mention(producer),
                               zero_point=int(zero_point.ravel()[0]), expected=int(expected))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        changes: list[Change] = []
        new_zero_point = finding.values["expected"]
        for member in finding.subject:
            params = ctx.index.params(member.nodes[0])
            qtype, scale = params.qtype, float(params.scale.ravel()[0])
            zero_point = float(params.zero_point.ravel()[0])
            old_max, new_max = (qtype.qmax - zero_point) * scale, (qtype.qmax - new_zero_point) * scale
            reason = (f"zero-point at the bound {finding.values['bound']:.6g} after {finding.values['op']} "
                      f"{finding.values['activation']}: same grid, representable maximum {old_max:.6g} → "
                      f"{new_max:.6g}; only values the old grid saturated (above {old_max:.6g}) change")
            for change in set_params(ctx, member, params.scale, self.code, reason, zero_point=new_zero_point):
                change.values.update(old_max=old_max, new_max=new_max)
                changes.append(change)
        return changes


class _Bounds:
    """Lower bounds of float tensors, derived from the ops that make them (memoised for one check)."""

    def __init__(self, ctx: CheckContext):
        self.ctx = ctx
        self.table = {op: float(value) for op, value in ctx.params["lower_bounds"].items()}
        self.carry, self.sum = set(ctx.params["carry"]), set(ctx.params["sum"])
        self.memo: dict[int, float | None] = {}

    def of(self, tensor: ir.Tensor) -> float | None:
        """The least value the tensor can hold (at most 0), or None when its producers do not bound it."""
        key = id(tensor)
        if key not in self.memo:
            self.memo[key] = None  # a cycle is unbounded
            low = self._derive(tensor)
            self.memo[key] = None if low is None or not math.isfinite(low) else min(low, 0.0)
        return self.memo[key]

    def op_name(self, node: ir.Node) -> str:
        return SILU if self._silu(node) is not None else node.op

    def _derive(self, tensor: ir.Tensor) -> float | None:
        if isinstance(tensor, ir.Constant):
            values = np.asarray(tensor.values)
            return float(values.min()) if values.size else None
        dq = self.ctx.index.dequantize_feeding(tensor)
        if dq is not None:
            return self._dequantized(dq)
        if len(tensor.inputs) != 1:
            return None
        node = tensor.inputs[0]
        silu = self._silu(node)
        if silu is not None:
            return self._silu_bound(silu)
        if node.op in self.table:
            return self.table[node.op]
        if node.op == "Clip":
            return max(b for b in (clip_bounds(self.ctx, node)[0], self.of(node.inputs[0]), -math.inf) if b is not None)
        if node.op == "Resize" and node.attrs.get("mode") == "cubic":  # overshoots
            return None
        if node.op in self.carry | self.sum:
            data = node.inputs if node.op in self.sum or node.op == "Concat" else node.inputs[:1]
            bounds = [self.of(t) for t in data]
            if not bounds or any(b is None for b in bounds):
                return None
            return sum(bounds) if node.op in self.sum else min(bounds)
        return None

    def _dequantized(self, dq: ir.Node) -> float | None:
        """A DQ of a Q of a bounded tensor: the bound rounded on the grid (Q rounds monotonically, then clips)."""
        quantize = self._quantize_of(dq)
        if quantize is None:
            return None
        low = self.of(quantize.inputs[0])
        params = self.ctx.index.params(quantize)
        if low is None or params.qtype is None or params.qtype.is_float or params.scale.size != 1 \
                or not is_uniform(params.zero_point):
            return None
        scale, zero_point = float(params.scale.ravel()[0]), float(params.zero_point.ravel()[0])
        return max(float(np.rint(low / scale)), params.qtype.qmin - zero_point) * scale

    def _quantize_of(self, dq: ir.Node) -> ir.Node | None:
        """The Q (with the same parameters) whose integers this DQ reads."""
        integers = dq.inputs[0]
        quantize = integers.inputs[0] if len(integers.inputs) == 1 else None
        if quantize is None or quantize.op != QUANTIZE or self.ctx.index.qtensor_of(quantize) is None:
            return None
        same = self.ctx.index.params(quantize).same_values(self.ctx.index.params(dq))
        return quantize if same and not self.ctx.index.params(dq).dynamic else None

    def _silu(self, node: ir.Node) -> tuple[ir.Tensor, ir.Node] | None:
        """Mul(x, Sigmoid(x)), x the same on both sides (one tensor, or one quantized value): (the Sigmoid's
        output as the Mul reads it, the Sigmoid)."""
        if node.op != "Mul" or SILU not in self.table or len(node.inputs) != 2:
            return None
        for gate, x in (node.inputs, node.inputs[::-1]):
            sigmoid = self._source(gate)
            sigmoid = sigmoid.inputs[0] if len(sigmoid.inputs) == 1 else None
            if sigmoid is not None and sigmoid.op == "Sigmoid" and self._same_x(sigmoid.inputs[0], x):
                return gate, sigmoid
        return None

    def _same_x(self, a: ir.Tensor, b: ir.Tensor) -> bool:
        if a is b:
            return True
        dqs = [self.ctx.index.dequantize_feeding(t) for t in (a, b)]
        if any(dq is None for dq in dqs):
            return False
        first, second = (self.ctx.index.qtensor_of(dq) for dq in dqs)
        return first is not None and first is second

    def _source(self, tensor: ir.Tensor) -> ir.Tensor:
        """The float tensor a chain of Q → DQ pairs starts from."""
        while (dq := self.ctx.index.dequantize_feeding(tensor)) is not None and (q := self._quantize_of(dq)):
            tensor = q.inputs[0]
        return tensor

    def _silu_bound(self, silu: tuple[ir.Tensor, ir.Node]) -> float:
        """The table's x·sigmoid(x) minimum, or with a quantized Sigmoid output the least x·sigmoid~(x).

        A quantized sigmoid~(x) = k·s for sigmoid(x) in [(k - 1/2)·s, (k + 1/2)·s), so on x ≤ 0 the
        product is least at each interval's left end, x = logit((k - 1/2)·s).
        """
        gate, _ = silu
        dq = self.ctx.index.dequantize_feeding(gate)
        quantize = self._quantize_of(dq) if dq is not None else None
        if quantize is None:
            return self.table[SILU]
        scale = float(self.ctx.index.params(quantize).scale.ravel()[0])
        k = np.arange(1, math.floor(0.5 / scale + 0.5) + 1, dtype=np.float64)
        p = (k - 0.5) * scale
        return float(np.min(np.log(p / (1 - p)) * k * scale, initial=0.0))


def _read_by_its_dequantizes(ctx: CheckContext, qt: QTensor) -> bool:
    """Whether only the value's own DQs read its integers, directly: an integer Clip between Q and DQ
    (PyTorch's x86 reduced range, pt2e's weight clamp) clips at integers that mean other values on
    a moved grid."""
    return all(not via and any(consumer is dq for dq in qt.dequantizes)
               for consumer, via in ctx.index.consumers_through(qt.integer))


def _zero_point_group(ctx: CheckContext, qt: QTensor, through: Iterable[str]) -> list[QTensor]:
    """The value and every value downstream that an op in `through` makes from it with the same parameters."""
    through = set(through)
    first = ctx.index.params(qt.nodes[0])
    group, pending = [qt], [qt]
    while pending:
        value = pending.pop()
        for dq in value.dequantizes:
            for consumer, _ in ctx.index.consumers_through(dq.outputs[0]):
                if consumer.op not in through or ctx.index.dequantize_feeding(consumer.inputs[0]) is not dq:
                    continue
                follower = output_value(ctx.index, consumer)
                if follower is None or any(follower is m for m in group):
                    continue
                if first.same_values(ctx.index.params(follower.nodes[0])):
                    group.append(follower)
                    pending.append(follower)
    return group
