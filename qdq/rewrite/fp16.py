"""A Q/DQ model's float parts in FP16, every Q/DQ kept: what TensorRT 11 needs and AutoCast refuses to do.

NVIDIA's AutoCast converts float models only ("does not yet support quantized models"), and
ModelOpt converts before it quantizes; a model quantized elsewhere (a PyTorch QAT export,
onnxruntime, NNCF) keeps FP32 float parts, which a strongly typed TensorRT 11 builds in FP32.
This module plans and makes the conversion the way ModelOpt's output looks: FP16 activations,
FP16 Q/DQ scales (opset 19, "the first to support fp16 scales"), and the model's FP32 interface
kept behind Casts unless FP16 I/O is asked for.

What stays FP32, with Casts around it (`Plan.kept`):
- the ops the rule set lists (`keep_fp32`, AutoCast's list) and ops ONNX does not define for
  FP16 at the opset;
- ops whose output could leave FP16's range. The Q/DQ bound the activations: a DequantizeLinear
  writes at most scale · max|q − zero-point|, and the bound is carried through ops whose output
  magnitude follows from their inputs' (`_bounds`); measured ranges (`--calibrate`) are used
  where given. An op whose bound is unknown is converted and counted as unchecked;
- Q/DQ whose scale FP16 cannot hold (below its smallest normal number or above its largest).
An FP32 op kept for its range that feeds FP16 is clipped to ±65504 before its Cast, so the Q
after it saturates as it did in FP32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from qdq.graph import float_types, ir
from qdq.graph.ops import DEQUANTIZE, QDQ_DOMAINS, QDQ_OPS, QUANTIZE
from qdq.quant.dtypes import quant_type
from qdq.quant.index import resolve_constant
from qdq.rewrite.rule import Change, FixContext

FP16_MAX = float(np.finfo(np.float16).max)  # 65504
FP16_TINY = float(np.finfo(np.float16).tiny)  # 2^-14, the smallest normal number
FP16_OPSET = 19  # QuantizeLinear/DequantizeLinear take FP16 scales from here on

# How an op's output magnitude follows from its inputs' bounds (ONNX semantics, not target knowledge).
_SAME = {"Relu", "MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool", "Reshape", "Transpose",
         "Flatten", "Squeeze", "Unsqueeze", "Concat", "Slice", "Split", "Gather", "Identity", "Dropout",
         "Pad", "Resize", "Upsample", "LeakyRelu", "Abs", "Neg", "Clip", "Expand", "Tile", "DepthToSpace",
         "SpaceToDepth", "ReduceMax", "ReduceMin", "ReduceMean"}
_UNIT = {"Sigmoid", "Tanh", "Softmax", "Erf", "HardSigmoid", "Cos", "Sin", "LogSoftmax"}
_WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


@dataclass
class Plan:
    """Which nodes compute in FP16 after the conversion and which stay FP32, and why."""

    convert: list[ir.Node] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # node name -> why it stays FP32
    unchecked: int = 0  # converted ops whose output bound is unknown
    bound: dict[str, float] = field(default_factory=dict)  # largest magnitude per tensor (inf: unknown)
    blocker: str | None = None  # why the model cannot be converted at all


def plan(graph: ir.Graph, opset: int, types: dict[str, int], keep_fp32: list[str],
         ranges: dict[str, tuple[float, float]] | None) -> Plan:
    result = Plan()
    target = max(opset, FP16_OPSET)
    if opset < FP16_OPSET:
        result.blocker = _opset_blocker(graph, opset, target)
        if result.blocker:
            return result
    bound = result.bound = _bounds(graph, ranges)
    for node in graph.nodes:
        float_out = [t for t in node.outputs if types.get(t.name) == TensorProto.FLOAT]
        # A Q of a constant (a fake-quantized weight) converts with the DQ that shares its scale.
        float_in = [t for t in node.inputs[:1 if node.op == QUANTIZE else None]
                    if (node.op == QUANTIZE or not isinstance(t, ir.Constant)) and types.get(t.name) == TensorProto.FLOAT]
        if not float_out and not float_in:
            continue
        why = _why_fp32(node, target, keep_fp32, bound, float_out, types)
        if why:
            result.kept[node.name] = why
            continue
        result.convert.append(node)
        if node.op not in QDQ_OPS and node.op != "Cast" and any(math.isinf(bound.get(t.name, math.inf)) for t in float_out):
            result.unchecked += 1
    return result


def _why_fp32(node: ir.Node, opset: int, keep_fp32: list[str], bound: dict[str, float],
              float_out: list[ir.Tensor], types: dict[str, int]) -> str | None:
    if node.op in QDQ_OPS and node.domain in QDQ_DOMAINS:
        scale = _constant(node.inputs[1])
        values = np.abs(scale.astype(np.float64)) if scale is not None and scale.dtype.kind == "f" else None
        if values is None or values.min() < FP16_TINY or values.max() > FP16_MAX:
            return "its scale is not a constant FP16 holds"
        return None
    if node.op in keep_fp32:
        return "the rule set keeps it FP32 (keep_fp32)"
    if node.subgraphs():
        return "it holds subgraphs, which are not converted"
    if node.op == "Constant" and not isinstance(node.attrs.get("value"), ir.Constant):
        return "a Constant without a tensor value"
    if node.op != "Cast" and not _fp16_allowed(node, opset, types):
        return f"ONNX defines no FP16 {node.op} at opset {opset}"
    largest = max((bound.get(t.name, math.inf) for t in float_out), default=0.0)
    if not math.isinf(largest) and largest > FP16_MAX:
        return f"its output can reach {largest:.4g}, beyond FP16's {FP16_MAX:g}"
    return None


def _float_formals(node: ir.Node, opset: int, types: dict[str, int]) -> set[str] | None:
    """The op's type parameters (`T`) that carry an FP32 computed tensor here; None without a schema."""
    schema = float_types.schema(node.op, node.domain or "", opset)
    if schema is None:
        return None
    formals = {schema.outputs[min(i, len(schema.outputs) - 1)].type_str
               for i, t in enumerate(node.outputs) if schema.outputs and types.get(t.name) == TensorProto.FLOAT}
    formals |= {schema.inputs[min(i, len(schema.inputs) - 1)].type_str for i, t in enumerate(node.inputs)
                if schema.inputs and not isinstance(t, ir.Constant) and types.get(t.name) == TensorProto.FLOAT}
    return formals


def _fp16_allowed(node: ir.Node, opset: int, types: dict[str, int]) -> bool:
    formals = _float_formals(node, opset, types)
    if formals is None:
        return False
    schema = float_types.schema(node.op, node.domain or "", opset)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    return all("tensor(float16)" in allowed.get(formal, {formal}) for formal in formals)


def _opset_blocker(graph: ir.Graph, opset: int, target: int) -> str | None:
    """Why raising the opset could change what an op means (a new version of it in between), or None."""
    for node in graph.nodes:
        if node.subgraphs():  # their nodes would need the same review, which is not done
            return f"{node.op} {node.name} holds subgraphs: the opset cannot be raised"
        if node.domain not in (None, "", "ai.onnx") or node.op in QDQ_OPS:
            continue  # Q/DQ-19 only add float8 types and `saturate` to what 10-13 compute
        old, new = (float_types.schema(node.op, "", v) for v in (opset, target))
        if old is None or new is None:
            return f"{node.op} has no ai.onnx schema at opset {opset} or {target}"
        if old.since_version != new.since_version and not _still_reads_as_written(node, new):
            return f"{node.op} {node.name} changes between opset {opset} and {target}: the opset cannot be raised"
    return None


def _still_reads_as_written(node: ir.Node, new: onnx.defs.OpSchema) -> bool:
    """Whether the newer version keeps every attribute the node sets and takes as many inputs: ONNX
    versions that only add optional attributes or inputs (Resize-19, Pad-19) keep the meaning;
    moving an attribute to an input (ReduceMean-18's axes) does not."""
    inputs = [p.name for p in new.inputs]
    if any(name not in new.attributes and name not in inputs for name in node.attrs):
        return False
    return len(node.inputs) <= len(new.inputs) or (new.inputs and new.inputs[-1].option ==
                                                   onnx.defs.OpSchema.FormalParameterOption.Variadic)


def _attributes_to_inputs(ctx: FixContext, node: ir.Node, opset: int) -> None:
    """An attribute the op takes as an input of the same name at `opset` (ReduceMean-18's axes) moves there."""
    new = float_types.schema(node.op, "", opset)
    if new is None:
        return
    inputs = [p.name for p in new.inputs]
    for name in [n for n in node.attrs if n not in new.attributes and n in inputs]:
        value = ir.Constant(ctx.new_name(f"{node.name}_{name}"), np.asarray(node.attrs[name], dtype=np.int64))
        ctx.edits.set_attr(node, name, None)
        ctx.edits.set_input(node, inputs.index(name), value)


def _bounds(graph: ir.Graph, ranges: dict[str, tuple[float, float]] | None) -> dict[str, float]:
    """The largest magnitude each float tensor can take (inf where unknown), from the Q/DQ's grids."""
    bound: dict[str, float] = {}
    for tensor in graph.inputs:
        bound[tensor.name] = math.inf
    for node in graph.nodes:
        inputs = [_input_bound(t, bound) for t in node.inputs]
        value = _node_bound(node, inputs)
        for tensor in node.outputs:
            measured = ranges.get(tensor.name) if ranges else None
            bound[tensor.name] = max(abs(measured[0]), abs(measured[1])) if measured else value
    return bound


def _input_bound(tensor: ir.Tensor, bound: dict[str, float]) -> float:
    if tensor.name in bound or not isinstance(tensor, ir.Constant):  # computed (a Constant node's too) or absent
        return bound.get(tensor.name, math.inf)
    values = tensor.values
    return float(np.abs(values.astype(np.float64)).max()) if values.size and values.dtype.kind in "fiu" else 0.0


def _node_bound(node: ir.Node, inputs: list[float]) -> float:
    if node.op == DEQUANTIZE and node.domain in QDQ_DOMAINS and len(node.inputs) > 1:
        return _dequantized_bound(node)
    if node.op == "Constant":
        value = _constant(node.outputs[0])
        return float(np.abs(value.astype(np.float64)).max(initial=0.0)) if value is not None and value.dtype.kind in "fiu" \
            else math.inf
    if node.op == "Clip" and len(inputs) > 2:
        return min(inputs[0], max(inputs[1:3]))
    if node.op in _SAME:
        return inputs[0] if node.op != "Concat" else max(inputs, default=math.inf)
    if node.op in _UNIT:
        return 1.0
    if node.op in ("Add", "Sub"):
        return sum(inputs[:2])
    if node.op == "Mul":
        return inputs[0] * inputs[1] if len(inputs) > 1 else math.inf
    if node.op in _WEIGHTED and len(node.inputs) > 1:
        return _weighted_bound(node, inputs)
    return math.inf


def _constant(tensor: ir.Tensor) -> np.ndarray | None:
    """A constant's values, through Constant nodes, Identity and Cast (None if computed)."""
    source = resolve_constant(tensor)
    return source.constant.values if source is not None else None


def _dequantized(node: ir.Node) -> np.ndarray | None:
    """A DQ of constant integers, computed: (q − zero-point) · scale along its axis (None if not constant)."""
    integers, scale = _constant(node.inputs[0]), _constant(node.inputs[1])
    if integers is None or scale is None or integers.dtype.kind not in "iu" or node.attrs.get("block_size"):
        return None
    zero = _constant(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    zero = np.zeros(1) if zero is None else zero.astype(np.float64)
    shape = [1] * integers.ndim
    if scale.size > 1:
        shape[node.attrs.get("axis", 1) % integers.ndim] = -1
    return (integers.astype(np.float64) - zero.reshape(shape if zero.size > 1 else [1] * integers.ndim)) \
        * scale.astype(np.float64).reshape(shape if scale.size > 1 else [1] * integers.ndim)


def _dequantized_bound(node: ir.Node) -> float:
    """scale · max|q − zero-point|: over the stored integers of a weight, over the type's range otherwise."""
    values = _dequantized(node)
    if values is not None:
        return float(np.abs(values).max(initial=0.0))
    scale = _constant(node.inputs[1])
    zero = _constant(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    qtype = quant_type(float_types.element_type(zero.dtype if zero is not None else node.inputs[0].dtype)
                       or TensorProto.INT8)
    if scale is None or qtype is None:
        return math.inf
    z = zero.astype(np.float64) if zero is not None else np.zeros(1)
    steps = max(abs(qtype.qmin - float(z.min())), abs(qtype.qmax - float(z.max())))
    return steps * float(np.abs(scale.astype(np.float64)).max())


def _weighted_bound(node: ir.Node, inputs: list[float]) -> float:
    """|x| · the largest sum of |W| over one output (+ |bias|), with W a constant or a dequantized constant."""
    producer = node.inputs[1].inputs[0] if node.inputs[1].inputs else None
    if producer is not None and producer.op == DEQUANTIZE:
        weight = _dequantized(producer)
        fake = producer.inputs[0].inputs[0] if producer.inputs[0].inputs else None
        if weight is None and fake is not None and fake.op == QUANTIZE:  # a fake-quantized float weight
            weight = _constant(fake.inputs[0])
    else:
        weight = _constant(node.inputs[1])
    if weight is None or weight.dtype.kind != "f" or weight.ndim < 1 or math.isinf(inputs[0]):
        return math.inf
    w = np.abs(weight.astype(np.float64))
    if node.op in ("Conv", "ConvTranspose"):
        axis = 1 if node.op == "ConvTranspose" else 0
        per_output = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).sum(axis=1)
    elif node.op == "Gemm" and node.attrs.get("transB", 0):  # B is [N, K]
        per_output = w.reshape(w.shape[0], -1).sum(axis=1)
    else:
        per_output = w.reshape(-1, w.shape[-1]).sum(axis=0)
    bias = inputs[2] if len(inputs) > 2 else 0.0
    if node.op == "Gemm":  # alpha · A·B + beta · C
        return abs(node.attrs.get("alpha", 1.0)) * inputs[0] * float(per_output.max(initial=0.0)) \
            + abs(node.attrs.get("beta", 1.0)) * bias
    return inputs[0] * float(per_output.max(initial=0.0)) + bias


def convert(ctx: FixContext, chosen: Plan, types: dict[str, int], fp16_io: bool, code: str) -> list[Change]:
    """Make `chosen.convert` compute in FP16 through `ctx.edits`; Casts where FP32 and FP16 meet."""
    graph = ctx.graph
    converted = {id(n) for n in chosen.convert}
    interface = {id(t) for t in graph.inputs} | {id(t) for t in graph.outputs}
    casts: dict[tuple[str, int], ir.Tensor] = {}
    scales = constants = 0

    def cast(tensor: ir.Tensor, to: int) -> ir.Tensor:
        key = (tensor.name, to)
        if key not in casts:
            source = tensor
            if to == TensorProto.FLOAT16 and FP16_MAX < chosen.bound.get(tensor.name, 0.0) < math.inf:
                # An FP32 op kept for its range feeds FP16: clipped first, so a Q after it saturates, not reads inf.
                source = ir.Variable(ctx.new_name(f"{tensor.name}_clipped"), np.float32, getattr(tensor, "shape", None))
                limits = [ir.Constant(ctx.new_name(f"{tensor.name}_{end}"), np.float32(sign * FP16_MAX))
                          for end, sign in (("min", -1), ("max", 1))]
                ctx.edits.add_node(ir.Node("Clip", ctx.new_name(f"{tensor.name}_clip"), {}, [tensor, *limits], [source]))
            out = ir.Variable(ctx.new_name(f"{tensor.name}_{'fp16' if to == TensorProto.FLOAT16 else 'fp32'}"),
                              ir.element_dtype(to), getattr(tensor, "shape", None))
            ctx.edits.add_node(ir.Node("Cast", ctx.new_name(f"{tensor.name}_cast"), {"to": to}, [source], [out]))
            casts[key] = out
        return casts[key]

    halves: dict[int, ir.Constant] = {}  # by identity: a Constant node's value has no name

    def half(tensor: ir.Constant) -> ir.Constant:
        if id(tensor) not in halves:
            name = ctx.new_name(f"{tensor.name}_fp16") if tensor.name else ""
            halves[id(tensor)] = ir.Constant(name, tensor.values.astype(np.float16))
        return halves[id(tensor)]

    was_fp32 = {t.name for n in chosen.convert for t in n.outputs if types.get(t.name) == TensorProto.FLOAT}
    if fp16_io:
        for tensor in graph.inputs:
            if types.get(tensor.name) == TensorProto.FLOAT and any(id(r) in converted for r in tensor.outputs):
                ctx.edits.set_type(tensor, np.float16)
                was_fp32.add(tensor.name)
    for node in chosen.convert:
        slots = _float_slots(node, max(ctx.model.opset, FP16_OPSET), types)
        for slot, tensor in enumerate(list(node.inputs)):
            if slot not in slots or types.get(tensor.name) != TensorProto.FLOAT or tensor.name in was_fp32:
                continue
            if isinstance(tensor, ir.Constant):
                if node.op in QDQ_OPS and slot == 1:
                    ctx.edits.swap_params(node, half(tensor))
                    scales += 1
                else:
                    ctx.edits.set_input(node, slot, half(tensor))
                    constants += 1
            else:  # a graph input or the output of an op kept FP32
                ctx.edits.set_input(node, slot, cast(tensor, TensorProto.FLOAT16))
        if node.op == "Constant":
            ctx.edits.set_attr(node, "value", half(node.attrs["value"]))
            constants += 1
        if node.op == "Cast" and node.attrs.get("to") == TensorProto.FLOAT:
            ctx.edits.set_attr(node, "to", TensorProto.FLOAT16)
        if node.op == DEQUANTIZE and node.attrs.get("output_dtype") == TensorProto.FLOAT:
            ctx.edits.set_attr(node, "output_dtype", TensorProto.FLOAT16)
    for node in list(graph.nodes):  # ops kept FP32 read FP32 (a graph output's FP32 value too: its Cast below)
        if id(node) in converted:
            continue
        for slot, tensor in enumerate(list(node.inputs)):
            if tensor.name in was_fp32:
                ctx.edits.set_input(node, slot, cast(tensor, TensorProto.FLOAT))
    outputs = 0
    for tensor in [t for t in graph.outputs if t.name in was_fp32]:
        if fp16_io:
            continue
        producer = tensor.inputs[0]
        inner = ir.Variable(ctx.new_name(f"{tensor.name}_fp16"), np.float16, tensor.shape)
        ctx.edits.set_output(producer, list(producer.outputs).index(tensor), inner)
        ctx.edits.replace_uses(tensor, inner)
        ctx.edits.add_node(ir.Node("Cast", ctx.new_name(f"{tensor.name}_cast"), {"to": TensorProto.FLOAT},
                                   [inner], [tensor]))
        outputs += 1
    for node in chosen.convert:
        for tensor in node.outputs:
            if tensor.name in was_fp32 and (fp16_io or id(tensor) not in interface):
                ctx.edits.set_type(tensor, np.float16)
    kept = f"; kept FP32: {len(chosen.kept)} op(s)" if chosen.kept else ""
    unchecked = f"; {chosen.unchecked} op(s) without a bound from the Q/DQ (FP16 range not checked)" \
        if chosen.unchecked else ""
    return [Change(code, None, None, "FP32", "FP16",
                   f"float parts to FP16: {len(chosen.convert)} op(s), {scales} scale(s), {constants} constant(s), "
                   f"{len(casts) + outputs} Cast(s){kept}{unchecked}",
                   {"ops": len(chosen.convert), "scales": scales, "constants": constants,
                    "casts": len(casts) + outputs, "kept_fp32": chosen.kept, "unchecked": chosen.unchecked})]


def _float_slots(node: ir.Node, opset: int, types: dict[str, int]) -> set[int]:
    """The input slots that take the type of the op's FP32 tensors (not Resize's scales, not a Q/DQ's integers)."""
    if node.op in QDQ_OPS and node.domain in QDQ_DOMAINS:
        return {0, 1} if node.op == QUANTIZE else {1}
    formals = _float_formals(node, opset, types) or set()
    schema = float_types.schema(node.op, node.domain or "", opset)
    if schema is None or not schema.inputs:
        return set()
    return {i for i in range(len(node.inputs)) if schema.inputs[min(i, len(schema.inputs) - 1)].type_str in formals}


def raise_opset(ctx: FixContext, version: int) -> None:
    """Import ai.onnx at `version` (and the IR version it needs): FP16 scales need opset 19. Attributes
    that became inputs on the way move (`_opset_blocker` has refused any other change)."""
    for node in list(ctx.graph.nodes):
        if node.domain in (None, "", "ai.onnx") and node.op not in QDQ_OPS:
            _attributes_to_inputs(ctx, node, version)
    model = ctx.model
    for entry in model.proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    needed = helper.find_min_ir_version_for([helper.make_opsetid("", version)])
    if model.proto.ir_version < needed:
        model.proto.ir_version = needed
    model.opset = version
