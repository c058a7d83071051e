"""QDQ510: cross-layer equalization of Conv chains, for targets with one weight scale per tensor.

The rule finds chains Conv → (Q/DQ, an activation that commutes with a positive per-channel
factor) → Conv, computes the factors from the weights (`qdq.quant.equalize`), and changes a chain
only where the estimated error of its per-tensor grids comes down. Its fix writes the weights
straight onto their power-of-two per-tensor grids (so QDQ502 and QDQ504 leave them), divides
the biases, and moves the activation grids between the convolutions by the factor their
largest channel moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from qdq.graph import ir
from qdq.quant import equalize, pow2
from qdq.quant.index import QUANTIZE, QTensor, resolve_constant, source_values
from qdq.quant.operands import BIAS_INPUT, input_value
from qdq.quant.rounding import RoundingCost
from qdq.rewrite.bias_correction import conv_bias, input_means, shift
from qdq.rewrite.insertion import float_type
from qdq.rewrite.requantize import effective_values, set_params, why_grid_is_fixed
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register


@dataclass
class Conv:
    """A conv whose weights (and bias) QDQ510 and QDQ511 may rewrite."""

    node: ir.Node
    weight: QTensor
    values: np.ndarray  # the weights as the model computes them
    bias: np.ndarray | None
    group: int


@dataclass
class _Link:
    """The graph between two convolutions: the activation values on the way, the last one read by B, and
    whether an activation or a Q at its type's minimum (a folded Relu) rectifies them."""

    values: list[QTensor]
    last: QTensor
    rectified: bool


@dataclass
class _Plan:
    convs: list[Conv]
    links: list[_Link]
    models: list[equalize.Link]
    factors: list[np.ndarray]
    before: float
    after: float


@register
class CrossLayerEqualization(Rule):
    """Conv chains whose per-tensor weight grids lose less when their channels are equalized.

    Why: a target with one power-of-two scale per weight tensor (the AMD NPU) rounds the small
    output channels of a convolution whose channel ranges differ a hundredfold (depthwise
    convolutions after BatchNorm folding) to a few steps or to zero. Between two convolutions
    A → B through Relu, LeakyRelu, PRelu, a Clip without an upper bound, or nothing, dividing
    A's output channel i by s_i and multiplying B's input channel i by s_i computes the same
    function (Nagel et al. 2019); s_i = sqrt(range_A,i / range_B,i) gives both the same range.
    A Clip with an upper bound (Relu6) is not passed: its one bound would have to become 6/s_i,
    a different bound per channel. Hard-swish and SiLU are not passed either: they do not
    commute with a factor (docs/equalization.md).

    Example: `Conv(dw, 32 channels, ranges 0.02…3.1) → Relu → Q → DQ → Conv(1×1)`. The fix
    divides the depthwise channels by factors in [0.1, 9], multiplies the 1×1 weights' inputs
    by them, writes both on their per-tensor power-of-two grids and moves the activation grid
    between them; only where the chain's estimated output error (weights and activation
    rounding, `qdq.quant.equalize.objective`) falls by at least `min_gain`. Approximate: exact in
    float, the change report gives each weight's SQNR in the input's units. With QDQ511 on, the
    biases are corrected for these weights' rounding here (QDQ511 sees them already rounded).
    """

    code = "QDQ510"
    name = "cross-layer-equalization"
    message = ("{first} → … {last} ({count} convolutions): equalizing their channels lowers the estimated error "
               "of the per-tensor grids from {before:.3g} to {after:.3g}")
    severity = Severity.INFO
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"through": ["Relu", "LeakyRelu", "PRelu", "Clip"], "iterations": 20, "max_factor": 256.0,
                  "min_gain": 0.1, "bias_data_free": False}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for chain in _chains(ctx):
            plan = _plan(ctx, *chain)
            if plan is None or plan.after > plan.before * (1 - ctx.params["min_gain"]):
                continue
            nodes = [c.node for c in plan.convs]
            yield self.finding(ctx, nodes[0], [ctx.value_name(c.weight) for c in plan.convs], subject=plan,
                               first=mention(nodes[0]), last=mention(nodes[-1]), count=len(nodes),
                               before=plan.before, after=plan.after)

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        plan: _Plan = finding.subject
        convs, factors = plan.convs, plan.factors
        groups = [c.group for c in convs]
        weights = [c.values for c in convs]
        equalized = equalize.scaled(weights, groups, factors)
        moves = [m.grid_move(s) for m, s in zip(plan.models, factors)]
        summary = (f"chain {mention(convs[0].node)} → … {mention(convs[-1].node)} equalized "
                   f"(estimated error {plan.before:.3g} → {plan.after:.3g})")
        changes: list[Change] = []
        for k, conv in enumerate(convs):
            integers, step = equalize.pow2_grid(equalized[k])
            reason = f"{summary}: channel factors {_span(factors, k)}, per-tensor power-of-two weights"
            made = set_params(ctx, conv.weight, step, self.code, reason, zero_point=0.0,
                              integers=integers.astype(np.int8))
            for change in made:
                change.values = _cost_in_input_units(conv.values, _back(integers * step, groups, factors, k))
                plain, plain_step = equalize.pow2_grid(conv.values)
                change.description = _sentence(reason, change.values,
                                               _cost_in_input_units(conv.values, plain * plain_step))
            changes += made
            bias = _bias_after(conv, factors, k)
            correction = None
            if "QDQ511" in ctx.enabled:  # bias correction is on: the rounding of these weights is known here only
                found = input_means(ctx, conv.node, ctx.params["bias_data_free"])
                if found is not None and found[0].size == conv.values.shape[1] * conv.group:
                    means = found[0] / factors[k - 1] if k > 0 else found[0]
                    correction = shift(equalized[k], integers * step, conv.group, means)
                    bias = (bias if bias is not None else np.zeros(correction.size)) - correction
            if bias is not None and (k < len(factors) or correction is not None):
                changes.append(write_bias(ctx, conv.node, bias, self.code, summary, correction))
        for link, move in zip(plan.links, moves):
            for value in link.values:
                old = ctx.index.params(value.nodes[0]).scale
                changes += set_params(ctx, value, old * move, self.code,
                                      f"{summary}: the activation grid follows its largest channel (× {move:.3g})")
        return changes


def _chains(ctx: CheckContext) -> Iterable[tuple[list[Conv], list[_Link]]]:
    """Maximal chains of convolutions joined by links the factors pass through, in graph order."""
    convs = {id(n): n for n in ctx.index.nodes_of(["Conv"])}
    following: dict[int, tuple[ir.Node, _Link]] = {}
    for node in convs.values():
        found = _link_after(ctx, node)
        if found is not None and id(found[0]) in convs:
            following[id(node)] = found
    led = {id(b) for b, _ in following.values()}
    for node in convs.values():
        if id(node) not in following or id(node) in led:
            continue
        chain, links = [node], []
        while id(chain[-1]) in following:
            nxt, link = following[id(chain[-1])]
            chain.append(nxt)
            links.append(link)
        if all(on_target_grid(ctx, n) for n in chain):
            continue  # on the target's grids already: the input's rounding cannot be undone
        read = [read_conv(ctx, n) for n in chain]
        # A conv that cannot be read ends the chain there; the pieces around it are chains of their own.
        start = 0
        for k in range(len(read) + 1):
            if k == len(read) or read[k] is None:
                if k - start >= 2:
                    yield read[start:k], links[start:k - 1]
                start = k + 1


def _link_after(ctx: CheckContext, conv: ir.Node) -> tuple[ir.Node, _Link] | None:
    """The conv that alone reads this conv's output through Q/DQ pairs and passed activations, and the
    values between."""
    through = set(ctx.params["through"])
    tensor, values, rectified = conv.outputs[0] if conv.outputs else None, [], False
    while tensor is not None:
        if ctx.index.is_graph_output(tensor) or len(tensor.outputs) != 1:
            return None
        reader = tensor.outputs[0]
        if reader.op == "Conv":
            return (reader, _Link(values, values[-1], rectified)) if values and reader.inputs[0] is tensor else None
        if reader.op == QUANTIZE:
            value = ctx.index.qtensor_of(reader)
            if value is None or value.quantize is not reader or len(value.dequantizes) != 1 \
                    or why_grid_is_fixed(ctx, value) is not None \
                    or ctx.index.params(reader).granularity != "per-tensor":
                return None
            params = ctx.index.params(reader)
            rectified = rectified or (params.qtype is not None and np.all(params.zero_point == params.qtype.qmin))
            values.append(value)
            tensor = value.dequantizes[0].outputs[0]
        elif reader.op in through and _commutes(ctx, reader):
            rectified = rectified or reader.op in ("Relu", "Clip")
            tensor = reader.outputs[0]
        else:
            return None
    return None


def _commutes(ctx: CheckContext, node: ir.Node) -> bool:
    """Whether f(x / s) = f(x) / s for s > 0: true of Relu, LeakyRelu, PRelu; of Clip only when its
    lower bound is 0 or absent and it has no upper bound."""
    if node.op != "Clip":
        return True
    bounds = [node.attrs.get("min"), node.attrs.get("max")]
    for slot in (1, 2):
        if slot < len(node.inputs) and node.inputs[slot].name:
            source = resolve_constant(node.inputs[slot])
            if source is None:
                return False
            bounds[slot - 1] = float(source_values(ctx.model, source).ravel()[0])
    low, high = bounds
    return high is None and (low is None or low == 0)


def on_target_grid(ctx: CheckContext, node: ir.Node) -> bool:
    """Whether a conv's weights are per tensor and power of two already: rounded before qdq saw them."""
    weight = input_value(ctx.index, node, 1)
    if weight is None:
        return False
    params = ctx.index.params(weight.nodes[0])
    return not params.dynamic and params.scale.size == 1 and pow2.all_pow2(params.scale)


def read_conv(ctx: CheckContext, node: ir.Node) -> Conv | None:
    """A conv whose int8 weights, zero-point 0, only it reads, and whose bias (if any) is constant."""
    weight = input_value(ctx.index, node, 1)
    if weight is None or len(weight.dequantizes) != 1 or weight.dequantizes[0].outputs[0].outputs != [node]:
        return None
    params = ctx.index.params(weight.nodes[0])
    if params.dynamic or params.qtype is None or params.qtype.name != "int8" or np.any(params.zero_point != 0) \
            or params.block_size or (params.scale.size > 1 and params.axis % 4 != 0):
        return None
    values = effective_values(ctx, weight)
    if values is None or values.ndim < 3 or why_grid_is_fixed(ctx, weight) is not None:
        return None
    slot = BIAS_INPUT["Conv"]
    bias = None
    if slot < len(node.inputs) and node.inputs[slot].name:
        bias = conv_bias(ctx, node)
        if bias is None:
            return None
    return Conv(node, weight, values.astype(np.float64), bias, int(node.attrs.get("group", 1)))


def _plan(ctx: CheckContext, convs: list[Conv], links: list[_Link]) -> _Plan | None:
    """Factors for a chain and the estimated error of its grids without and with them."""
    for a, b in zip(convs, convs[1:]):
        if a.values.shape[0] != b.values.shape[1] * b.group:
            return None
    models = []
    for conv, link in zip(convs, links):
        params = ctx.index.params(link.last.nodes[0])
        step, zp = float(params.scale.ravel()[0]), float(params.zero_point.ravel()[0])
        largest = max(abs((params.qtype.qmin - zp) * step), abs((params.qtype.qmax - zp) * step))
        measured = _measured_peaks(ctx, link.last, conv.values.shape[0])
        if measured is None and not link.rectified:
            return None  # the amplitude model holds for a Relu's output only (docs/equalization.md)
        amplitude = measured if measured is not None else equalize.amplitudes(conv.values, conv.bias, largest)
        models.append(equalize.Link(amplitude, step))
    weights, groups = [c.values for c in convs], [c.group for c in convs]
    factors = equalize.factors(weights, groups, ctx.params["iterations"], ctx.params["max_factor"])
    ones = [np.ones_like(s) for s in factors]
    return _Plan(convs, links, models, factors, equalize.objective(weights, groups, models, ones),
                 equalize.objective(weights, groups, models, factors))


def _measured_peaks(ctx: CheckContext, value: QTensor, channels: int) -> np.ndarray | None:
    """Each channel's largest |value| on the `--calibrate` samples, of the tensor the Q before B reads."""
    peaks = getattr(ctx.ranges, "channel_peak", None) or {}
    found = peaks.get(value.float_input.name) if value.float_input is not None else None
    return np.maximum(found, 1e-30) if found is not None and found.size == channels else None


def _back(weights: np.ndarray, groups: list[int], factors: list[np.ndarray] | None, k: int) -> np.ndarray:
    """Equalized weights of conv k in the input model's units."""
    if factors is None:
        return weights
    if k > 0:
        weights = equalize.scale_inputs(weights, groups[k], 1 / factors[k - 1])
    if k < len(factors):
        weights = equalize.scale_outputs(weights, factors[k])
    return weights


def _cost_in_input_units(ideal: np.ndarray, held: np.ndarray) -> dict:
    cost = RoundingCost(int(ideal.size), 0, int(np.count_nonzero((held == 0) & (ideal != 0))),
                        float(np.sum((ideal - held) ** 2)), float(np.sum(ideal ** 2)))
    return cost.values()


def _sentence(reason: str, cost: dict, without: dict) -> str:
    zeros = f"; {cost['rounded_to_zero']} of {cost['elements']} round to zero" if cost.get("rounded_to_zero") else ""
    return (f"{reason} (SQNR {cost.get('sqnr_db')} dB in the input's units{zeros}; "
            f"{without.get('sqnr_db')} dB without equalization)")


def _span(factors: list[np.ndarray], k: int) -> str:
    around = [factors[i] for i in (k - 1, k) if 0 <= i < len(factors)]
    values = np.concatenate(around)
    return f"{values.min():.3g}…{values.max():.3g}"


def _bias_after(conv: Conv, factors: list[np.ndarray], k: int) -> np.ndarray | None:
    """The bias of conv k divided by its output channels' factors (the last conv's keeps its channels)."""
    if conv.bias is None:
        return None
    return conv.bias / factors[k] if k < len(factors) else conv.bias


def _computed_in(node: ir.Node) -> np.dtype:
    """The float type a conv computes in (its bias must have it): the first of its data, weight and
    output whose type is known (ModelOpt's FP16 exports compute in float16)."""
    for tensor in (*node.inputs[:2], node.outputs[0]):
        if tensor.dtype is not None:
            return float_type(tensor)
    return np.dtype(np.float32)


def write_bias(ctx: FixContext, node: ir.Node, values: np.ndarray, code: str, summary: str,
               correction: np.ndarray | None, scaled: bool = True) -> Change:
    """The bias as a float constant (added when the conv had none); the target's bias rule (QDQ610 on
    the NPU) quantizes it at input × weight scale."""
    slot = BIAS_INPUT[node.op]
    old = node.inputs[slot].name if slot < len(node.inputs) and node.inputs[slot].name else f"{mention(node)}_bias"
    ctx.edits.set_input(node, slot, ctx.model.new_constant(ctx.new_name(f"{old}_corrected", replacing=old),
                                                           values.astype(_computed_in(node))))
    what = ["divided by its channels' factors"] if scaled else []
    if correction is not None:
        what.append(f"corrected for the weights' rounding (mean output shift up to {np.abs(correction).max():.3g} "
                    "removed)")
    cost = {"largest_shift": float(np.abs(correction).max())} if correction is not None else {}
    return Change(code, mention(node), old, "bias", f"{values.size} float values",
                  f"{summary}: bias {' and '.join(what)}", cost)
