"""QDQ204: a BatchNormalization (or constant scaling) left between a quantized conv and its output Q.

PyTorch FX QAT exports a fused ConvBn as `Conv → Div(γ/σ) → [Add(bias)] → BatchNormalization`;
other exports leave `Conv → BatchNormalization` or `Conv → Mul(c)`. Every such chain is an
affine map per output channel, `y = k·conv + d`, so it folds into the conv: `k` into the
weight (or its per-channel scales), `k·b + d` into the bias.

The check reads only per-channel constants (Div/Mul/Add operands, BN statistics, the bias) and
the weight's shape; weights are read by the fix alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from onnx import helper

from qdq.checks.reduced_range import clip_bounds
from qdq.graph import ir
from qdq.graph.names import stem
from qdq.quant.index import PER_TENSOR, ConstantSource, QParams, QTensor, clipped_integers, resolve_constant, source_values
from qdq.quant.operands import BIAS_INPUT, WEIGHT_INPUT, input_value
from qdq.quant.rounding import RoundingCost, along, quantize
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register

_CONSTANT_STEPS = ("Mul", "Div", "Add", "Sub")
_BN = "BatchNormalization"
# What decides which chains fold; in the rule set's [params], because the rules that leave the float
# edges inside those chains to QDQ204 (QDQ801, QDQ804: `folded_away`) must decide the same way.
FOLD_PARAMETERS = {"exact_rtol": 1e-6, "fold_scaling_ops": True}


@dataclass
class _Layout:
    """Where the output channels sit in a weighted op's weight and output."""

    channels: int
    rank: int  # rank of the op's output
    axis: int  # the weight axis that indexes output channels (within one group)
    groups: int  # ConvTranspose: input group i feeds output channels i·C/g … (i+1)·C/g − 1


@dataclass
class _Chain:
    """A weighted op and the foldable ops after it, composed into y = k·conv + d per output channel."""

    node: ir.Node
    steps: list[ir.Node]
    k: np.ndarray
    d: np.ndarray
    layout: _Layout
    weight: QTensor
    weight_params: QParams
    bias: np.ndarray  # the bias the op adds now (Gemm: β·C), per output channel
    bias_value: QTensor | None  # set when the bias is a stored integer behind a DQ
    input_scale: float | None  # per-tensor scale of the data input, for an integer bias

    @property
    def max_abs_k_minus_1(self) -> float:
        return float(np.max(np.abs(self.k - 1)))


@register
class UnfoldedBatchNorm(Rule):
    """A BatchNormalization (or a constant Div/Mul/Add) between a quantized conv and its output Q.

    Why: runtimes fuse a quantized Conv/ConvTranspose/Gemm with the Q that reads its output, so
    the op writes integers. An op in between breaks that: onnxruntime keeps the conv in float
    (2 of 37 convs fused in an FX QAT detector until the fold), TensorRT keeps a float BN in the
    QAT engine, and the AMD NPU reads the conv's output position from a Q it cannot find. PyTorch
    FX QAT leaves exactly this for every ConvBn: `Conv → Div(γ/σ) → [Add(bias)] →
    BatchNormalization (→ Relu) → Q`.

    The chain is an affine map per output channel, `y = k·conv + d`. The fix folds it:

    - `k` within `exact_rtol` of 1 (FX QAT in eval mode: |k − 1| ≤ 1.2e-7): the weight stays;
    - `k` constant within each weight scale's slice (per-channel weights, or one scalar Mul):
      the scales are multiplied by |k|, the integers stay (mirrored around the zero-point
      where k < 0; a value that then falls off the grid saturates and is reported);
    - otherwise the weight is re-quantized at the scale that covers `k·W` (round half to even),
      reporting saturated values, values rounded to zero and the SQNR.

    The bias becomes `k·b + d`: a new float constant, or for an integer bias new integers at
    input scale × new weight scale. The conv then writes the chain's output tensor, so graph
    output names stay. Each change reports `exact` (no weight or bias value moved to another
    grid point: outputs change by float32 rounding only) and `max_abs_k_minus_1`.

    Parameters: `ops` (the weighted ops; Conv, ConvTranspose and Gemm are supported),
    `exact_rtol`, and `fold_scaling_ops` (default true): also fold chains of constant
    Div/Mul/Add/Sub that have no BatchNormalization, which block fusion just the same; with
    false only chains that end in a BatchNormalization are reported. The last two sit in the
    rule set's [params]: QDQ801 and QDQ804 read them to leave the float edges inside a chain
    this fix removes to this rule (folding, not a new Q/DQ, is what lets the conv fuse).

    Example: `DQ(x), DQ(W) → Conv → Div(c) → BatchNormalization → Relu → Q` with k ≡ 1 becomes
    `DQ(x), DQ(W) → Conv(bias = β − γ·μ/σ) → Relu → Q`.
    """

    code = "QDQ204"
    name = "unfolded-batchnorm"
    message = "{node}: {chain} after the quantized {op} blocks its fusion with the output Q{note}"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"ops": ["Conv", "ConvTranspose", "Gemm"], **FOLD_PARAMETERS}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops = set(ctx.params["ops"])
        for node in list(ctx.graph.nodes):
            if node.op not in ops:
                continue
            chain = _find_chain(ctx, node)
            if chain is None:
                continue
            problem = _unfixable(ctx, chain)
            yield self.finding(
                ctx, node, [node.outputs[0], chain.steps[-1].outputs[0]], subject=chain, fixable=problem is None,
                op=node.op, chain=" → ".join(step.op for step in chain.steps),
                note=f" (not fixable: {problem})" if problem else "",
                max_abs_k_minus_1=chain.max_abs_k_minus_1,
            )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        chain: _Chain = finding.subject
        node = chain.node
        values: dict = {"max_abs_k_minus_1": chain.max_abs_k_minus_1}
        if chain.max_abs_k_minus_1 <= ctx.params["exact_rtol"]:
            values["weight"] = "kept"
            new_scale = chain.weight_params.scale
        else:
            new_scale, weight_values = _fold_weight(ctx, chain)
            values.update(weight_values)
        values.update(_fold_bias(ctx, chain, new_scale))
        values["exact"] = (
            values["weight"] != "re-quantized" and not values.get("saturated") and chain.bias_value is None
        )
        old = " + ".join([node.op] + [step.op for step in chain.steps])
        out, shown = chain.steps[-1].outputs[0], mention(node)  # shown as the finding showed it, before rewiring
        for step in chain.steps:
            ctx.edits.detach(step)
        ctx.edits.set_output(node, 0, out)
        return [Change(self.code, shown, out.name, old, node.op, _sentence(chain, values), values)]


def folded_away(ctx: CheckContext) -> set[int]:
    """The float tensors QDQ204's fix takes out of the graph, by id: the output of every weighted op
    with a chain it can fold, and the output of every step of that chain but the last.

    Reads `fold_scaling_ops` and `exact_rtol` from the asking rule's parameters (shared [params]).
    """
    gone: set[int] = set()
    for node in ctx.graph.nodes:
        chain = _find_chain(ctx, node)
        if chain is not None and _unfixable(ctx, chain) is None:
            gone.update(id(tensor) for tensor in [node.outputs[0], *(step.outputs[0] for step in chain.steps[:-1])])
    return gone


# --- finding the chain ---------------------------------------------------------------------------------


def _find_chain(ctx: CheckContext, node: ir.Node) -> _Chain | None:
    """The foldable ops after a weighted op with a quantized constant weight, composed per channel."""
    index = ctx.index
    if node.op not in WEIGHT_INPUT or node.op not in BIAS_INPUT:
        return None
    weight = input_value(index, node, WEIGHT_INPUT[node.op])
    shape = _weight_shape(weight) if weight is not None else None
    layout = _layout(node, shape) if shape is not None else None
    if layout is None or not node.outputs:
        return None
    found: list[tuple[ir.Node, np.ndarray, np.ndarray]] = []
    tensor = node.outputs[0]
    while len(tensor.outputs) == 1 and not index.is_graph_output(tensor) and tensor.outputs[0].outputs:
        step = tensor.outputs[0]
        affine = _affine(ctx, step, tensor, layout)
        if affine is None:
            break
        found.append((step, *affine))
        tensor = step.outputs[0]
    if not ctx.params["fold_scaling_ops"]:
        while found and found[-1][0].op != _BN:
            found.pop()
    if not found:
        return None
    k, d = np.ones(layout.channels), np.zeros(layout.channels)
    for _, scale, shift in found:
        k, d = k * scale, d * scale + shift
    steps = [step for step, _, _ in found]
    dq = index.dequantize_feeding(node.inputs[WEIGHT_INPUT[node.op]])
    data = input_value(index, node, 0)
    data_params = index.params(data.nodes[0]) if data is not None else None
    input_scale = None
    if data_params is not None and not data_params.dynamic and data_params.granularity == PER_TENSOR:
        input_scale = float(data_params.scale.ravel()[0])
    bias, bias_value = _bias(ctx, node, layout)
    return _Chain(node, steps, k, d, layout, weight, index.params(dq), bias, bias_value, input_scale)


def _affine(
    ctx: CheckContext, step: ir.Node, tensor: ir.Tensor, layout: _Layout
) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel when `step` maps `tensor` as y = scale·x + shift, else None."""
    ones, zeros = np.ones(layout.channels), np.zeros(layout.channels)
    if step.op == _BN:
        if len(step.outputs) != 1 or step.attrs.get("training_mode", 0) or step.inputs[0] is not tensor:
            return None
        params = [_constant(ctx, t) for t in step.inputs[1:5]]
        if len(params) != 4 or any(p is None or p.shape != (layout.channels,) for p in params):
            return None
        gamma, beta, mean, var = params
        denominator = var + float(step.attrs.get("epsilon", 1e-5))
        if np.any(denominator <= 0):
            return None
        g = gamma / np.sqrt(denominator)
        return g, beta - g * mean
    if step.op not in _CONSTANT_STEPS or len(step.inputs) != 2 or sum(t is tensor for t in step.inputs) != 1:
        return None
    other = step.inputs[1] if step.inputs[0] is tensor else step.inputs[0]
    if step.op in ("Div", "Sub") and step.inputs[0] is not tensor:
        return None  # c / x and c − x are not linear in x the same way
    values = _constant(ctx, other)
    c = _per_channel(values, layout) if values is not None else None
    if c is None or not np.all(np.isfinite(c)):
        return None
    if step.op == "Mul":
        return c, zeros
    if step.op == "Div":
        return (1 / c, zeros) if np.all(c != 0) else None
    return ones, (c if step.op == "Add" else -c)


def _constant(ctx: CheckContext, tensor: ir.Tensor | None) -> np.ndarray | None:
    source = resolve_constant(tensor) if tensor is not None and tensor.name else None
    if source is None:
        return None
    values = source_values(ctx.model, source)
    return values.astype(np.float64) if np.issubdtype(values.dtype, np.floating) else None


def _per_channel(values: np.ndarray, layout: _Layout) -> np.ndarray | None:
    """A constant that broadcasts over the output varying only along the channel axis, as one value per channel."""
    if values.ndim > layout.rank:
        return None
    shape = (1,) * (layout.rank - values.ndim) + values.shape
    if any(size != 1 for axis, size in enumerate(shape) if axis != 1) or shape[1] not in (1, layout.channels):
        return None
    return np.broadcast_to(values.reshape(-1), (layout.channels,)).astype(np.float64)


def _weight_shape(weight: QTensor) -> tuple[int, ...] | None:
    source = _weight_source(weight)
    return tuple(source.constant.shape) if source is not None else None


def _weight_source(weight: QTensor) -> ConstantSource | None:
    """The constant holding the weight: its stored integers (also behind integer Clips, as Brevitas
    stores them), or the float values a Q quantizes."""
    if weight.quantize is None:
        return resolve_constant(clipped_integers(weight.integer)[1])
    if weight.quantize is not None and weight.quantize.inputs:
        return resolve_constant(weight.quantize.inputs[0])
    return None


def _layout(node: ir.Node, shape: tuple[int, ...]) -> _Layout | None:
    if node.op == "Conv" and len(shape) >= 3:
        return _Layout(shape[0], len(shape), 0, 1)
    if node.op == "ConvTranspose" and len(shape) >= 3:
        groups = int(node.attrs.get("group", 1))
        return _Layout(shape[1] * groups, len(shape), 1, groups)
    if node.op == "Gemm" and len(shape) == 2:
        return _Layout(shape[0], 2, 0, 1) if node.attrs.get("transB", 0) else _Layout(shape[1], 2, 1, 1)
    return None


def _bias(ctx: CheckContext, node: ir.Node, layout: _Layout) -> tuple[np.ndarray | None, QTensor | None]:
    """The bias the op adds per output channel (None when it is computed), and its integer value if stored."""
    slot = BIAS_INPUT[node.op]
    beta = float(node.attrs.get("beta", 1.0)) if node.op == "Gemm" else 1.0
    if slot >= len(node.inputs) or not node.inputs[slot].name:
        return np.zeros(layout.channels), None
    value = input_value(ctx.index, node, slot)
    if value is None:
        constant = _constant(ctx, node.inputs[slot])
        per_channel = _bias_per_channel(constant, node, layout) if constant is not None else None
        return (beta * per_channel if per_channel is not None else None), None
    params = ctx.index.params(value.nodes[-1])
    source = resolve_constant(value.integer) if value.stored else None
    if source is None or params.dynamic or params.block_size:
        return None, None
    ints = source_values(ctx.model, source).astype(np.float64)
    real = (ints - along(params.zero_point, ints.ndim, params.axis)) * along(params.scale, ints.ndim, params.axis)
    per_channel = _bias_per_channel(real, node, layout)
    return (beta * per_channel if per_channel is not None else None), value


def _bias_per_channel(values: np.ndarray, node: ir.Node, layout: _Layout) -> np.ndarray | None:
    """A conv bias is one value per output channel; Gemm's C broadcasts over the output like any operand."""
    if node.op == "Gemm":
        return _per_channel(values, layout)
    return values.astype(np.float64) if values.shape == (layout.channels,) else None


def _unfixable(ctx: CheckContext, chain: _Chain) -> str | None:
    """Why the fix cannot fold this chain, or None."""
    if chain.bias is None:
        return "the bias is not a per-channel constant"
    if chain.bias_value is not None:
        if chain.weight_params.dynamic:
            return "the integer bias needs a constant weight scale"
        if chain.input_scale is None:
            return "the integer bias needs a per-tensor input scale"
        if _scale_per_channel(chain.layout, chain.weight_params) is None:
            return "the integer bias needs weight scales per output channel or per tensor"
    if chain.max_abs_k_minus_1 <= ctx.params["exact_rtol"]:
        return None
    params = chain.weight_params
    if not np.all(np.isfinite(chain.k)) or np.any(chain.k == 0):
        return "a channel's factor is zero or not finite"
    if params.dynamic or params.block_size or params.qtype is None or params.qtype.is_float:
        return "the weight's quantization cannot be rescaled (dynamic, blocked or float8)"
    if any(None in clip_bounds(ctx, clip) for clip in clipped_integers(chain.weight.integer)[0]):
        return "the weight's Clip bounds are computed at run time"
    readers = {id(c) for dq in chain.weight.dequantizes for c, _ in ctx.index.consumers_through(dq.outputs[0])}
    if readers != {id(chain.node)}:
        return "the weight is shared with other ops"
    return None


# --- the fix ---------------------------------------------------------------------------------------------


def _fold_weight(ctx: FixContext, chain: _Chain) -> tuple[np.ndarray, dict]:
    """Give the weight the factor k: multiply its scales, or re-quantize it; returns the new scale."""
    params, weight = chain.weight_params, chain.weight
    source = _weight_source(weight)
    values = source_values(ctx.model, source)
    stored = weight.quantize is None
    for clip in clipped_integers(weight.integer)[0] if stored else []:  # the new integers replace the Clips
        values = np.clip(values, *clip_bounds(ctx, clip)).astype(values.dtype)
    shape = values.shape
    axis = None if params.scale.size == 1 else params.axis % len(shape)
    scale, zero_point = along(params.scale, len(shape), axis), along(params.zero_point, len(shape), axis)
    qmin, qmax = params.qtype.qmin, params.qtype.qmax
    old_ints = values.astype(np.float64) if stored else quantize(values, scale, zero_point, qmin, qmax)[0]
    factor = np.broadcast_to(_over_weight(chain.layout, chain.k, shape), shape)
    ideal = factor * (old_ints - zero_point) * scale
    by_slice = _slices(factor, axis)
    if np.all(by_slice == by_slice[:, :1]):
        new_scale, mode = params.scale * np.abs(by_slice[:, 0]).reshape(params.scale.shape), "scales multiplied"
    else:
        new_scale, mode = _covering_scale(ideal, axis, params).reshape(params.scale.shape), "re-quantized"
    scale_b = along(new_scale, len(shape), axis)
    name = ctx.value_name(weight)
    if stored:
        new_ints, unclipped = quantize(ideal, scale_b, zero_point, qmin, qmax)
        new_name = ctx.new_name(f"{name}_folded", replacing=weight.integer.name)
        ints = ctx.model.new_constant(new_name, new_ints.astype(values.dtype))
        for dq in weight.dequantizes:
            ctx.edits.set_input(dq, 0, ints)
    else:
        folded = (factor * values.astype(np.float64)).astype(values.dtype)
        new_ints, unclipped = quantize(folded, scale_b, zero_point, qmin, qmax)
        ctx.edits.set_input(weight.quantize, 0, ctx.model.new_constant(ctx.new_name(f"{name}_folded"), folded))
    scale_type = _np_type(params.scale_source.elem_type)
    scale_constant = ir.Constant(ctx.new_name(f"{name}_scale"), np.asarray(new_scale, scale_type))
    for q_or_dq in weight.nodes:
        ctx.edits.set_input(q_or_dq, 1, scale_constant)
    cost = RoundingCost.of(ideal, new_ints, unclipped, scale_b, zero_point).values()
    return new_scale, {"weight": mode, **cost}


def _fold_bias(ctx: FixContext, chain: _Chain, weight_scale: np.ndarray) -> dict:
    """Write k·b + d as the op's bias: a float constant, or integers at input × weight scale."""
    node, params = chain.node, chain.weight_params
    real = chain.k * chain.bias + chain.d
    slot = BIAS_INPUT[node.op]
    name = ctx.new_name(f"{stem(node)}_folded_bias")
    values: dict = {}
    if chain.bias_value is None:
        float_type = _np_type(params.scale_source.elem_type) if params.scale_source is not None else np.float32
        bias: ir.Tensor = ir.Constant(name, real.astype(float_type))
    else:
        bias_params = ctx.index.params(chain.bias_value.nodes[-1])
        per_channel = _scale_per_channel(chain.layout, params, weight_scale)
        scale = (np.float32(chain.input_scale) * per_channel.astype(np.float32)).astype(np.float64)
        scale = scale.reshape(()) if scale.size == 1 else scale
        zero_point = np.zeros_like(scale)
        ints, unclipped = quantize(real, scale, zero_point, bias_params.qtype.qmin, bias_params.qtype.qmax)
        values["bias_saturated"] = int(np.count_nonzero(ints != unclipped))
        int_type, float_type = _np_type(bias_params.elem_type), _np_type(bias_params.scale_source.elem_type)
        inputs = [
            ir.Constant(ctx.new_name(f"{name}_quantized"), ints.astype(int_type)),
            ir.Constant(ctx.new_name(f"{name}_scale"), np.asarray(scale, float_type)),
        ]
        if bias_params.zero_point_input is not None:
            inputs.append(ir.Constant(ctx.new_name(f"{name}_zero_point"), np.zeros(scale.shape, int_type)))
        bias = ir.Variable(name, dtype=float_type, shape=[chain.layout.channels])
        attrs = {"axis": 0} if scale.size > 1 else {}
        ctx.edits.add_node(
            ir.Node("DequantizeLinear", name=ctx.new_name(f"{name}_dq"), attrs=attrs, inputs=inputs, outputs=[bias])
        )
    ctx.edits.set_input(node, slot, bias)
    if node.op == "Gemm":
        ctx.edits.set_attr(node, "beta", 1.0)  # the old β is in `chain.bias` already
    return values


def _scale_per_channel(layout: _Layout, params: QParams, scale: np.ndarray | None = None) -> np.ndarray | None:
    """The weight scale of each output channel (one value when per-tensor), or None if not along them."""
    scale = (params.scale if scale is None else scale).ravel()
    if scale.size == 1:
        return scale
    if params.axis % layout.rank != layout.axis:
        return None
    return np.tile(scale, layout.groups)  # ConvTranspose: weight column j serves channels j, j + C/g, …


def _over_weight(layout: _Layout, k: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The per-output-channel factor laid out to broadcast over the weight."""
    if layout.groups > 1:  # ConvTranspose [C_in, C/g, …]: row block i feeds output channels i·C/g + j
        blocks = np.repeat(k.reshape(layout.groups, -1), shape[0] // layout.groups, axis=0)
        return blocks.reshape(blocks.shape + (1,) * (len(shape) - 2))
    view = [1] * len(shape)
    view[layout.axis] = layout.channels
    return k.reshape(view)


def _slices(values: np.ndarray, axis: int | None) -> np.ndarray:
    """Rows of a weight-shaped array, one row per scale (a single row when per-tensor)."""
    if axis is None:
        return values.reshape(1, -1)
    return np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)


def _covering_scale(ideal: np.ndarray, axis: int | None, params: QParams) -> np.ndarray:
    """Per slice, the smallest scale whose grid (around the old zero-point) holds every value."""
    qtype = params.qtype
    zero_point = np.broadcast_to(params.zero_point.ravel(), (params.scale.size,))
    rows = _slices(ideal, axis)
    scales = params.scale.ravel().astype(np.float64).copy()
    for i, row in enumerate(rows):
        above, below = qtype.qmax - zero_point[i], zero_point[i] - qtype.qmin
        needed = [row.max() / above if above > 0 else 0.0, -row.min() / below if below > 0 else 0.0]
        if max(needed) > 0:
            scales[i] = max(needed)
    return scales


def _np_type(onnx_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def _sentence(chain: _Chain, values: dict) -> str:
    k_note = f"max |k − 1| {values['max_abs_k_minus_1']:.3g}"
    text = f"folded into the {chain.node.op} (weight {values['weight']}, {k_note})"
    notes = []
    if values.get("saturated"):
        notes.append(f"{values['saturated']} weight value(s) saturate")
    if values.get("rounded_to_zero"):
        notes.append(f"{values['rounded_to_zero']} weight value(s) round to zero")
    if values["weight"] == "re-quantized" and "sqnr_db" in values:
        notes.append(f"weight SQNR {values['sqnr_db']} dB")
    if values.get("bias_saturated"):
        notes.append(f"{values['bias_saturated']} bias value(s) saturate")
    return text + (f"; {'; '.join(notes)}" if notes else "")
