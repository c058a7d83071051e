"""QDQ808-810: what NVIDIA's tools leave float on purpose in a TensorRT model, and why QDQ801 accepts it.

NVIDIA Model Optimizer, the reference for quantizing transformers for TensorRT, keeps GEMMs
too small for tensor cores float (K or N below 16, or a GEMV with M or N = 1: INT8 or FP8
there only adds conversion layers), keeps FP8 off convs with few channels or large filters,
quantizes weights only in INT4 models, puts no Q/DQ on graph outputs, and quantizes the inputs
of the ops TensorRT runs in INT8 only (not Softmax or GELU's arithmetic). QDQ801
does not ask to quantize what these rules keep float; QDQ808-810 report Q/DQ that other tools
(for instance onnxruntime's `quantize_static`, which quantizes everything) put there. The sizes are
rule-set parameters; only dimensions the model states are used (a symbolic batch is unknown,
where ModelOpt assumes 1).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from qdq.graph import ir
from qdq.graph.names import stem
from qdq.quant.dtypes import type_name
from qdq.quant.index import PER_TENSOR, QuantIndex, resolve_constant
from qdq.quant.operands import input_value
from qdq.rewrite.constant_eval import constant_ancestry, evaluate_constant
from qdq.rewrite.insertion import float_type
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register

# What the rules below and QDQ801 read to decide that an op stays float; the size defaults (0)
# exclude nothing (rules/trt.toml sets TensorRT's).
FLOAT_BY_DESIGN_PARAMETERS = {
    "min_gemm_dim": 0,
    "fp8_conv_channels_over": 0,
    "fp8_conv_max_filter": 0,
    "weight_only_types": ["int4", "uint4"],
}
_GEMMS = ("MatMul", "Gemm")


def float_by_design(ctx: CheckContext, node: ir.Node) -> str | None:
    """Why TensorRT runs this op faster in float (a reason for a message), or None."""
    if node.op in _GEMMS:
        return _small_gemm(node, ctx.params["min_gemm_dim"])
    if node.op == "Conv" and _model_precision(ctx.index, ctx.params["weight_only_types"]) == "fp8":
        return _fp8_conv_exclusion(node, ctx.params["fp8_conv_channels_over"], ctx.params["fp8_conv_max_filter"])
    return None


def reads_float_by_design(ctx: CheckContext, node: ir.Node, slot: int) -> bool:
    """Whether input `slot` of `node` is float on purpose: the data input of a GEMM whose weight is
    quantized weight-only (INT4), or any input in a model that quantizes weights only."""
    if _model_precision(ctx.index, ctx.params["weight_only_types"]) == "weight-only":
        return True
    return node.op in _GEMMS and slot != 1 and _weight_only(ctx, node)


def _weight_only(ctx: CheckContext, node: ir.Node) -> bool:
    """Whether the GEMM's weight is dequantized from a weight-only type (INT4)."""
    weight = input_value(ctx.index, node, 1)
    return weight is not None and any(
        type_name(ctx.index.params(dq).elem_type) in ctx.params["weight_only_types"] for dq in weight.dequantizes)


def _small_gemm(node: ir.Node, min_dim: int) -> str | None:
    """`N = 10 < 16`, `M = 1 (a GEMV)`, ... from the shapes the model states, or None (always
    None with `min_dim` 0: the rule set excludes no GEMM)."""
    if not min_dim:
        return None
    a, b = (_shape(t) for t in node.inputs[:2])
    dims = {}
    if b:
        if node.op == "Gemm" and node.attrs.get("transB", 0):
            dims["N"], dims["K"] = b[0], b[-1]
        else:
            dims["K"], dims["N"] = (b[-2], b[-1]) if len(b) >= 2 else (b[0], 1)
    if a:
        dims["M"] = (a[-1] if node.op == "Gemm" and node.attrs.get("transA", 0) else a[-2]) if len(a) >= 2 else 1
    for name in ("M", "N"):
        if dims.get(name) == 1:
            return f"{name} = 1 (a GEMV, which cannot use tensor cores)"
    for name in ("K", "N"):
        if isinstance(dims.get(name), int) and 0 < dims[name] < min_dim:
            return f"{name} = {dims[name]} < {min_dim} (too small for tensor cores)"
    return None


def _fp8_conv_exclusion(node: ir.Node, channels_over: int, max_filter: int) -> str | None:
    weight = _shape(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or len(weight) < 3 or not all(isinstance(d, int) for d in weight):
        return None
    if max_filter and math.prod(weight[2:]) > max_filter:
        return f"a {'x'.join(map(str, weight[2:]))} filter, larger than FP8 convs take ({max_filter} elements)"
    if min(weight[0], weight[1]) <= channels_over:
        return f"{weight[0]} output and {weight[1]} input channels; FP8 convs need more than {channels_over}"
    return None


def _shape(tensor: ir.Tensor | None) -> tuple | None:
    """The stated shape of a tensor, else of what the DQ or Q that makes it reads (same shape)."""
    while tensor is not None and tensor.shape is None:
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if producer is None or producer.op not in ("DequantizeLinear", "QuantizeLinear") or not producer.inputs:
            return None
        tensor = producer.inputs[0]
    return tuple(tensor.shape) if tensor is not None else None


def _model_precision(index: QuantIndex, weight_only_types: list[str]) -> str:
    """`fp8` when activations are quantized to a float8 type, `weight-only` when nothing but stored
    weights of a weight-only type (INT4) is dequantized, else `int` (INT8 and the rest)."""
    key = ("precision", tuple(weight_only_types))
    if key not in index.memo:
        activations = [p for p in index.all_params() if p.is_quantize and resolve_constant(p.node.inputs[0]) is None]
        if any(type_name(p.elem_type).startswith("float8") for p in activations):
            index.memo[key] = "fp8"
        elif not activations and index.dequantizes and all(
                resolve_constant(p.node.inputs[0]) is not None and type_name(p.elem_type) in weight_only_types
                for p in index.all_params() if not p.is_quantize):
            index.memo[key] = "weight-only"
        else:
            index.memo[key] = "int"
    return index.memo[key]


@register
class QuantizedSmallGemm(Rule):
    """A MatMul or Gemm too small for tensor cores should stay float for TensorRT.

    Why: NVIDIA Model Optimizer leaves MatMul/Gemm float when K or N is below `min_gemm_dim`
    (16) or the output is a GEMV (M or N = 1): INT8 and FP8 tensor-core kernels need K and N of
    at least 16, and Q/DQ on such GEMMs only add conversion layers (a classification head with 10
    classes is the usual case). onnxruntime's `quantize_static` quantizes them all. Only
    dimensions the model states count; a symbolic batch is not taken as 1.

    Example: `Gemm(DQ(x), DQ(w[10, 64]), b)` with transB. The fix makes the Gemm read the float
    tensor the Q of `x` read, and `w` as the float constant onnxruntime dequantized (exact for the
    weight); Q/DQ nodes nobody else reads go. Approximate: the activation is no longer rounded.
    """

    code = "QDQ808"
    name = "quantized-small-gemm"
    message = "{node}: {op} has {why}; its dequantized inputs ({inputs}) should be float"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = dict(FLOAT_BY_DESIGN_PARAMETERS)

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.index.nodes_of(_GEMMS):
            why = _small_gemm(node, ctx.params["min_gemm_dim"])
            if why is None or _weight_only(ctx, node):
                continue  # weight-only GEMMs run on other kernels, which ModelOpt does not exclude by size
            values = {slot: input_value(ctx.index, node, slot) for slot in (0, 1)}
            quantized = {slot: v for slot, v in values.items() if v is not None}
            if not quantized:
                continue
            fixable = all(v.quantize is not None or v.stored for v in quantized.values())
            names = [ctx.value_name(v) for v in quantized.values()]
            yield self.finding(ctx, node, names, subject=(node, sorted(quantized)), fixable=fixable, op=node.op,
                               why=why, inputs=", ".join(names))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slots = finding.subject
        changes = []
        for slot in slots:
            value = input_value(ctx.index, node, slot)
            old = node.inputs[slot].name
            if value.from_constant:
                folded = evaluate_constant(ctx, node.inputs[slot])
                if folded is None:
                    continue
                constant = ctx.model.new_constant(ctx.new_name(f"{stem(node)}_input{slot}", replacing=old), folded)
                ctx.edits.set_input(node, slot, constant)
                how = f"folded into a float constant ({folded.size} values, as onnxruntime dequantized them)"
            else:
                ctx.edits.set_input(node, slot, value.quantize.inputs[0])
                how = f"reads {value.quantize.inputs[0].name}, the float tensor {mention(value.quantize)} quantized"
            changes.append(Change(self.code, mention(node), old, "dequantized", "float",
                                  f"{mention(node)}: input {slot} {how}, since the {node.op} has {finding.values['why']}"))
        return changes


@register
class QdqOnGraphOutput(Rule):
    """A graph output should be the float the model computed, not a Q → DQ of it.

    Why: TensorRT needs no Q/DQ on output tensors (NVIDIA/TensorRT#2604), and NVIDIA's tools put
    none there: the op before the output fuses the Q and writes INT8, then a standalone layer
    dequantizes it, which costs a layer and the output's precision. onnxruntime's
    `quantize_static` ends models with `Q → DQ → output`. Outputs written as integers (a Q's
    output) are the model's interface and are not reported, nor outputs an op Q/DQ move through
    (`transparent`: Reshape, Unsqueeze, ...) makes from a dequantized value, whose Q/DQ only
    carries the grid the value already had (and whose removal onnxruntime 1.31's layout
    optimizer mishandles).

    Example: `Gemm → Q(0.07, int8) → DQ → logits`. The fix makes `logits` a Clip of the Gemm's
    output to the range the grid held, [-128·0.07, 127·0.07], so values the model saturated stay
    saturated (TensorRT fuses the Clip into the op before it); the pair goes. Approximate: the
    output is no longer rounded, by at most half a step.
    """

    code = "QDQ809"
    name = "qdq-on-graph-output"
    message = "graph output {tensor} is written by {dequantize} from {quantize}; the target wants the float {source}"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"transparent": []}  # the rule set's shared list

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for output in ctx.graph.outputs:
            dequantize = ctx.index.dequantize_feeding(output)
            value = ctx.index.qtensor_of(dequantize) if dequantize is not None else None
            if value is None or value.quantize is None or not value.quantize.inputs:
                continue
            source = value.quantize.inputs[0]
            if resolve_constant(source) is not None or _moved_dequantized(ctx, source):
                continue  # a constant output, or one a data-movement op makes from a dequantized value
            params = ctx.index.params(value.quantize)
            fixable = (dequantize.outputs[0] is output  # not through an Identity or Cast
                       and not params.dynamic and params.granularity == PER_TENSOR and params.qtype is not None)
            yield self.finding(ctx, dequantize, [output, source], subject=(output, value.quantize, dequantize),
                               fixable=fixable, tensor=output.name, dequantize=mention(dequantize),
                               quantize=mention(value.quantize), source=source.name, standalone=[mention(dequantize)])

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        output, quantize, dequantize = finding.subject
        params = ctx.index.params(quantize)
        source = quantize.inputs[0]
        zero_point, scale = float(params.zero_point.ravel()[0]), float(params.scale.ravel()[0])
        dtype = float_type(source)
        low, high = (np.asarray((q - zero_point) * scale, dtype=dtype) for q in (params.qtype.qmin, params.qtype.qmax))
        shown = mention(dequantize)  # before detaching: an unnamed node is named by its output
        ctx.edits.detach(dequantize)
        bounds = [ir.Constant(ctx.new_name(f"{output.name}_{end}"), value) for end, value in (("min", low), ("max", high))]
        ctx.edits.add_node(ir.Node("Clip", ctx.new_name(f"{output.name}_Clip"), inputs=[source, *bounds],
                                   outputs=[output]))
        return [Change(self.code, shown, output.name, "Q → DQ", f"Clip({low:g}, {high:g})",
                       f"graph output {output.name} is the float {source.name}, clipped to the range "
                       f"{mention(quantize)} held; the Q/DQ pair is gone")]


def _moved_dequantized(ctx: CheckContext, tensor: ir.Tensor) -> bool:
    """Whether an op Q/DQ move through (`transparent`) makes `tensor` from a dequantized value."""
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    return (producer is not None and producer.op in ctx.params["transparent"] and bool(producer.inputs)
            and ctx.index.dequantize_feeding(producer.inputs[0]) is not None)


@register
class QdqBeforeFloatOp(Rule):
    """A Q/DQ pair whose value only ops running in float read should not be there.

    Why: TensorRT runs Softmax, GELU's Erf and pointwise arithmetic with a constant operand (a
    bias Add, GELU's scaling) or an operand a float op made (GELU's `x · (1 + erf(x/√2))`) in
    FP16/FP32; it fuses a bias Add into the GEMM before it. A Q/DQ pair whose every reader
    (through ops Q/DQ move through, `transparent`) is such an op (`float_ops`, or one of
    `pointwise` with such an operand) rounds the value to INT8 and converts it back, costing
    precision and a conversion layer, and splits the GEMM from its bias. NVIDIA Model Optimizer
    quantizes only the inputs of the ops TensorRT runs in INT8; onnxruntime's `quantize_static`
    quantizes the input of every op. (ModelOpt does quantize a LayerNormalization's input after a
    residual Add, so LayerNormalization is not in the list.)

    Example: `MatMul → Q → DQ → Softmax`. The fix makes the Softmax read the MatMul's float output;
    the pair goes. Approximate: the value is no longer rounded.
    """

    code = "QDQ810"
    name = "qdq-before-float-op"
    message = "{quantize}: the value it quantizes is read only by ops the target runs in float ({readers})"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {
        "float_ops": ["Softmax", "Erf"],
        "pointwise": ["Add", "Sub", "Mul", "Div"],
        "transparent": [],  # the rule set's shared list
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for value in ctx.index.qtensors:
            quantize = value.quantize
            if quantize is None or not value.dequantizes or resolve_constant(quantize.inputs[0]) is not None:
                continue
            if ctx.index.is_interface(value.integer) or ctx.index.is_interface(quantize.inputs[0]):
                continue
            readers = self._readers(ctx, value.dequantizes)
            if readers is None:
                continue
            ops = sorted({n.op for n in readers})
            yield self.finding(ctx, quantize, [quantize.inputs[0]], subject=value, quantize=mention(quantize),
                               readers=", ".join(ops), standalone=[mention(dq) for dq in value.dequantizes])

    def _readers(self, ctx: CheckContext, dequantizes: list[ir.Node]) -> list[ir.Node] | None:
        """The ops that read the dequantized value, when all run in float (else None)."""
        float_ops, pointwise = set(ctx.params["float_ops"]), set(ctx.params["pointwise"])
        transparent = set(ctx.params["transparent"])
        readers: list[ir.Node] = []
        stack = [dq.outputs[0] for dq in dequantizes if dq.outputs]
        while stack:
            tensor = stack.pop()
            if ctx.index.is_graph_output(tensor):
                return None
            for consumer, _ in ctx.index.consumers_through(tensor):
                if consumer.op in transparent and consumer.outputs:
                    stack.append(consumer.outputs[0])
                elif consumer.op in float_ops or (consumer.op in pointwise and any(
                        t is not None and (constant_ancestry(t) is not None or _made_in_float(t, float_ops, pointwise))
                        for t in consumer.inputs)):
                    readers.append(consumer)
                else:
                    return None
        return readers or None

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        value = finding.subject
        source = value.quantize.inputs[0]
        for dequantize in value.dequantizes:
            ctx.edits.replace_uses(dequantize.outputs[0], source)
        return [Change(self.code, mention(value.quantize), source.name, "Q → DQ", "float",
                       f"Q/DQ removed: {finding.values['readers']} read {source.name} in float")]


def _made_in_float(tensor: ir.Tensor, float_ops: set[str], pointwise: set[str], depth: int = 6) -> bool:
    """Whether a float op makes `tensor`, through a few pointwise ops and Q/DQ: the `1 + erf(x/√2)`
    that GELU's Mul reads, which TensorRT computes in one float kernel with the Mul."""
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is None or depth == 0:
        return False
    if producer.op in float_ops:
        return True
    if producer.op in pointwise or producer.op in ("QuantizeLinear", "DequantizeLinear"):
        return any(t is not None and _made_in_float(t, float_ops, pointwise, depth - 1) for t in producer.inputs[:2])
    return False
