"""QDQ508: int8 weights whose products with some input can overflow a 16-bit pair-sum kernel.

Some integer kernels multiply unsigned 8-bit inputs by signed 8-bit weights and add each pair of
products in saturating 16-bit arithmetic before widening (x86 `pmaddubsw`: onnxruntime's u8×s8
kernels on CPUs without VNNI). Whether a pair can overflow is decided for every input the
kernel can be given, so a fixed weight can never saturate: either its output channels at risk
get a narrower grid (at worst 7 bits: 2 · 255 · 63 = 32130 fits), or it is stored as uint8,
which selects u8×u8 kernels that widen first but run slower.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from onnx import TensorProto

from qdq.graph.ops import PER_AXIS_OPSET
from qdq.quant import cpu
from qdq.quant.dtypes import type_name
from qdq.quant.index import PER_TENSOR, QParams, QTensor, resolve_constant, source_values
from qdq.quant.operands import WEIGHT_INPUT, input_value, output_channel_axis
from qdq.rewrite.requantize import set_params, why_type_is_fixed
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError

# The uint8 rewrite: int8 weights become uint8, the same grid 128 higher.
_FROM, _TO, _SHIFT = TensorProto.INT8, TensorProto.UINT8, 128
# The narrowest grid the narrowing fix needs, |w| ≤ 63: 2 · 255 · 63 = 32130 never saturates.
_SEVEN_BIT = 63
_FIXES = ("7-bit", "uint8")
# What the kernel multiplies the weights by: any uint8 (an int8 input is moved up by 128 first).
_INPUT_MAX = 255


@register
class SaturatingWeightType(Rule):
    """Int8 weights whose adjacent pair can overflow a 16-bit sum with some input should be narrowed (or uint8).

    Why: onnxruntime's u8×s8 kernels on x86 CPUs without VNNI add each pair of input × weight
    products in 16-bit arithmetic that saturates at 32767 (`pair_limit`); a saturated sum is a
    wrong output, not a rounding (a ResNet-style classifier: top-1 0.96 → 0.15). The pairs are
    weights adjacent along the reduction, in (kernel position, input channel) order with the
    input channel fastest, as onnxruntime's im2col lays them out, and along K for Gemm and a 2-D
    MatMul weight. A depthwise Conv (one input and one output channel per group) is checked only
    with `depthwise_pairs`: onnxruntime runs it on a kernel without pairs. The rule reports an output
    channel when, for some raw inputs in 0..255, a pair's sum w1 · x1 + w2 · x2 leaves the 16-bit
    range: when two adjacent weights of the same sign add up to more than 32767 // 255 = 128 in
    magnitude. Where the input's values lie does not matter: QDQ507's zero-points put the usual
    inputs near 0, but a large value can still meet two large weights.

    The fix, by parameter `weights`:
    - "7-bit" (default, x86 without VNNI): each output channel at risk gets the int8 weights
      nearest its effective weights on which no pair can saturate: on a grid
      s · 127 / k (k from 127, the grid as it is, down to 63, 7 bits, where no pair can exceed
      126), with any pair still above 128 moved onto that bound. A channel with one pair just
      over keeps its grid and moves that pair; one with many large pairs takes a coarser grid.
      Nearest counts the summed error as well as the squared one (`input_mean_ratio`): inputs
      with a mean turn a bias in the weights into an output offset.
      Channels not at risk keep their scale and weights, so a per-tensor weight becomes
      per-channel (before opset 13, which has no per-axis DQ, one grid is chosen for all). The
      Conv stays on the fast u8×s8 kernel; the channels at risk lose at most one bit
      (approximate; the change report gives the SQNR).
    - "uint8": the weight is stored as uint8 with zero-point 128: stored integers become a new
      constant w + 128 (a shared initializer is never edited in place); a float weight behind a
      Q keeps its float values and only the Q/DQ zero-point changes type. Exact,
      (w + 128 - 128) · s = w · s, but onnxruntime then runs u8×u8 kernels, 15-25 % slower
      with every Conv rewritten.
    Convs with at most `uint8_channels` input channels per group get "uint8" either way: their
    few weights per output (9 for a 3×3 kernel on a grey image) lose accuracy on a coarser grid
    (a ResNet-style classifier reading grey digits: top-1 0.96 → 0.92 with one stem channel at
    7 bits), while their kernel is too small for the slower u8×u8 path to show.

    Which CPU the model runs on is parameter `cpu`: "x86-avx2" (x86 without VNNI: the rule
    applies), "x86-vnni" (AVX512-VNNI, AVX-VNNI: u8×s8 products are summed in 32 bits) or "arm"
    (the kernels widen before adding, with the dot-product instructions or without): on the last
    two nothing saturates and the rule reports nothing. "auto" (the shipped setting) takes the CPU
    qdq runs on, from its architecture and /proc/cpuinfo flags, or the kind the environment
    variable QDQ_CPU names (for a CI runner that is not the deployment machine). The report's
    notes say which CPU was assumed and why.

    Example: `DQ(x, uint8) → Conv ← DQ(w, s=0.01, zp=0 int8)` with two adjacent weights of 127 in
    output channel 0: 255 · 254 > 32767. When channel 0 holds only large weights, the 7-bit fix
    gives it the scale 0.01 · 127/64 (127 → 64, a pair 128 · 255 = 32640 fits); when that pair
    is its only large one, 127 + 127 becomes 64 + 64 on the old grid. Other channels stay as they are.
    """

    code = "QDQ508"
    name = "saturating-weight-type"
    message = ("{op} {consumer}: int8 weight {tensor} has adjacent weights summing to {pair} in {channels} of "
               "{outputs} output channels; with an input as large as {input_max} that is {pair} · {input_max} > "
               "{pair_limit}, so the target wants {expected} weights{how}")
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    # input_mean_ratio: μ²/σ² of the inputs, weighing a channel's summed weight error against its squared
    # error (`nearest_safe_weights`); 1/(π − 1) ≈ 0.467 is that of a Relu of a zero-mean Gaussian.
    parameters = {"ops": [], "pair_limit": 32767, "weights": "7-bit", "uint8_channels": 0,
                  "input_mean_ratio": 0.467, "depthwise_pairs": True, "cpu": "x86-avx2"}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops, limit, fix = set(ctx.params["ops"]), ctx.params["pair_limit"], ctx.params["weights"]
        if fix not in _FIXES:
            raise RuleSetError(f"{self.code}.weights must be one of {', '.join(_FIXES)}, got {fix!r}")
        if not cpu.resolve(ctx.params["cpu"]).saturates:
            return
        reported: set[int] = set()
        for node in ctx.index.nodes_of(ops):
            slot = WEIGHT_INPUT.get(node.op)
            if slot is None:
                continue
            activation, weight = input_value(ctx.index, node, 0), input_value(ctx.index, node, slot)
            if activation is None or weight is None or id(weight) in reported or not _eight_bit(ctx, activation):
                continue
            params = ctx.index.params(weight.nodes[0])
            if params.dynamic or params.elem_type != _FROM:
                continue
            integers = weight_integers(ctx, weight, params)
            if integers is None:
                continue
            if not ctx.params["depthwise_pairs"] and _depthwise(node, integers) or \
                    node.op == "MatMul" and integers.ndim != 2:
                continue  # (a batched MatMul weight pairs within each [K, N] matrix: not modelled)
            axis = output_channel_axis(node, integers.ndim)
            pairs = largest_adjacent_pairs(reduction_rows(node, integers))
            at_risk = pairs * _INPUT_MAX > limit
            if not at_risk.any():
                continue
            reported.add(id(weight))
            how = "uint8" if fix == "uint8" or _few_channels(node, integers, ctx.params["uint8_channels"]) else "7-bit"
            reason = why_type_is_fixed(ctx, weight) if how == "uint8" else None
            if how == "7-bit" and np.any(params.zero_point != 0):
                reason = "its zero-point is not 0"
            elif how == "7-bit" and params.scale.size > 1 and axis != params.axis % integers.ndim:
                reason = f"its scales run along axis {params.axis}, not the output channels"
            yield self.finding(ctx, weight.nodes[0], [ctx.value_name(weight)],
                               subject=(weight, node, at_risk, axis, how),
                               fixable=reason is None, op=node.op, consumer=mention(node),
                               tensor=ctx.value_name(weight), pair=int(pairs.max()), channels=int(at_risk.sum()),
                               outputs=at_risk.size, input_max=_INPUT_MAX, pair_limit=limit,
                               expected="narrower int8" if how == "7-bit" else type_name(_TO),
                               how=f" (not rewritten: {reason})" if reason else "")

    def assumption(self, ctx: CheckContext) -> str | None:
        """The CPU the findings (or their absence) depend on, when the model has a weight the rule looks at."""
        if not any(WEIGHT_INPUT.get(node.op) is not None for node in ctx.index.nodes_of(set(ctx.params["ops"]))):
            return None
        assumed = cpu.resolve(ctx.params["cpu"])
        if assumed.saturates:
            effect = "its u8×s8 kernels add pairs of products in saturating 16 bits, so weights that can saturate are reported"
            other = 'cpu = "x86-vnni" or "arm"'
        else:
            effect = "its u8×s8 kernels do not saturate, so no weight is narrowed for them"
            other = 'cpu = "x86-avx2" (x86 without VNNI)'
        return (f"{self.code} assumed CPU kind {assumed.kind} ({assumed.why}): {effect}; for another CPU set {other} "
                f"under [rules.{self.code}] in a rules file, or {cpu.ENVIRONMENT}=<kind> where the set says \"auto\"")

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        weight, node, at_risk, axis, how = finding.subject
        params = ctx.index.params(weight.nodes[0])
        if how == "uint8":
            reason = f"int8 → uint8 weights: integers and zero-point move by {_SHIFT}"
            return set_params(ctx, weight, params.scale, self.code, reason, zero_point=params.zero_point + _SHIFT,
                              axis=params.axis, elem_type=_TO)
        integers = weight_integers(ctx, weight, params)
        most = ctx.params["pair_limit"] // _INPUT_MAX
        order = reduction_rows(node, np.arange(integers.size).reshape(integers.shape))  # flat index of each row's weights
        scale = np.broadcast_to(params.scale.astype(np.float64).ravel(), at_risk.shape).copy()
        real = integers.ravel().astype(np.float64)[order] * scale[:, None]
        chosen = integers.ravel().copy()
        if params.scale.size == 1 and ctx.model.opset < PER_AXIS_OPSET:  # one scale for every channel
            k, scale, rows, moved = nearest_safe_weights(real, float(scale[0]), most, ctx.params["input_mean_ratio"])
            chosen[order] = rows
            reason = (f"nearest int8 weights with no adjacent pair above {most} (one scale before opset 13, "
                      f"|w| ≤ {k}{_moved(moved)}): no 16-bit pair sum can saturate")
            return set_params(ctx, weight, scale, self.code, reason, integers=chosen.reshape(integers.shape))
        ranges, pairs_moved = [], 0
        for channel in np.flatnonzero(at_risk):
            k, scale[channel], row, moved = nearest_safe_weights(real[channel:channel + 1], scale[channel], most,
                                                                 ctx.params["input_mean_ratio"])
            chosen[order[channel]] = row[0]
            ranges.append(k)
            pairs_moved += moved
        reason = (f"nearest int8 weights with no adjacent pair above {most} in {len(ranges)} of {at_risk.size} "
                  f"output channels (|w| ≤ {min(ranges)}{'' if min(ranges) == max(ranges) else f' to {max(ranges)}'}"
                  f"{_moved(pairs_moved)}): no 16-bit pair sum can saturate")
        return set_params(ctx, weight, scale, self.code, reason, axis=axis, integers=chosen.reshape(integers.shape))


def _moved(pairs: int) -> str:
    return f", {pairs} pair(s) moved onto that bound" if pairs else ""


def _eight_bit(ctx: CheckContext, activation: QTensor) -> bool:
    """Whether the input is one 8-bit integer grid, what the u8×s8 kernels read."""
    params = ctx.index.params(activation.nodes[0])
    qtype = params.qtype
    return (not params.dynamic and params.granularity == PER_TENSOR and qtype is not None and not qtype.is_float
            and qtype.qmax - qtype.qmin == _INPUT_MAX)


def _depthwise(node, integers: np.ndarray) -> bool:
    """A Conv with one input and one output channel per group (a channel multiplier of 2 is not one)."""
    return node.op == "Conv" and integers.shape[1] == 1 and integers.shape[0] == node.attrs.get("group", 1)


def _few_channels(node, integers: np.ndarray, most: int) -> bool:
    """Whether a Conv reads at most `most` input channels per group."""
    return node.op == "Conv" and integers.shape[1] <= most


def nearest_safe_weights(real: np.ndarray, scale: float, most: int,
                          mean_ratio: float) -> tuple[int, np.float32, np.ndarray, int]:
    """The int8 weights nearest `real` ([rows, reduction], one scale) on which no adjacent pair sums past `most`.

    Candidates are the grids scale · 127 / k for k = 127 (the grid as it is) down to 63, where no
    pair can exceed 2 · 63 = 126. On each, the weights are rounded, and each pair still above the
    bound is moved onto it, a + b = ±most, at the integers nearest the real pair. "Nearest" is
    what an output channel's error Σ δ·x costs for inputs x of mean μ and spread σ:
    σ² Σ δ² + μ² (Σ δ)², i.e. Σ δ² + `mean_ratio` · (Σ δ)² per row with mean_ratio = μ²/σ². The
    second term matters: moved pairs all shrink, and a coarser grid's rounding errors add up to a
    bias of their own, which one-sided activations (after Relu or SiLU) turn into an output
    offset. Returns k, the new scale as stored, the integer rows and how many pairs were moved.
    """
    best = None
    for k in range(127, _SEVEN_BIT - 1, -1):
        new_scale = np.float32(scale * 127 / k)
        exact = real / np.float64(new_scale)
        rows, moved = _pairs_onto_bound(np.clip(np.rint(exact), -128, 127), exact, most)
        error = rows - exact
        cost = (float(np.sum(error ** 2)) + mean_ratio * float(np.sum(error.sum(axis=1) ** 2))) * float(new_scale) ** 2
        if best is None or cost < best[0]:
            best = (cost, k, new_scale, rows, moved)
    return best[1:]


def _pairs_onto_bound(rows: np.ndarray, exact: np.ndarray, most: int) -> tuple[np.ndarray, int]:
    """`rows` with each adjacent pair whose sum exceeds ±`most` moved onto it, as near `exact` as integers go."""
    odd = rows.shape[1] % 2
    if odd:  # the last weight pairs with nothing (a 0)
        rows, exact = (np.concatenate([a, np.zeros((a.shape[0], 1))], axis=1) for a in (rows, exact))
    first, second = rows[:, 0::2], rows[:, 1::2]  # views: writing them writes `rows`
    moved = 0
    for sign in (1, -1):
        over = sign * (first + second) > most
        if over.any():
            # On the line a + b = most (in the pair's sign), the nearest point to the real pair, rounded.
            a = np.clip(np.rint((sign * exact[:, 0::2] - sign * exact[:, 1::2] + most) / 2), most - 127, 127)
            first[over], second[over] = sign * a[over], sign * (most - a[over])
            moved += int(over.sum())
    return (rows[:, :-1] if odd else rows), moved


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
