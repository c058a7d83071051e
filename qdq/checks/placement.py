"""QDQ801-803, QDQ806-807: where Q/DQ sit relative to the ops a target fuses (TensorRT's placement rules).

TensorRT fuses each DQ into the op that reads it and each Q into the op that writes it, and
moves DQs forward and Qs backward through ops that commute with them (MaxPool, Reshape, ...).
So a quantizable op with a float input runs in FP16/FP32; a Conv+Add whose residual input is
float writes a float output, and the Q after it becomes a separate conversion layer; a Q/DQ
pair between a Conv and the Add it feeds, or its activation, keeps the two apart. The op lists
are parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from qdq.checks.float_by_design import FLOAT_BY_DESIGN_PARAMETERS, float_by_design, reads_float_by_design
from qdq.checks.node_units import DEFERRED_PARAMETERS, quantized_without_data
from qdq.graph import ir
from qdq.quant.index import DEQUANTIZE, QUANTIZE, QuantIndex, resolve_constant
from qdq.quant.operands import BIAS_INPUT, WEIGHT_INPUT, output_channel_axis
from qdq.rewrite.constant_eval import constant_ancestry
from qdq.rewrite.insertion import (
    describe_quantize,
    existing_quantize,
    quantize_for,
    quantize_hint,
    quantized_weight,
    read_through,
)
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError

# The op lists these rules read (which ops commute with Q/DQ, which fuse into a conv) are target
# knowledge: the rule set gives them (rules/trt.toml [params]); the defaults here are empty.
# What the rules about a conv and its fused residual Add read (QDQ802, QDQ803, QDQ807).
_RESIDUAL_PARAMETERS = {"ops": ["Add"], "fusible": [], "absorbed": [], "activations": []}


def is_quantized(index: QuantIndex, tensor: ir.Tensor, transparent: Iterable[str]) -> bool:
    """Whether the target reads this tensor as integers: made by a DQ, or from DQs by ops it moves DQs through."""
    transparent = set(transparent)
    while True:
        if index.dequantize_feeding(tensor) is not None:
            return True
        if len(tensor.inputs) != 1:
            return False  # a graph input or a constant
        producer = tensor.inputs[0]
        if producer.op not in transparent or not producer.inputs:
            return False
        if producer.op == "Concat":
            return all(is_quantized(index, t, transparent) for t in producer.inputs if not _constant(t))
        tensor = producer.inputs[0]


def _constant(tensor: ir.Tensor | None) -> bool:
    return tensor is not None and resolve_constant(tensor) is not None


def _computed_from_constants(tensor: ir.Tensor) -> bool:
    """A constant, or a few nodes from constants: PaddlePaddle writes a conv's bias as
    `Add(Conv, Reshape(Constant, Constant))`, an Add no residual rule is about."""
    return _constant(tensor) or constant_ancestry(tensor, limit=4) is not None


def _quantize_activation(ctx: FixContext, consumer: ir.Node, slot: int, code: str, why: str) -> list[Change]:
    """Give input `slot` of `consumer` a Q/DQ: the tensor's existing Q, else one from calibration data."""
    tensor = consumer.inputs[slot]
    measured = existing_quantize(tensor) is None
    quantize = quantize_for(ctx, tensor, ctx.params["calibrated_type"])
    if quantize is None:
        return []
    source = f"new Q/DQ ({describe_quantize(quantize)}) from the calibration data" if measured else \
        f"reads {mention(quantize)}'s value, as its other consumers do"
    return [read_through(ctx, consumer, slot, quantize, code, f"{why}; {source}")]


@register
class FloatInput(Rule):
    """Every data and weight input of a quantizable op should be dequantized, or the op runs in float.

    (A bias, shape operands and other constants are not checked.)

    Why: TensorRT (and onnxruntime's node units) fuse an op into an INT8 kernel only when every
    input comes from a DQ. A Conv whose input or weight is float runs in FP16/FP32, with
    conversion layers around it. Inputs made from DQs by ops the target moves DQs through
    (`transparent`: MaxPool, Reshape, Concat, ...) count as quantized. Ops whose output is a
    graph output are skipped when `skip_graph_outputs` is true (detection heads are often kept
    float on purpose).

    Example: `x → Conv(W)` with no Q/DQ on `x`, while `Q(x) → DQ → Conv_other` exists. The fix
    makes the Conv read that DQ (data-free). A float weight is quantized from its own values
    (int8, per output channel, max-abs). A tensor with no Q anywhere needs a scale from data:
    `qdq fix --calibrate inputs.npz`. Approximate: the op now sees rounded values.

    Inputs another rule resolves without data are that rule's finding, reported once: a float
    edge inside a BatchNormalization or constant-scaling chain that QDQ204 folds into the conv
    before it (FX QAT's `Conv → Div → Add → BatchNormalization`; `exact_rtol` and
    `fold_scaling_ops` as for QDQ204), and an output QDQ805 quantizes from its fixed range
    (`ranges` as for QDQ805, Sigmoid in SiLU; both in [params]).
    """

    code = "QDQ801"
    name = "float-input"
    message = "{node}: {kind} input {tensor} of the {op} is not quantized, so the {op} runs in float{how}"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {
        "ops": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
        "transparent": [],
        "skip_graph_outputs": True,
        "calibrated_type": "int8",
        **DEFERRED_PARAMETERS,
        **FLOAT_BY_DESIGN_PARAMETERS,
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops = set(ctx.params["ops"])
        elsewhere = quantized_without_data(ctx)
        for node in ctx.index.nodes_of(ops):
            if ctx.params["skip_graph_outputs"] and _writes_graph_output(ctx.index, node):
                continue
            if float_by_design(ctx, node) is not None:
                continue  # QDQ808's: the target runs it faster in float
            for slot, tensor in enumerate(node.inputs):
                if tensor is None or tensor.name == "" or slot == BIAS_INPUT.get(node.op):
                    continue  # a float bias is what TensorRT and onnxruntime expect
                if reads_float_by_design(ctx, node, slot):
                    continue  # weight-only quantization keeps activations float
                if id(tensor) in elsewhere:
                    continue  # QDQ204 or QDQ805 resolves it without data
                if slot != WEIGHT_INPUT.get(node.op) and _constant(tensor):
                    continue  # shapes, sizes and constant operands are not the op's data
                if is_quantized(ctx.index, tensor, ctx.params["transparent"]):
                    continue
                weight = slot == WEIGHT_INPUT.get(node.op) and isinstance(tensor, ir.Constant)
                if slot == WEIGHT_INPUT.get(node.op) and _constant(tensor) and not weight:
                    fixable, how = False, " (a weight behind Identity/Cast: fold it first)"
                elif weight:
                    fixable, how = True, ""
                else:
                    fixable, how = quantize_hint(ctx, tensor)
                yield self.finding(ctx, node, [tensor], subject=(node, slot, weight), fixable=fixable,
                                   kind="weight" if weight else "data", tensor=tensor.name, op=node.op, how=how,
                                   standalone=_output_quantizes(ctx, node))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slot, weight = finding.subject
        if weight:
            axis = output_channel_axis(node, len(node.inputs[slot].shape))
            return [quantized_weight(ctx, node, slot, axis, self.code)]
        return _quantize_activation(ctx, node, slot, self.code, f"{node.op} input quantized so it runs in INT8")


def _output_quantizes(ctx: CheckContext, node: ir.Node) -> list[str]:
    """The Qs that read the node's output, directly, after one activation (Relu, Clip) or through
    ops TensorRT moves Qs through (`transparent`): when the node writes float, each runs alone."""
    found: list[str] = []
    stack = [(node.outputs[0], True)]
    while stack:
        tensor, activation_allowed = stack.pop()
        for consumer, _ in ctx.index.consumers_through(tensor):
            if consumer.op == QUANTIZE:
                found.append(mention(consumer))
            elif consumer.outputs and (consumer.op in ctx.params["transparent"] or (
                    activation_allowed and consumer.op in ("Relu", "Clip"))):
                stack.append((consumer.outputs[0], False))
    return found


def _writes_graph_output(index: QuantIndex, node: ir.Node) -> bool:
    return any(index.is_graph_output(t) for t in node.outputs)


@dataclass
class _Branch:
    """The fusible side of a residual Add: the weighted op, any Q/DQ pair between it and the Add,
    and the activation between them (None for a Conv+Add)."""

    producer: ir.Node
    quantize: ir.Node | None = None
    activation: ir.Node | None = None


class _ResidualRule(Rule):
    """Finds residual Adds: an Add one of whose inputs a single-consumer Conv (or ConvTranspose) makes."""

    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE

    def residual_adds(self, ctx: CheckContext) -> Iterable[tuple[ir.Node, int, _Branch]]:
        """Each residual Add with the slot of its conv branch (the deeper one when both qualify)."""
        depth = _depths(ctx.graph)
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            if len(node.inputs) != 2 or any(_computed_from_constants(t) for t in node.inputs):
                continue
            branches = [_fused_branch(ctx, t) for t in node.inputs]
            slots = [i for i, b in enumerate(branches) if b is not None]
            if not slots:
                continue
            slot = max(slots, key=lambda i: (depth.get(id(branches[i].producer), 0), -i))
            yield node, slot, branches[slot]


def _fused_branch(ctx: CheckContext, tensor: ir.Tensor) -> _Branch | None:
    """The weighted op this Add input comes from, if TensorRT can fuse the Add into it.

    Walks back through one Q/DQ pair that serves only this edge, one activation of the conv
    (`activations`; ModelOpt counts it in the conv's branch) and ops the target folds into the
    weighted op (`absorbed`, e.g. BatchNormalization); every tensor on the way must have this
    path as its only consumer (a SiLU's input: its Sigmoid and Mul).
    """
    index = ctx.index
    quantize = activation = None
    node = _single_producer(index, tensor)
    if node is not None and node.op == DEQUANTIZE:
        before = _single_producer(index, node.inputs[0])
        if before is None or before.op != QUANTIZE:
            return None
        quantize, node = before, _single_producer(index, before.inputs[0])
    if node is not None and _activation_input(ctx, node) is not None:
        activation, x = node, _activation_input(ctx, node)
        node = _single_producer(index, x) if node.op != "Mul" else (
            x.inputs[0] if len(x.inputs) == 1 and not index.is_graph_output(x) else None)
    while node is not None and node.op in ctx.params["absorbed"]:
        node = _single_producer(index, node.inputs[0])
    if node is None or node.op not in ctx.params["fusible"]:
        return None
    return _Branch(node, quantize, activation)


def _activation_input(ctx: CheckContext, node: ir.Node) -> ir.Tensor | None:
    """The tensor an activation of `activations` reads; a SiLU is Mul(x, Sigmoid(x)), read as x."""
    if node.op == "Mul" and "Sigmoid" in ctx.params["activations"]:
        for x, other in (node.inputs, node.inputs[::-1]):
            sigmoid = other.inputs[0] if len(other.inputs) == 1 else None
            if sigmoid is not None and sigmoid.op == "Sigmoid" and sigmoid.inputs[0] is x and \
                    {id(n) for n in x.outputs} == {id(node), id(sigmoid)} and len(other.outputs) == 1:
                return x
        return None
    return node.inputs[0] if node.op in ctx.params["activations"] and node.inputs else None


def _single_producer(index: QuantIndex, tensor: ir.Tensor) -> ir.Node | None:
    """The node making `tensor` (through pass-throughs) when `tensor` has no other use."""
    while True:
        if len(tensor.inputs) != 1 or len(tensor.outputs) != 1 or index.is_graph_output(tensor):
            return None
        producer = tensor.inputs[0]
        if not index.is_pass_through(producer):
            return producer
        tensor = producer.inputs[0]


def _depths(graph: ir.Graph) -> dict[int, int]:
    """The longest path from the graph inputs to each node (nodes are in topological order)."""
    depth: dict[int, int] = {}
    for node in graph.nodes:
        parents = [depth.get(id(t.inputs[0]), 0) for t in node.inputs if t is not None and len(t.inputs) == 1]
        depth[id(node)] = 1 + max(parents, default=0)
    return depth


@register
class FloatResidual(_ResidualRule):
    """The residual (identity) input of a Conv+Add should be quantized, so the fused layer writes INT8.

    Why: TensorRT fuses an Add into the Conv that feeds it, and "the precision of the first
    input to the element-wise addition determines the precision of the output of the fusion".
    With a float residual the fused Conv+Add writes FP16 and the Q after it runs as a separate
    conversion layer (NVIDIA's ResNet-18 `qat` engine: 10 such layers; `qat-residual`: 3).
    The conv branch is the input a single-consumer Conv makes (through `absorbed` ops such as
    BatchNormalization); when both inputs qualify, the deeper one.

    Example: `x → Q → DQ → Conv1 → ... → Conv2 → Add ← x` (pytorch-quantization's default). The
    fix makes the Add read `DQ(Q(x))`, the Q/DQ `x` already has for Conv1 (data-free). Without
    one (a downsample shortcut), the scale needs data: `qdq fix --calibrate inputs.npz`.
    Approximate: the residual is now rounded to the input grid.
    """

    code = "QDQ802"
    name = "float-residual"
    message = "{node}: residual input {residual} is float, so {conv} + {node} fuse with a float output{how}"
    parameters = {**_RESIDUAL_PARAMETERS, "transparent": [], "calibrated_type": "int8"}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, slot, branch in self.residual_adds(ctx):
            residual = node.inputs[1 - slot]
            own = existing_quantize(residual)
            # Integers reach the Add through ops TensorRT moves DQs through (a Concat of DQs); but a
            # Q the residual has for other readers is NVIDIA's residual Q/DQ, at no cost: read it.
            if is_quantized(ctx.index, residual, ctx.params["transparent"]) and (
                    own is None or ctx.index.dequantize_feeding(residual) is not None):
                continue
            fixable, how = quantize_hint(ctx, residual)
            # The fused layer writes float, so the Qs after it run alone; and a Q the residual has
            # for other readers runs alone too, since its producer must also write float for the Add.
            standalone = _output_quantizes(ctx, node) + ([mention(own)] if own is not None else [])
            yield self.finding(ctx, node, [residual], subject=(node, 1 - slot), fixable=fixable,
                               residual=residual.name, conv=mention(branch.producer), how=how, standalone=standalone)

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slot = finding.subject
        return _quantize_activation(ctx, node, slot, self.code, "residual input quantized so Conv+Add writes INT8")


@register
class QdqInFusedBranch(_ResidualRule):
    """No Q/DQ pair between a Conv and the residual Add it feeds: it keeps TensorRT from fusing them.

    Why: TensorRT's guide (Figure 9): an extra Q/DQ between Conv and Add "forces the separation
    of the convolution operator from the element-wise addition operator"; both layers and a
    conversion layer run instead of one fused kernel. NVIDIA's placement tools quantize only
    the residual input of the Add. A conv branch that ends in an activation (Conv→BN→SiLU→Add,
    YOLO's bottlenecks) is ModelOpt's fusible backbone too; with `residual_after_activation =
    "shared"` (NVIDIA's yolov7 QAT rules) its Q/DQ stays and QDQ807 gives it the residual's scale.

    Example: `Conv → Q → DQ → Add ← DQ ← Q ← x` (onnxruntime's quantizer quantizes every Add
    input). The fix makes the Add read the Conv's float output directly. Approximate: one
    rounding of the conv output is gone, which TensorRT's fused kernel does not do either.
    """

    code = "QDQ803"
    name = "qdq-in-fused-branch"
    message = "{node}: {quantize} between {conv} and {node} keeps them from fusing"
    parameters = {**_RESIDUAL_PARAMETERS, "residual_after_activation": "float-branch"}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        shared = _residual_mode(ctx) == "shared"
        for node, slot, branch in self.residual_adds(ctx):
            if branch.quantize is not None and not (shared and branch.activation is not None):
                yield self.finding(ctx, node, [branch.quantize.outputs[0]], subject=(node, slot, branch.quantize),
                                   quantize=mention(branch.quantize), conv=mention(branch.producer),
                                   standalone=[mention(branch.quantize)])

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slot, quantize = finding.subject
        before = quantize.inputs[0]
        ctx.edits.set_input(node, slot, before)
        return [Change(self.code, mention(node), before.name, f"Q/DQ ({describe_quantize(quantize)})", "float",
                       f"removed {mention(quantize)} and its DQ so the Conv and the Add fuse")]


def _before_qdq(tensor: ir.Tensor) -> tuple[ir.Tensor, ir.Node | None]:
    """The tensor a Q→DQ pair making `tensor` reads, and that Q (else `tensor` itself and None)."""
    dequantize = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if dequantize is None or dequantize.op != DEQUANTIZE or len(dequantize.inputs[0].inputs) != 1:
        return tensor, None
    quantize = dequantize.inputs[0].inputs[0]
    return (quantize.inputs[0], quantize) if quantize.op == QUANTIZE else (tensor, None)


def _conv_output(ctx: CheckContext, tensor: ir.Tensor) -> ir.Node | None:
    """The `fusible` op making `tensor`, through `absorbed` ops (BatchNormalization)."""
    node = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    while node is not None and node.op in ctx.params["absorbed"]:
        node = node.inputs[0].inputs[0] if len(node.inputs[0].inputs) == 1 else None
    return node if node is not None and node.op in ctx.params["fusible"] else None


def _activation_reads(ctx: CheckContext, node: ir.Node) -> Iterable[tuple[int, ir.Tensor, ir.Node, ir.Node]]:
    """(slot, float tensor, Q, conv) for each input of a conv's activation that goes through a Q/DQ:
    the activation's input, and in a SiLU both the Mul's x and its Sigmoid output."""
    if node.op in ctx.params["activations"] and node.inputs:
        source, quantize = _before_qdq(node.inputs[0])
        conv = _conv_output(ctx, source)
        if quantize is not None and conv is not None:
            yield 0, source, quantize, conv
    if node.op != "Mul" or "Sigmoid" not in ctx.params["activations"] or len(node.inputs) != 2:
        return
    (a, qa), (b, qb) = (_before_qdq(t) for t in node.inputs)
    for slot, (mine, quantize), other in ((0, (a, qa), b), (1, (b, qb), a)):
        sigmoid = next((t.inputs[0] for t in (mine, other) if len(t.inputs) == 1 and t.inputs[0].op == "Sigmoid"), None)
        x = other if mine is (sigmoid.outputs[0] if sigmoid else None) else mine
        conv = _conv_output(ctx, x) if sigmoid is not None and _before_qdq(sigmoid.inputs[0])[0] is x else None
        if quantize is not None and conv is not None:
            yield slot, mine, quantize, conv


@register
class QdqBeforeActivation(Rule):
    """No Q/DQ pair between a Conv (or its BatchNormalization) and the activation that follows it.

    Why: TensorRT fuses Conv+BN+activation into one kernel that applies the activation to the
    unquantized accumulator; a Q/DQ in between makes the Conv write INT8 and the activation run
    as a separate layer (TensorRT guide §7.4.4; ModelOpt keeps Conv-Sigmoid-Mul in one
    partition). In a SiLU, Mul(x, Sigmoid(x)), no input of the Sigmoid or the Mul is quantized.

    Example: `Conv → Q → DQ → Sigmoid → Q → DQ → Mul` (onnxruntime's quantizer quantizes every
    activation). The fix makes the Sigmoid and the Mul read the Conv output and the Sigmoid
    output directly. Approximate: the roundings TensorRT's fused kernel does not do are gone.
    """

    code = "QDQ806"
    name = "qdq-before-activation"
    message = "{node}: {quantize} between {conv} and this {op} keeps the activation out of the conv"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"fusible": [], "absorbed": [], "activations": []}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.graph.nodes:
            for slot, source, quantize, conv in _activation_reads(ctx, node):
                yield self.finding(ctx, node, [quantize.outputs[0]], subject=(node, slot, source, quantize),
                                   quantize=mention(quantize), conv=mention(conv), op=node.op, standalone=[mention(quantize)])

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slot, source, quantize = finding.subject
        ctx.edits.set_input(node, slot, source)
        return [Change(self.code, mention(node), source.name, f"Q/DQ ({describe_quantize(quantize)})", "float",
                       f"removed {mention(quantize)} and its DQ so the activation fuses into the conv")]


@register
class UnsharedActivatedResidual(_ResidualRule):
    """With `residual_after_activation = "shared"`: both inputs of an Add after a conv's activation on one scale.

    Why: NVIDIA's yolov7 QAT rules (yolo_deepstream `QuantAdd`) quantize both inputs of a
    bottleneck's Add with one quantizer, the residual's, so the Add reads one INT8 grid and
    needs no requantize. ModelOpt instead leaves the conv branch float (QDQ803, the default):
    which of the two TensorRT runs faster is not documented, so the rule set chooses.

    Example: `Conv → BN → SiLU → Q(s1) → DQ → Add ← DQ ← Q(s2) ← x`. The fix quantizes the
    SiLU output with the residual's scale and zero-point (data-free). Approximate: the conv
    branch is rounded to the residual's grid.
    """

    code = "QDQ807"
    name = "unshared-activated-residual"
    message = "{node}: the activated conv input {branch} is {state}, not on the residual's scale ({residual})"
    parameters = {**_RESIDUAL_PARAMETERS, "residual_after_activation": "float-branch"}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if _residual_mode(ctx) != "shared":
            return
        for node, slot, branch in self.residual_adds(ctx):
            residual = node.inputs[1 - slot]
            dequantize = residual.inputs[0] if len(residual.inputs) == 1 else None
            if branch.activation is None or dequantize is None or dequantize.op != DEQUANTIZE:
                continue  # QDQ802 quantizes a float residual first
            # Compared as the index resolves them (Constant nodes too, as ModelOpt writes them): comparing
            # only initializers found a Q of this very fix unshared again, and the fix added another each round.
            params = ctx.index.params
            if branch.quantize is not None and params(branch.quantize).same_values(params(dequantize)):
                continue
            state = "float" if branch.quantize is None else f"on {describe_quantize(branch.quantize)}"
            yield self.finding(ctx, node, [node.inputs[slot]], subject=(node, slot, dequantize),
                               branch=node.inputs[slot].name, state=state, residual=describe_quantize(dequantize))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, slot, residual = finding.subject
        tensor = _before_qdq(node.inputs[slot])[0]
        # The index's type, not the zero-point's own: it may come from a Constant node or through a Cast (ModelOpt).
        dtype = ir.element_dtype(ctx.index.params(residual).elem_type)
        out = ir.Variable(ctx.new_name(f"{tensor.name}_quantized"), dtype=dtype, shape=tensor.shape)
        quantize = ir.Node(QUANTIZE, ctx.new_name(f"{tensor.name}_QuantizeLinear"),
                           inputs=[tensor, *residual.inputs[1:]], outputs=[out])
        ctx.edits.add_node(quantize)
        reason = "quantized with the residual's scale, as NVIDIA's yolov7 QAT rules do"
        return [read_through(ctx, node, slot, quantize, self.code, reason)]


def _residual_mode(ctx: CheckContext) -> str:
    mode = ctx.params["residual_after_activation"]
    if mode not in ("float-branch", "shared"):
        raise RuleSetError(f"residual_after_activation must be \"float-branch\" or \"shared\", got {mode!r}")
    return mode
