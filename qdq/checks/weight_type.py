"""QDQ508: int8 weights whose products with the input can overflow a 16-bit pair-sum kernel.

Some integer kernels multiply unsigned 8-bit inputs by signed 8-bit weights and add each pair of
products in saturating 16-bit arithmetic before widening (x86 `pmaddubsw`: onnxruntime's u8×s8
kernels on CPUs without VNNI). Storing the weight as uint8 instead (integers and zero-point
+ 128, an exact rewrite) selects u8×u8 kernels, which widen first but run slower, so the rule
set bounds where the rewrite is worth it: the input's zero-point and the weights decide.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from onnx import TensorProto

from qdq.dtypes import type_name
from qdq.operands import WEIGHT_INPUT, input_value
from qdq.quant_index import PER_TENSOR, QParams, QTensor, resolve_constant, source_values
from qdq.requantize import set_params, why_type_is_fixed
from qdq.rule import Change, CheckContext, Finding, FixSafety, Rule, Severity, register

# The rewrite: int8 weights become uint8, the same grid 128 higher.
_FROM, _TO, _SHIFT = TensorProto.INT8, TensorProto.UINT8, 128


@register
class SaturatingWeightType(Rule):
    """Int8 weights that can overflow a 16-bit pair sum with their input should be stored as uint8.

    Why: onnxruntime's u8×s8 kernels on x86 CPUs without VNNI add each pair of input × weight
    products in 16-bit arithmetic that saturates at 32767 (`pair_limit`). The pairs are weights
    adjacent along the reduction, in (kernel position, input channel) order with the input
    channel fastest. The raw uint8 inputs are large when the input's zero-point is: a symmetric
    input (zero-point 128 after QDQ505) puts every real 0 at 128. The rule reports a weight when
    its largest same-signed adjacent pair, times the input's zero-point (in steps above the type
    minimum) plus `headroom` steps, exceeds `pair_limit`. Measured on a ResNet-style digits
    classifier, the stem Conv (pair 256 at zero-point 128) alone took top-1 from 0.96 to 0.15
    with graph optimizations on. With uint8 weights onnxruntime runs u8×u8 kernels, which do not
    saturate but are slower (15-25 % with every Conv rewritten), hence the bound; inputs after a
    Relu (zero-point 0) stay on the fast kernel. CPUs with VNNI, and ARM, do not saturate:
    `--ignore QDQ508` there.

    Example: `DQ(x, s=0.02, zp=128 uint8) → Conv ← DQ(w, s=0.01, zp=0 int8)` with two adjacent
    weights of 127: 254 · (128 + 20) > 32767. The fix stores the weight as uint8 with zero-point
    128: stored integers become a new constant w + 128 (a shared initializer is never edited in
    place); a float weight behind a Q keeps its float values and only the Q/DQ zero-point
    changes type. Per-channel weights keep their scales. Exact: (w + 128 - 128) · s = w · s.
    """

    code = "QDQ508"
    name = "saturating-weight-type"
    message = ("{op} {consumer}: int8 weight {tensor} has adjacent weights summing to {pair}; with input {input} "
               "at zero-point {zero_point} that is {pair} · ({offset} + {headroom}) > {pair_limit}, so the target "
               "wants {expected} weights{how}")
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT
    edits_graph = False
    parameters = {"ops": [], "pair_limit": 32767, "headroom": 0}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops, limit, headroom = set(ctx.params["ops"]), ctx.params["pair_limit"], ctx.params["headroom"]
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
            integers = _weight_integers(ctx, weight, params)
            if integers is None:
                continue
            pair = _largest_adjacent_pair(_reduction_rows(node, integers))
            if pair * (offset + headroom) <= limit:
                continue
            reported.add(id(weight))
            reason = why_type_is_fixed(ctx, weight)
            zero_point = ctx.index.params(activation.nodes[0]).zero_point.ravel()[0]
            yield self.finding(ctx, weight.nodes[0], [ctx.value_name(weight)], subject=weight,
                               fixable=reason is None, op=node.op, consumer=node.name,
                               tensor=ctx.value_name(weight), input=ctx.value_name(activation), pair=pair,
                               zero_point=int(zero_point), offset=offset, headroom=headroom, pair_limit=limit,
                               expected=type_name(_TO), how=f" (not rewritten: {reason})" if reason else "")

    def fix(self, ctx: CheckContext, finding: Finding) -> list[Change]:
        weight = finding.subject
        params = ctx.index.params(weight.nodes[0])
        reason = f"int8 → uint8 weights: integers and zero-point move by {_SHIFT}"
        return set_params(ctx, weight, params.scale, self.code, reason, zero_point=params.zero_point + _SHIFT,
                          axis=params.axis, elem_type=_TO)


def _zero_point_offset(ctx: CheckContext, activation: QTensor) -> int | None:
    """How many steps a per-tensor integer input's zero-point sits above its type's minimum."""
    params = ctx.index.params(activation.nodes[0])
    qtype = params.qtype
    if params.dynamic or params.granularity != PER_TENSOR or qtype is None or qtype.is_float:
        return None
    return int(params.zero_point.ravel()[0] - qtype.qmin)


def _weight_integers(ctx: CheckContext, weight: QTensor, params: QParams) -> np.ndarray | None:
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


def _reduction_rows(node, integers: np.ndarray) -> np.ndarray:
    """The weights as [outputs, reduction], the reduction in (kernel position, input channel) order."""
    if node.op == "Conv":  # [M, C/g, k...] → [M, k..., C/g]
        return np.moveaxis(integers, 1, -1).reshape(integers.shape[0], -1)
    if node.op == "Gemm" and not node.attrs.get("transB", 0) or node.op == "MatMul":  # [K, N]
        return integers.reshape(-1, integers.shape[-1]).T
    return integers.reshape(integers.shape[0], -1)  # Gemm with transB: [N, K]


def _largest_adjacent_pair(rows: np.ndarray) -> int:
    """The largest magnitude of two same-signed weights that sit side by side in a row's reduction."""
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), rows.dtype)], axis=1)
    first, second = rows[:, 0::2], rows[:, 1::2]
    positive = np.maximum(first, 0) + np.maximum(second, 0)
    negative = np.minimum(first, 0) + np.minimum(second, 0)
    return int(max(positive.max(initial=0), -negative.min(initial=0)))
