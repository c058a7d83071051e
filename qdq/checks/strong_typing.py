"""QDQ901-903: what a strongly typed TensorRT 11 network builds from a Q/DQ model's float types.

TensorRT 11 removed weak typing: every layer runs in the type of its ONNX tensors, and the
`--fp16`/`--int8` build flags that used to let unquantized layers run in FP16 are gone. So the
float parts of a Q/DQ model decide the engine's float precision, and a DequantizeLinear outputs
its scale's type. The types come from `qdq.graph.float_types`.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

import numpy as np
from onnx import TensorProto, helper

from qdq.graph import float_types, ir
from qdq.graph.normalize import inferred_types
from qdq.graph.ops import QDQ_DOMAINS, QDQ_OPS, QUANTIZE
from qdq.graph.write import export_model
from qdq.quant.dtypes import type_name
from qdq.rewrite import fp16
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register

# Nodes that only convert or hold values: never part of a float region.
_NOT_COMPUTE = frozenset({*QDQ_OPS, "Cast", "CastLike", "Constant"})


def tensor_types(ctx: CheckContext) -> dict[str, int]:
    """Every tensor's element type, inferred once per index (the rules below share it)."""
    memo = ctx.index.memo
    if "float_types" not in memo:
        memo["float_types"] = float_types.infer(ctx.graph, ctx.model.opset)
    return memo["float_types"]


def fp32_regions(graph: ir.Graph, types: dict[str, int], keep_fp32: Iterable[str],
                 kept: Iterable[ir.Node] = ()) -> list[list[ir.Node]]:
    """Connected groups of nodes that write an FP32 tensor, in graph order: Q/DQ, Casts, `keep_fp32`
    ops and the nodes the FP16 conversion keeps FP32 on purpose (`kept`) left out."""
    keep, skip = set(keep_fp32), {id(n) for n in kept}
    members = [n for n in graph.nodes if n.op not in _NOT_COMPUTE and n.op not in keep and id(n) not in skip
               and any(types.get(t.name) == TensorProto.FLOAT for t in n.outputs)]
    parent = {id(n): id(n) for n in members}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for node in members:
        for tensor in node.inputs:
            for producer in tensor.inputs:
                if id(producer) in parent:
                    parent[root(id(producer))] = root(id(node))
    regions: dict[int, list[ir.Node]] = {}
    for node in members:
        regions.setdefault(root(id(node)), []).append(node)
    return list(regions.values())


def element_counts(ctx: CheckContext) -> dict[str, int]:
    """Tensor name → element count as ONNX shape inference finds it, a symbolic dimension (the batch)
    taken as 1, as ModelOpt does (once per index)."""
    memo = ctx.index.memo
    if "element_counts" not in memo:
        counts = {}
        for name, type_proto in inferred_types(export_model(ctx.graph, ctx.model.proto)).items():
            dims = type_proto.tensor_type.shape.dim
            if all(d.HasField("dim_value") or d.HasField("dim_param") for d in dims):
                counts[name] = math.prod(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
        memo["element_counts"] = counts
    return memo["element_counts"]


@register
class FloatRemainder(Rule):
    """Ops of a Q/DQ model that compute in FP32 build FP32 on TensorRT 11.

    What: the float parts of a quantized model (everything between the quantized layers: the
    ops no Q/DQ fuses into, and the float side of every DequantizeLinear) are FP32. Each finding
    is one connected region of ops writing FP32 tensors, with its size (ops, FP32 activation
    elements where the shapes are known) and what it costs: FP32 activations move twice the
    bytes of FP16, and FP32 convolutions and GEMMs run without FP16 tensor cores (TF32 at best).
    Casts, Q/DQ and the ops the rule set keeps FP32 on purpose (`keep_fp32`) are not counted.

    Why: TensorRT 11 builds every network strongly typed; the `--fp16` flag that made such
    regions FP16 on TensorRT 10 is gone ("A FP32 ONNX produces a FP32 engine. Run AutoCast
    first": NVIDIA's trt-strong-typing-migration skill; TensorRT 10.x-to-11.x migration guide,
    trtexec flags). A DequantizeLinear outputs its scale's type, so FP32 scales keep the ops
    after it FP32 (ONNX DequantizeLinear-21; NVIDIA's ModelOpt: a leftover scale cast "forces
    DQ outputs to FP32, breaking downstream FP16 matmul/add operations under strongly-typed TRT
    parsing"). NVIDIA's AutoCast refuses models that already have Q/DQ.

    Example: a PyTorch QAT export (FP32 Conv → Relu → Add with FP32-scale Q/DQ) reports one
    region per connected FP32 part; ModelOpt 0.37+ INT8 output (FP16 inside, FP32 graph I/O
    behind Casts) reports none.

    The fix (approximate: FP16 rounds) converts the whole model as ModelOpt's output looks and
    keeps every Q/DQ (`qdq.rewrite.fp16`): FP16 activations, constants and Q/DQ scales, the opset raised
    to 19 where no op changes meaning on the way (an attribute that became an input, as
    ReduceMean-18's axes, moves there), the FP32 interface kept behind Casts (`fp16_io = true`
    makes it FP16). Ops stay FP32, behind Casts, where the rule set says (`keep_fp32`), where
    ONNX has no FP16 version, and where the Q/DQ grids bound their output beyond FP16's 65504
    (a DQ writes at most scale · max|q − zero-point|; `--calibrate` ranges are used where
    given); those are not reported. A model whose opset cannot be raised is not fixed.
    """

    code = "QDQ901"
    name = "float-remainder"
    message = "{count} op(s) compute in FP32 between the quantized layers ({ops}); {cost}"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"keep_fp32": [], "fp16_io": False}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        types = tensor_types(ctx)
        plan = self._plan(ctx)
        kept = [node for node in ctx.graph.nodes if node.name in plan.kept]
        for region in fp32_regions(ctx.graph, types, ctx.params["keep_fp32"], kept):
            written = [t for node in region for t in node.outputs if types.get(t.name) == TensorProto.FLOAT]
            counts = element_counts(ctx)
            sizes = [counts.get(t.name) for t in written]
            elements = sum(s for s in sizes if s is not None)
            ops = Counter(node.op for node in region)
            cost = (f"TensorRT 11 builds them FP32: {elements} FP32 activation elements, {2 * elements} bytes "
                    f"more than FP16" + ("" if None not in sizes else " (some shapes unknown)")
                    if elements else "TensorRT 11 builds them FP32")
            if plan.blocker:
                cost += f"; no FP16 conversion: {plan.blocker}"
            yield self.finding(ctx, region[0], written[:1], subject=region, fixable=plan.blocker is None,
                               count=len(region), ops=", ".join(f"{n} {op}" for op, n in ops.most_common()),
                               op_counts=dict(ops), nodes=[mention(n) for n in region], elements=elements,
                               known_sizes=None not in sizes, cost=cost, blocker=plan.blocker)

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        """The whole model at once (the first region's fix converts every region; the rest find it done)."""
        if ctx.index.memo.get("fp16_converted"):
            return []
        ctx.index.memo["fp16_converted"] = True
        plan, changes = self._plan(ctx), []
        if ctx.model.opset < fp16.FP16_OPSET:
            changes.append(Change(self.code, None, None, f"opset {ctx.model.opset}", f"opset {fp16.FP16_OPSET}",
                                  "opset raised for FP16 scales (attributes that became inputs moved, no other op changes)"))
            fp16.raise_opset(ctx, fp16.FP16_OPSET)
        return changes + fp16.convert(ctx, plan, tensor_types(ctx), ctx.params["fp16_io"], self.code)

    @staticmethod
    def _plan(ctx: CheckContext) -> fp16.Plan:
        memo = ctx.index.memo
        if "fp16_plan" not in memo:
            memo["fp16_plan"] = fp16.plan(ctx.graph, ctx.model.opset, tensor_types(ctx), ctx.params["keep_fp32"],
                                          ctx.ranges)
        return memo["fp16_plan"]


@register
class ScaleType(Rule):
    """A QuantizeLinear's scale must have the float type of the tensor it quantizes.

    What: a QuantizeLinear whose scale type differs from its input's (FP16 scale on an FP32
    input, FP32 scale on an FP16 input), which ONNX allows from opset 23 on (QuantizeLinear-19
    and -21 bind both to one type). A DequantizeLinear needs no such rule: its output has its
    scale's type, and the ops after it bind their inputs to one type, so ONNX itself keeps
    them equal (an FP32-scale DQ makes its readers FP32: QDQ901).

    Why: TensorRT 11 networks are strongly typed: "if the scale data type is kHALF or kBF16, it
    must match the input data type" (NvInfer.h, IQuantizeLayer, TensorRT 10.16 and 11.1), and a
    DQ's output type is fixed by its scale, so an FP32-scale DQ next to FP16 tensors leaves an
    FP32 op or a cast (ModelOpt's `fold_qdq_scale_fp16_to_fp32_casts`). An FP32 scale on an FP16
    input is not excluded by NVIDIA's sentence; before opset 19 the ONNX parser casts it, from 19
    on it passes unchanged (onnx-tensorrt `QuantDequantLinearHelper`): reported so the float
    types stay one type.

    Example: `x: float16 → QuantizeLinear(x, scale: float32)` at opset 23.

    The fix gives the scale its input's type (approximate: FP16 rounds it), where the scale is a
    constant and FP16's normal range holds it.
    """

    code = "QDQ902"
    name = "scale-type"
    message = "{tensor} is {actual} where the input is {expected}"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node, expected = finding.subject
        scale = node.inputs[1]
        values = scale.values.astype(helper.tensor_dtype_to_np_dtype(expected))
        ctx.edits.swap_params(node, ir.Constant(ctx.new_name(f"{scale.name}_{type_name(expected)}", scale.name), values))
        return [Change(self.code, mention(node), scale.name, type_name(float_types.element_type(scale.dtype)),
                       type_name(expected), f"scale to {type_name(expected)}, its input's type")]

    @staticmethod
    def _fixable(ctx: CheckContext, node: ir.Node, expected: int) -> bool:
        scale = node.inputs[1]
        if not isinstance(scale, ir.Constant):
            return False
        magnitude = np.abs(scale.values.astype(np.float64))
        return expected != TensorProto.FLOAT16 or bool(
            magnitude.size and magnitude.min() >= fp16.FP16_TINY and magnitude.max() <= fp16.FP16_MAX)

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        types = tensor_types(ctx)
        for node in ctx.graph.nodes:
            if node.op != QUANTIZE or node.domain not in QDQ_DOMAINS or len(node.inputs) < 2:
                continue
            x, scale = (types.get(t.name) for t in node.inputs[:2])
            if _floats(x, scale) and x != scale:
                yield self.finding(ctx, node, [node.inputs[1]], subject=(node, x), fixable=self._fixable(ctx, node, x),
                                   tensor=f"the scale of {mention(node)}", actual=type_name(scale),
                                   expected=type_name(x))


def _floats(*types: int | None) -> bool:
    return all(t in float_types.FLOAT_TYPES for t in types)


@register
class OpsetFloor(Rule):
    """A Q/DQ model for TensorRT 11 needs opset 19, the first that allows FP16 scales.

    What: the model imports an ai.onnx opset below 19 and has Q/DQ nodes.

    Why: QuantizeLinear and DequantizeLinear take FP16 scales from opset 19 on; before it every
    scale is FP32, so every DQ outputs FP32 and a strongly typed TensorRT 11 build runs the ops
    around the quantized layers in FP32 (QDQ901). NVIDIA's ModelOpt forces opset 19 for this
    reason, "the first to support fp16 scales in Q/DQ nodes" (modelopt/onnx/autocast/convert.py),
    and AutoCast raises a Q/DQ model to 19 (graphsanitizer.py).

    Example: a pytorch-quantization export at opset 13. QDQ901's fix raises the opset with the
    conversion to FP16, where no op changes meaning on the way.
    """

    code = "QDQ903"
    name = "opset-floor"
    message = "opset {opset} is below {minimum}: Q/DQ scales can only be FP32, so the layers around them build FP32"
    severity = Severity.WARNING

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if ctx.model.opset < fp16.FP16_OPSET and ctx.index.has_qdq:
            yield self.finding(ctx, None, opset=ctx.model.opset, minimum=fp16.FP16_OPSET)
