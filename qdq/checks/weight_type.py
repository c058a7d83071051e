"""QDQ508: int8 weights whose products with the input can overflow a 16-bit pair-sum kernel.

Some integer kernels multiply unsigned 8-bit inputs by signed 8-bit weights and add each pair of
products in saturating 16-bit arithmetic before widening (x86 `pmaddubsw`: onnxruntime's u8×s8
kernels on CPUs without VNNI). Either the weights get smaller, 7 bits (|w| ≤ 63: 2 · 255 · 63 =
32130 can never saturate), or they are stored as uint8, which selects u8×u8 kernels that widen
first but run slower. The input's zero-point and the weights decide where either is needed.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from onnx import TensorProto

from qdq.dtypes import type_name
from qdq.errors import RuleSetError
from qdq.operands import WEIGHT_INPUT, input_value
from qdq.quant_index import PER_TENSOR, QParams, QTensor, resolve_constant, source_values
from qdq.requantize import set_params, why_type_is_fixed
from qdq.rule import Change, CheckContext, Finding, FixSafety, Rule, Severity, register

# The uint8 rewrite: int8 weights become uint8, the same grid 128 higher.
_FROM, _TO, _SHIFT = TensorProto.INT8, TensorProto.UINT8, 128
# The 7-bit rewrite: weights re-quantized to |w| ≤ 63, the scale 127/63 times coarser.
_SEVEN_BIT = 63
_FIXES = ("7-bit", "uint8")


@register
class SaturatingWeightType(Rule):
    """Int8 weights that can overflow a 16-bit pair sum with their input should become 7-bit (or uint8).

    Why: onnxruntime's u8×s8 kernels on x86 CPUs without VNNI add each pair of input × weight
    products in 16-bit arithmetic that saturates at 32767 (`pair_limit`). The pairs are weights
    adjacent along the reduction, in (kernel position, input channel) order with the input
    channel fastest. The raw uint8 inputs are large when the input's zero-point is: a symmetric
    input (zero-point 128 after QDQ505) puts every real 0 at 128. The rule reports a weight when
    its largest same-signed adjacent pair, times the input's zero-point (in steps above the type
    minimum) plus `headroom` steps, exceeds `pair_limit`. QDQ507 runs first and moves the
    zero-point of one-sided inputs (after Relu, SiLU, Sigmoid) to their bound, 0 to 9 steps above
    the minimum, so what remains is mostly the Conv reading the graph input. Measured on a
    ResNet-style digits classifier, that stem Conv (pair 256 at zero-point 128) alone took top-1
    from 0.96 to 0.15 with graph optimizations on.

    The fix, by parameter `weights`:
    - "7-bit" (default, x86 without VNNI): the output channels at risk (the whole tensor when it
      has one scale) are re-quantized from their effective weights at scale · 127/63, so
      |w| ≤ 63 and a pair sum 2 · 255 · 63 = 32130 can never saturate, whatever the input. The
      Conv stays on the fast u8×s8 kernel; those channels lose one bit (approximate; the change
      report gives the SQNR; YOLO-style network rel. L2 error 0.02774 → 0.02778).
    - "uint8": the weight is stored as uint8 with zero-point 128: stored integers become a new
      constant w + 128 (a shared initializer is never edited in place); a float weight behind a
      Q keeps its float values and only the Q/DQ zero-point changes type. Exact,
      (w + 128 - 128) · s = w · s, but onnxruntime then runs u8×u8 kernels, 15-25 % slower
      with every Conv rewritten.

    CPUs with VNNI (AVX-512 VNNI, AVX-VNNI) sum u8×s8 products in 32 bits, and ARM kernels do not
    saturate: `--ignore QDQ508` there (or `ops = []` in a rules file).

    Example: `DQ(x, s=0.02, zp=128 uint8) → Conv ← DQ(w, s=0.01, zp=0 int8)` with two adjacent
    weights of 127: 254 · (128 + 20) > 32767. The 7-bit fix gives w scale 0.01 · 127/63 and
    integers rint(w · 63/127), 127 → 63.
    """

    code = "QDQ508"
    name = "saturating-weight-type"
    message = ("{op} {consumer}: int8 weight {tensor} has adjacent weights summing to {pair}; with input {input} "
               "at zero-point {zero_point} that is {pair} · ({offset} + {headroom}) > {pair_limit}, so the target "
               "wants {expected} weights{how}")
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    edits_graph = False
    parameters = {"ops": [], "pair_limit": 32767, "headroom": 0, "weights": "7-bit"}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops, limit, headroom, fix = set(ctx.params["ops"]), ctx.params["pair_limit"], ctx.params["headroom"], \
            ctx.params["weights"]
        if fix not in _FIXES:
            raise RuleSetError(f"{self.code}.weights must be one of {', '.join(_FIXES)}, got {fix!r}")
        reported: set[int] = set()
        for node in ctx.graph.nodes:
            slot = WEIGHT_INPUT.get(node.op)
            if node.op not in ops or slot is None:
                continue
            activation, weight = input_value(ctx.index, node, 0), input_value(ctx.index, node, slot)
            if activation is None or weight is None or id(weight) in reported:
                continue
            offset = _zero_point_offset(ctx, activation)
            params = ctx.index.params(weight.nodes[0])
            if offset is None or params.dynamic or params.elem_type != _FROM:
                continue
            integers = weight_integers(ctx, weight, params)
            if integers is None:
                continue
            pairs = largest_adjacent_pairs(reduction_rows(node, integers))
            at_risk = pairs * (offset + headroom) > limit
            if not at_risk.any():
                continue
            reported.add(id(weight))
            reason = why_type_is_fixed(ctx, weight) if fix == "uint8" else None
            zero_point = ctx.index.params(activation.nodes[0]).zero_point.ravel()[0]
            yield self.finding(ctx, weight.nodes[0], [ctx.value_name(weight)], subject=(weight, at_risk),
                               fixable=reason is None, op=node.op, consumer=node.name,
                               tensor=ctx.value_name(weight), input=ctx.value_name(activation), pair=int(pairs.max()),
                               zero_point=int(zero_point), offset=offset, headroom=headroom, pair_limit=limit,
                               expected="7-bit int8" if fix == "7-bit" else type_name(_TO),
                               how=f" (not rewritten: {reason})" if reason else "")

    def fix(self, ctx: CheckContext, finding: Finding) -> list[Change]:
        weight, at_risk = finding.subject
        params = ctx.index.params(weight.nodes[0])
        if ctx.params["weights"] == "uint8":
            reason = f"int8 → uint8 weights: integers and zero-point move by {_SHIFT}"
            return set_params(ctx, weight, params.scale, self.code, reason, zero_point=params.zero_point + _SHIFT,
                              axis=params.axis, elem_type=_TO)
        channels = at_risk if params.scale.size > 1 else np.ones(params.scale.shape, bool)
        scale = np.where(channels.reshape(params.scale.shape), params.scale * (127 / _SEVEN_BIT), params.scale)
        which = "all channels" if channels.all() else f"{int(channels.sum())} of {channels.size} channels"
        reason = f"7-bit weights (|w| ≤ {_SEVEN_BIT}, {which}): no 16-bit pair sum can saturate"
        return set_params(ctx, weight, scale, self.code, reason, zero_point=params.zero_point, axis=params.axis)


def _zero_point_offset(ctx: CheckContext, activation: QTensor) -> int | None:
    """How many steps a per-tensor integer input's zero-point sits above its type's minimum."""
    params = ctx.index.params(activation.nodes[0])
    qtype = params.qtype
    if params.dynamic or params.granularity != PER_TENSOR or qtype is None or qtype.is_float:
        return None
    return int(params.zero_point.ravel()[0] - qtype.qmin)


def weight_integers(ctx: CheckContext, weight: QTensor, params: QParams) -> np.ndarray | None:
    """The int8 values the kernel multiplies: stored, or what the Q makes of a float constant."""
    if weight.stored:
        return source_values(ctx.model, resolve_constant(weight.integer)).astype(np.int64)
    if weight.quantize is None or not weight.quantize.inputs:  # integers computed in the graph
        return None
    source = resolve_constant(weight.quantize.inputs[0])
    if source is None:
        return None
    real = source_values(ctx.model, source).astype(np.float64)
    shape = [1] * real.ndim
    if params.scale.size > 1:
        shape[params.axis % real.ndim] = -1
    scale, zero_point = params.scale.reshape(shape), params.zero_point.reshape(shape)
    return np.clip(np.rint(real / scale) + zero_point, -128, 127).astype(np.int64)


def reduction_rows(node, integers: np.ndarray) -> np.ndarray:
    """The weights as [outputs, reduction], the reduction in (kernel position, input channel) order."""
    if node.op == "Conv":  # [M, C/g, k...] → [M, k..., C/g]
        return np.moveaxis(integers, 1, -1).reshape(integers.shape[0], -1)
    if node.op == "Gemm" and not node.attrs.get("transB", 0) or node.op == "MatMul":  # [K, N]
        return integers.reshape(-1, integers.shape[-1]).T
    return integers.reshape(integers.shape[0], -1)  # Gemm with transB: [N, K]


def _pairs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and second weight of each adjacent pair in each row's reduction (an odd row ends in 0)."""
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), rows.dtype)], axis=1)
    return rows[:, 0::2].astype(np.int64), rows[:, 1::2].astype(np.int64)


def largest_adjacent_pairs(rows: np.ndarray) -> np.ndarray:
    """Per row (output channel), the largest magnitude of two same-signed weights side by side in its reduction."""
    first, second = _pairs(rows)
    positive = np.maximum(first, 0) + np.maximum(second, 0)
    negative = np.minimum(first, 0) + np.minimum(second, 0)
    return np.maximum(positive.max(axis=1, initial=0), -negative.min(axis=1, initial=0))


def saturating_pairs(rows: np.ndarray, low: int, high: int, limit: int = 32767) -> int:
    """How many adjacent weight pairs can sum past the 16-bit range with raw uint8 inputs in [low, high].

    What `pmaddubsw` computes: w1 · x1 + w2 · x2, saturated to [-limit - 1, limit]; each pair's
    largest and least sum over inputs in the range.
    """
    first, second = _pairs(rows)
    largest = np.maximum(first * low, first * high) + np.maximum(second * low, second * high)
    least = np.minimum(first * low, first * high) + np.minimum(second * low, second * high)
    return int(np.count_nonzero((largest > limit) | (least < -limit - 1)))
