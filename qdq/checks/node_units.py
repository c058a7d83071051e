"""QDQ804-805: node units, the DQ → op → Q groups a runtime replaces by one integer op.

onnxruntime turns `DQ → Conv → Q` into QLinearConv only when every input of the op comes from
a DQ and every output edge goes to a Q (through a Relu or Clip the Q makes redundant); one float
edge and the whole group runs in float, with the Q/DQ conversions around it. These rules find
ops whose inputs are quantized but whose output is not, and give the output a Q where that needs
no data: the Q the output already has for another consumer, or the op's own fixed range
(Sigmoid: [0, 1]). Op lists, ranges and the type are parameters of the rule set.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from onnx import helper

from qdq.checks.batchnorm import FOLD_PARAMETERS, folded_away
from qdq.checks.reduced_range import clip_bounds
from qdq.graph import ir
from qdq.quant.dtypes import QUANT_TYPES_BY_NAME
from qdq.quant.index import DEQUANTIZE, QUANTIZE, resolve_constant
from qdq.quant.operands import BIAS_INPUT, WEIGHT_INPUT
from qdq.rewrite.insertion import quantize_for, quantize_hint, read_through
from qdq.rewrite.requantize import describe
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError


def dequantized_inputs(ctx: CheckContext, node: ir.Node, will_be: frozenset[int] = frozenset()) -> bool:
    """Whether every data input of a node comes from a DQ (constant weights, biases and shapes aside);
    tensors in `will_be` (by id) count as dequantized: another rule's fix quantizes them without data."""
    found = False
    for slot, tensor in enumerate(node.inputs):
        if tensor is None or tensor.name == "":
            continue
        if ctx.index.dequantize_feeding(tensor) is not None or id(tensor) in will_be:
            found = True
            continue
        source = resolve_constant(tensor)
        if source is None:
            return False
        weight_or_bias = slot in (WEIGHT_INPUT.get(node.op), BIAS_INPUT.get(node.op))
        if not weight_or_bias and np.issubdtype(np.dtype(source.constant.dtype), np.floating):
            return False  # a float operand (Mul by a constant): the input side's rule, not this one
    return found


def _reads_as_quantize(node: ir.Node, tensor: ir.Tensor) -> bool:
    return node.op == QUANTIZE and bool(node.inputs) and node.inputs[0] is tensor


# What QDQ801 and QDQ804 read to leave a tensor to the rule that quantizes it without data
# (`quantized_without_data`): QDQ204's fold parameters and QDQ805's `ranges` ({} when it is off).
DEFERRED_PARAMETERS = {**FOLD_PARAMETERS, "ranges": {}}


def _clip_within_quantizes(ctx: CheckContext, activation: ir.Node) -> bool:
    """Whether the Qs after a Clip make its upper bound redundant, as onnxruntime requires to absorb
    it (IsClipMadeRedundantByQ): each Q's range tops out at or below it. A ReLU6 before a Q whose
    grid reaches 7.97 clips values the Q would keep, so the Conv before it stays float. (The lower
    bound, like a Relu's, is QDQ507's: it moves the zero-point there.)"""
    if activation.op != "Clip":
        return True
    high = clip_bounds(ctx, activation)[1]
    if high is None:
        return False
    for quantize, _ in ctx.index.consumers_through(activation.outputs[0]):
        if quantize.op != QUANTIZE or ctx.index.qtensor_of(quantize) is None:
            continue  # a float reader is reported as one
        params = ctx.index.params(quantize)
        if params.dynamic or params.qtype is None or params.qtype.is_float:
            return False
        top = (params.qtype.qmax - params.zero_point.astype(np.float64)) * params.scale.astype(np.float64)
        if np.any(top > high * (1 + 1e-6)):
            return False
    return True


@register
class FloatOutput(Rule):
    """An op whose inputs are all dequantized should quantize every output edge, or it runs in float.

    Why: onnxruntime selects a node unit (DQ → op → Q, replaced by QLinearConv, QLinearAdd, ...)
    only when every output edge of the op goes to a Q, directly or through a Relu/Clip the Q
    absorbs (`through`), and no output is a graph output. One float consumer and the op runs
    in float between a DQ and a Q: slower than the float model. The ops are the ones the target
    has integer kernels for (`ops`).

    Example: `DQ → Conv → {Q → DQ → Conv2, Sigmoid}`: the Sigmoid reads the float output. The
    fix makes the Sigmoid read the DQ of the Q the output already has (data-free), so the Conv
    unit fuses; the Sigmoid now sees the rounded values. Approximate. An output whose values
    reach a Q unchanged through ops in `movers` (Reshape, a nearest Resize, ...; each the only
    reader of what it reads) takes that Q's grid, without data: `Mul → Resize → Q` becomes
    `Mul → Q' → DQ' → Resize → Q`, and the Q after the Resize gives the same integers as before.
    Any other output with no Q needs a scale from data; a graph output is left alone.

    Outputs another rule resolves without data are that rule's finding, reported once: a conv
    output feeding a BatchNormalization or constant scaling that QDQ204 folds into the conv
    (the fold alone lets it fuse; `exact_rtol` and `fold_scaling_ops` as for QDQ204), and an
    output QDQ805 quantizes from its fixed range (`ranges` as for QDQ805; both in [params]).
    """

    code = "QDQ804"
    name = "float-output"
    message = "{node}: the {op}'s inputs are dequantized but its output {tensor} {problem}, so it runs in float{how}"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {
        "ops": ["Conv", "ConvTranspose", "Gemm", "Add", "Mul", "Concat", "AveragePool", "GlobalAveragePool"],
        "through": ["Relu", "Clip"],
        "movers": [],
        "calibrated_type": "uint8",
        **DEFERRED_PARAMETERS,
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops = set(ctx.params["ops"])
        elsewhere = quantized_without_data(ctx)
        for node in ctx.index.nodes_of(ops):
            # An input QDQ805 quantizes counts as dequantized: once it has, this op's output is
            # the float edge (a SiLU's Mul after its Sigmoid), and lint says so before the fix.
            if not dequantized_inputs(ctx, node, frozenset(elsewhere)):
                continue
            for tensor in node.outputs:
                if id(tensor) in elsewhere or id(self._site(ctx, tensor)) in elsewhere:
                    continue  # QDQ204 or QDQ805 resolves it without data
                site = self._site(ctx, tensor)
                floats = [c for c, _ in ctx.index.consumers_through(site) if c.op != QUANTIZE]
                output = ctx.index.is_graph_output(tensor) or ctx.index.is_graph_output(site)
                if not floats and not output:
                    continue
                if output:
                    fixable, problem, how = False, "is a graph output", ""
                else:
                    fixable, how = quantize_hint(ctx, site, ctx.params["movers"])
                    problem = f"feeds {', '.join(sorted({mention(c) for c in floats}))} in float"
                yield self.finding(ctx, node, [site], subject=site, fixable=fixable,
                                   op=node.op, tensor=site.name, problem=problem, how=how)

    def _site(self, ctx: CheckContext, tensor: ir.Tensor) -> ir.Tensor:
        """Where the output's Q belongs: after a single absorbable activation, else the output itself."""
        consumers = tensor.outputs
        if len(consumers) == 1 and consumers[0].op in ctx.params["through"] and consumers[0].outputs:
            if not ctx.index.is_graph_output(tensor) and _clip_within_quantizes(ctx, consumers[0]):
                return consumers[0].outputs[0]
        return tensor

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        site = finding.subject
        quantize = quantize_for(ctx, site, ctx.params["calibrated_type"], ctx.params["movers"])
        if quantize is None:
            return []
        changes = []
        for consumer in list(site.outputs):
            if _reads_as_quantize(consumer, site):
                continue
            for slot, tensor in enumerate(consumer.inputs):
                if tensor is site:
                    reason = f"{finding.node}'s output reaches only Qs, so its node unit fuses; reads {mention(quantize)}'s value"
                    changes.append(read_through(ctx, consumer, slot, quantize, self.code, reason))
        return changes


@register
class FixedRangeOutput(Rule):
    """An op with a known output range (Sigmoid: [0, 1]) and dequantized inputs should quantize its output.

    Why: the scale of such an output needs no calibration, and without a Q the op and its
    consumers stay float. PyTorch FX leaves every SiLU's Sigmoid unquantized; with a Q/DQ on the
    Sigmoid output onnxruntime fused QLinearSigmoid + QLinearMul in 34 of 35 SiLUs of a detector
    (0.83x → 0.64x of fp32 latency, output SQNR 31.25 → 31.22 dB). Ranges come from `ranges`
    (op → [low, high]), the integer type from `dtype`.

    Example: `DQ → Sigmoid → Mul`. The fix inserts `Q → DQ` on the Sigmoid output with
    scale (high − low)/(qmax − qmin + 1) = 1/256 and zero-point qmin − low/scale = 0 (uint8), and
    makes every consumer read it. Approximate: values move by at most one step (1/256).
    """

    code = "QDQ805"
    name = "fixed-range-output"
    message = "{node}: output {tensor} of the {op} has no QuantizeLinear although its range [{low}, {high}] is known"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {
        "ranges": {"Sigmoid": [0.0, 1.0], "HardSigmoid": [0.0, 1.0], "Tanh": [-1.0, 1.0]},
        "dtype": "uint8",
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ranges = self._ranges(ctx)
        for node in _fixed_range_nodes(ctx, ranges):
            out = node.outputs[0]
            low, high = ranges[node.op]
            yield self.finding(ctx, node, [out], subject=(node, low, high), fixable=not ctx.index.is_graph_output(out),
                               tensor=out.name, op=node.op, low=low, high=high)

    def _ranges(self, ctx: CheckContext) -> dict[str, tuple[float, float]]:
        ranges, dtype = ctx.params["ranges"], ctx.params["dtype"]
        qtype = QUANT_TYPES_BY_NAME.get(dtype)
        if qtype is None or qtype.is_float or qtype.bits > 16:
            raise RuleSetError(f"{self.code}.dtype must be an integer type of at most 16 bits, got {dtype!r}")
        checked = {}
        for op, bounds in ranges.items():
            if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, (int, float)) for b in bounds)
                    and bounds[0] < bounds[1]):
                raise RuleSetError(f"{self.code}.ranges.{op} must be [low, high] with low < high, got {bounds!r}")
            checked[op] = (float(bounds[0]), float(bounds[1]))
        return checked

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, low, high = finding.subject
        qtype = QUANT_TYPES_BY_NAME[ctx.params["dtype"]]
        scale = (high - low) / (qtype.qmax - qtype.qmin + 1)
        zero_point = int(np.clip(np.rint(qtype.qmin - low / scale), qtype.qmin, qtype.qmax))
        out = node.outputs[0]
        scale_type = _scale_type(ctx, node)
        scale_const = ir.Constant(ctx.new_name(f"{out.name}_scale"), np.asarray(scale, dtype=scale_type))
        zp_const = ir.Constant(ctx.new_name(f"{out.name}_zero_point"), np.asarray(zero_point, dtype=ctx.params["dtype"]))
        dequantized = ir.Variable(ctx.new_name(f"{out.name}_dequantized"), dtype=out.dtype, shape=out.shape)
        ctx.edits.replace_uses(out, dequantized)
        integers = ir.Variable(ctx.new_name(f"{out.name}_quantized"), dtype=np.dtype(ctx.params["dtype"]), shape=out.shape)
        ctx.edits.add_node(ir.Node(QUANTIZE, ctx.new_name(f"{out.name}_QuantizeLinear"),
                                   inputs=[out, scale_const, zp_const], outputs=[integers]))
        ctx.edits.add_node(ir.Node(DEQUANTIZE, ctx.new_name(f"{out.name}_DequantizeLinear"),
                                   inputs=[integers, scale_const, zp_const], outputs=[dequantized]))
        new = f"{ctx.params['dtype']} {describe(np.asarray(scale), np.asarray(zero_point))}"
        reason = (f"{node.op} output range [{low:g}, {high:g}] is fixed: Q/DQ without data so the {node.op} and its "
                  f"consumers can run as integer ops; values move by at most one step ({scale:.6g})")
        return [Change(self.code, mention(node), out.name, "float", new, reason,
                       {"scale": scale, "zero_point": zero_point, "max_error": scale})]


def _fixed_range_nodes(ctx: CheckContext, ranges: Iterable[str]) -> list[ir.Node]:
    """The ops QDQ805 reports: in `ranges`, every input dequantized, no Q on the output."""
    return [
        node for node in ctx.graph.nodes
        if node.op in ranges and node.outputs and dequantized_inputs(ctx, node)
        and not any(c.op == QUANTIZE for c, _ in ctx.index.consumers_through(node.outputs[0]))
    ]


def quantized_without_data(ctx: CheckContext) -> set[int]:
    """The float tensors, by id, that another rule's fix quantizes without data: the chains QDQ204
    folds away and the outputs QDQ805 gives their fixed range (`ranges`, in [params] for this).

    Rules that would ask for calibration data there (QDQ801, QDQ804) leave these to those rules.
    """
    fixed = {id(node.outputs[0]) for node in _fixed_range_nodes(ctx, ctx.params["ranges"])
             if not ctx.index.is_graph_output(node.outputs[0])}
    return folded_away(ctx) | fixed


def _scale_type(ctx: CheckContext, node: ir.Node) -> np.dtype:
    """The float type of the op's dequantized inputs, so the new DQ writes what the consumers read."""
    for tensor in node.inputs:
        dequantize = ctx.index.dequantize_feeding(tensor) if tensor is not None else None
        source = ctx.index.params(dequantize).scale_source if dequantize is not None else None
        if source is not None:
            return np.dtype(helper.tensor_dtype_to_np_dtype(source.elem_type))
    return np.dtype(np.float32)
