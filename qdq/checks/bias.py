"""Biases: QDQ606, an integer bias must be quantized at exactly input scale × weight scale;
QDQ609, a target that quantizes the bias itself (TensorRT) takes it as a float constant;
QDQ610, a target with an integer-only datapath (the NPU) needs it quantized.

Integer kernels (QLinearConv, the NPU's accumulator) add the bias to the int32 accumulator, whose
scale is `s_in · s_w`. A bias at any other scale is either rescaled at run time or, worse, added
as if it had that scale.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx

from qdq.graph import ir
from qdq.graph.names import stem
from qdq.quant.dtypes import quant_type, type_name
from qdq.quant.index import PER_TENSOR, QuantIndex, QTensor, resolve_constant, source_values
from qdq.quant.operands import BIAS_INPUT, WEIGHT_INPUT, input_value
from qdq.quant.rounding import cost_sentence
from qdq.rewrite.constant_eval import constant_ancestry, evaluate_constant
from qdq.rewrite.insertion import float_type, read_dequantized
from qdq.rewrite.requantize import describe, quantize_blocks, set_params
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register


@register
class BiasScaleMismatch(Rule):
    """An integer bias must use scale = input scale × weight scale (per output channel if the weight is).

    Why: the bias is added to the accumulator, whose scale is `s_in · s_w`. The reference NPU
    tool quantizes the int32 bias once and then moves the weight's position without touching
    the bias (defect D2), so the bias is off by a power of two. onnxruntime's QLinearConv and
    TensorRT assume the product as well.

    Example: input 2^-7, weight 2^-8 (after a shift_cut repair), bias at 2^-14: the fix sets the
    bias scale to 2^-15 and re-quantizes the int32 values with round-half-to-even (the
    reference's float-scale path truncates, defect D9); saturation is reported. Approximate:
    the bias moves by at most half a new step.
    """

    code = "QDQ606"
    name = "bias-scale-mismatch"
    message = "{node}: bias {tensor} has scale {scale}; input × weight scale is {expected}"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    # `allow_per_axis`: the roles the target may quantize per axis (QDQ502's parameter); without
    # "bias", a per-channel weight that QDQ502 could not fix leaves this finding without a fix.
    parameters = {"ops": ["Conv", "ConvTranspose", "Gemm"], "types": ["int32"], "rtol": 1e-6,
                  "allow_per_axis": ["weight", "bias"]}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            bias = _bias(ctx.index, node)  # the bias first: many ops have none, or one of other types
            params = ctx.index.params(bias.nodes[0]) if bias is not None else None
            if params is None or params.dynamic or type_name(params.elem_type) not in ctx.params["types"]:
                continue  # parameters computed at run time (convert_fx's bias zero-point) cannot be read
            expected = _accumulator_scale(ctx.index, node)
            if expected is None:
                continue
            actual = params.scale.ravel()
            if actual.size in (1, expected.size) and np.allclose(actual, expected, rtol=ctx.params["rtol"], atol=0):
                continue
            name = ctx.value_name(bias)
            fixable = expected.size == 1 or "bias" in ctx.params["allow_per_axis"]
            yield self.finding(ctx, node, [name], subject=node, fixable=fixable, tensor=name,
                               scale=describe(params.scale, params.zero_point),
                               expected=describe(expected, np.zeros(1)))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node = finding.subject
        found = _operands(ctx, node)
        if found is None:
            return []
        bias, expected, axis = found
        reason = f"{mention(node)}: bias scale = input scale × weight scale"
        return set_params(ctx, _private(ctx, node, bias), expected if expected.size > 1 else expected.reshape(()),
                          self.code, reason, zero_point=0, axis=axis)


def _private(ctx: FixContext, node: ir.Node, bias: QTensor) -> QTensor:
    """The bias as only `node` reads it: exporters share one bias constant (and DQ) among convs whose
    input × weight scales differ, and moving it for one would move it for all."""
    dequantize = ctx.index.dequantize_feeding(node.inputs[BIAS_INPUT[node.op]])
    readers = [c for dq in bias.dequantizes for t in dq.outputs for c, _ in ctx.index.consumers_through(t)]
    if readers == [node]:
        return bias
    out = ir.Variable(ctx.new_name(f"{stem(node)}_bias"), dtype=dequantize.outputs[0].dtype,
                      shape=dequantize.outputs[0].shape)
    private = ir.Node(dequantize.op, ctx.new_name(f"{stem(node)}_bias_DequantizeLinear"), attrs=dict(dequantize.attrs),
                      inputs=list(dequantize.inputs), outputs=[out], domain=dequantize.domain)
    ctx.edits.add_node(private)
    ctx.edits.set_input(node, BIAS_INPUT[node.op], out)
    return QTensor(bias.integer, None, [private], None)


def _operands(ctx: CheckContext, node) -> tuple[QTensor, np.ndarray, int] | None:
    """The bias value, the scale it must have (float32 product, as runtimes compute it) and its axis."""
    bias = _bias(ctx.index, node)
    expected = _accumulator_scale(ctx.index, node) if bias is not None else None
    if expected is None:
        return None
    # The output channels run along the bias's last axis: a Conv's bias is 1-D, and a Gemm's may be
    # [1, N] (tf2onnx writes it so), where axis 0 would give the scales the wrong shape.
    rank = len(bias.integer.shape or ())
    return bias, expected, max(rank - 1, 0)


def _bias(index: QuantIndex, node: ir.Node) -> QTensor | None:
    """The quantized value an op reads as its bias, if any."""
    return input_value(index, node, BIAS_INPUT[node.op]) if node.op in BIAS_INPUT else None


def _accumulator_scale(index: QuantIndex, node: ir.Node) -> np.ndarray | None:
    """Input scale × weight scale (one per output channel if the weight has them), if both are constant."""
    data = input_value(index, node, 0)
    weight = input_value(index, node, WEIGHT_INPUT[node.op]) if node.op in WEIGHT_INPUT else None
    if data is None or weight is None:
        return None
    p_in, p_w = index.params(data.nodes[0]), index.params(weight.nodes[0])
    if p_in.dynamic or p_w.dynamic or p_in.granularity != PER_TENSOR or p_w.block_size:
        return None
    return (np.float32(p_in.scale.ravel()[0]) * p_w.scale.ravel().astype(np.float32)).astype(np.float64)


@register
class FloatBias(Rule):
    """A Conv, ConvTranspose or Gemm with quantized input and weight must have a quantized bias.

    Why: the NPU (DPU) adds the bias to its integer accumulator; it has no float datapath, so
    a float bias (PyTorch FX and PT2E exports, NNCF) leaves the op without the fix-point bias the
    compiler needs. TensorRT and onnxruntime quantize a float bias themselves: their rule sets
    leave this rule off (TensorRT's QDQ609 asks for the opposite).

    Example: `Conv(DQ(x, 2^-5), DQ(w, 2^-7), b_float)`. The fix replaces `b` by int32 integers
    behind a DequantizeLinear at the accumulator's scale, input × weight = 2^-12 (per output
    channel if the weight is), the catalogue's `bpos = ipos + wpos` for int32 biases, so
    shift_bias is 0 and QDQ606 holds. Round half to even; saturated and zeroed values and the
    SQNR are reported. Approximate: each bias moves by at most half an accumulator step.
    """

    code = "QDQ610"
    name = "float-bias"
    message = "{node}: bias {tensor} is float; input and weight are quantized ({scale} × {weight_scale})"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"ops": ["Conv", "ConvTranspose", "Gemm"]}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            slot = BIAS_INPUT[node.op]
            if slot >= len(node.inputs) or node.inputs[slot].name == "":
                continue
            if input_value(ctx.index, node, slot) is not None:
                continue  # quantized: QDQ605 and QDQ606 check it
            data = input_value(ctx.index, node, 0)
            weight = input_value(ctx.index, node, WEIGHT_INPUT[node.op])
            if data is None or weight is None:
                continue
            p_in, p_w = ctx.index.params(data.nodes[0]), ctx.index.params(weight.nodes[0])
            tensor = node.inputs[slot].name
            yield self.finding(ctx, node, [tensor], subject=node, fixable=_float_bias(ctx, node) is not None,
                               tensor=tensor, scale=describe(p_in.scale, p_in.zero_point),
                               weight_scale=describe(p_w.scale, p_w.zero_point))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node = finding.subject
        values, scale = _float_bias(ctx, node)
        slot = BIAS_INPUT[node.op]
        bias = node.inputs[slot]
        int32 = quant_type(onnx.TensorProto.INT32)
        integers, cost = quantize_blocks(lambda rows: values[rows], values.shape, scale, np.zeros(scale.shape), 0,
                                         int32, np.dtype(np.int32))
        stored = scale.astype(float_type(bias))
        read_dequantized(ctx, node, slot, integers, stored if stored.size > 1 else stored.reshape(()), 0)
        return [Change(self.code, mention(node), bias.name, "float", f"int32 at {describe(scale, np.zeros(1))}",
                       cost_sentence(f"{mention(node)}: bias quantized at input × weight scale", cost), cost)]


def _float_bias(ctx: CheckContext, node: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """A float bias's values (a constant vector, one per output channel) and the accumulator scale, if both known."""
    source = resolve_constant(node.inputs[BIAS_INPUT[node.op]])
    scale = _accumulator_scale(ctx.index, node)
    if source is None or scale is None:
        return None
    values = source_values(ctx.model, source).astype(np.float64)
    return (values, scale) if values.ndim == 1 and scale.size in (1, values.size) else None


@register
class QuantizedBias(Rule):
    """A bias, and any parameter the target computes in float, must be a float constant, not dequantized.

    Why: TensorRT derives the int32 bias itself from a float bias and the input and weight
    scales. Its ONNX parser fails on an int32 bias DequantizeLinear (onnxruntime's
    `quantize_static` default: "only activation types allowed as input to this layer"), and reads
    an int8 Q→DQ'd bias (Vitis AI, Quark) as a dynamic input whose handling is undocumented.
    NVIDIA's own tools never quantize a bias, nor LayerNorm's scale and bias or the bias Add after
    a MatMul, which stay float; onnxruntime's quantizer dequantizes them all from integers.
    `inputs` names, per op, the input slots that must be float when constants alone make them.

    Example: `Conv(x, w, DequantizeLinear(b_int32, 0.0002))`, or `LayerNormalization(x,
    DQ(gamma_uint8), DQ(beta_int32))`. The fix replaces the input by a float initializer holding
    the values onnxruntime computes for it, `DQ(b_int)` or `DQ(Q(b_float))` with the Q's rounding
    and clipping; the Q/DQ nodes nobody else reads go. Exact: the outputs stay bit-identical in
    onnxruntime.
    """

    code = "QDQ609"
    name = "quantized-bias"
    message = "{node}: {what} {tensor} is {form} ({dtype}); the target takes it in float"
    severity = Severity.ERROR
    fix_safety = FixSafety.EXACT
    parameters = {"inputs": {"Conv": [2], "ConvTranspose": [2], "Gemm": [2]}}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        slots_of = ctx.params["inputs"]
        for node in ctx.index.nodes_of(slots_of):
            for slot in slots_of[node.op]:
                if input_value(ctx.index, node, slot) is None:
                    continue
                tensor = node.inputs[slot]
                dequantize = ctx.index.dequantize_feeding(tensor)
                value = ctx.index.qtensor_of(dequantize)
                if slot == BIAS_INPUT.get(node.op):
                    constant = constant_ancestry(tensor) is not None
                elif value.from_constant:
                    constant = True
                else:
                    continue  # an activation (a residual Add's input), not a parameter
                form = "QuantizeLinear → DequantizeLinear" if value.quantize is not None else "a DequantizeLinear"
                name = ctx.value_name(value)
                what = "bias" if slot == BIAS_INPUT.get(node.op) else f"input {slot} of the {node.op}"
                yield self.finding(ctx, node, [name], subject=(node, slot), fixable=constant, tensor=name, what=what,
                                   op=node.op, form=form, dtype=type_name(ctx.index.params(dequantize).elem_type))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slot = finding.subject
        values = evaluate_constant(ctx, node.inputs[slot])
        if values is None:
            return []
        old = node.inputs[slot].name
        base = f"{stem(node)}_bias" if finding.values["what"] == "bias" else f"{stem(node)}_input{slot}"
        ctx.edits.set_input(node, slot, ctx.model.new_constant(ctx.new_name(base, replacing=old), values))
        return [Change(self.code, mention(node), finding.tensors[0], finding.values["dtype"], str(values.dtype),
                       f"{mention(node)}: {finding.values['what']} folded into a float constant ({values.size} values, "
                       f"as onnxruntime computes {finding.values['form']})")]
