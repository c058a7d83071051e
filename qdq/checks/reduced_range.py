"""QDQ509: a Clip on the integers between a Q and its DQ, PyTorch's encoding of a reduced-range quantizer.

PyTorch's TorchScript exporter writes a fake-quantizer whose range is narrower than its integer
type (the x86 QAT qconfig's `quint8 [0, 127]`) as `QuantizeLinear → Clip(0, 127) → DequantizeLinear`.
onnxruntime runs the integer Clip; compilers that fuse Q/DQ pairs see none, and every rule that
moves the pair's grid must know the Clip is there or clip the new integers at the old bound.
Brevitas's QCDQ export clips stored weights the same way (`int8 constant → Clip → DQ`): there
the Clip computes a constant, and folding it lets a new scale re-quantize the stored integers.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
from onnx import helper

from qdq.graph import ir
from qdq.graph.ops import DEQUANTIZE, QUANTIZE
from qdq.quant.dtypes import QuantType
from qdq.quant.index import PER_TENSOR, QTensor, clipped_integers, resolve_constant, source_values
from qdq.quant.rounding import along
from qdq.rewrite.requantize import set_params
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register


def clip_bounds(ctx: CheckContext, clip: ir.Node) -> tuple[float | None, float | None]:
    """A Clip's (min, max): ∓inf for a bound it does not set, None for one computed at run time."""
    bounds: list[float | None] = []
    for slot, attribute, unset in ((1, "min", -np.inf), (2, "max", np.inf)):
        value = clip.attrs.get(attribute)  # opset < 11 keeps the bounds as attributes
        if value is None and len(clip.inputs) > slot and clip.inputs[slot] is not None and clip.inputs[slot].name:
            source = resolve_constant(clip.inputs[slot])
            value = float(source_values(ctx.model, source).ravel()[0]) if source is not None else None
        elif value is None:
            value = unset
        bounds.append(None if value is None else float(value))
    return bounds[0], bounds[1]


@register
class ReducedRangeQuantizer(Rule):
    """A Clip on the integers between a QuantizeLinear and its DequantizeLinear should be one Q/DQ pair.

    Why: PyTorch exports a fake-quantizer narrower than its type (x86 QAT activations: quint8
    [0, 127], to keep 16-bit pair sums from saturating on CPUs without VNNI) as
    `Q → Clip(0, 127) → DQ`. TensorRT and the NPU compilers fuse Q/DQ pairs and see none here; a
    fix that moves the pair's zero-point (symmetric int8: 128 steps) leaves the Clip cutting the
    new integers at 127, which zeroes every positive value.

    Example: `Q(x, s=0.02, zp=3 uint8) → Clip(max=127) → DQ`: the values the model computes lie
    in [(0 - 3) · 0.02, (127 - 3) · 0.02] = [-0.06, 2.48]. The fix removes the Clip and gives the
    Q and its DQs the grid that spans the same range over the whole type: scale 0.02 · 127 / 255,
    zero-point round(3 · 255 / 127) = 6. Every value keeps its range; values between the old steps
    now round to a step half as wide. A Clip that spans the whole type is removed exactly.
    Approximate. A Clip of stored integers (Brevitas: `int8 weight → Clip(-127, 127) → DQ`)
    is folded: the DQ reads the clipped integers as a constant, exactly, and a fix that changes
    its scale then re-quantizes them (left behind the Clip, the weights would scale with it).
    So is a Clip after a Q of a float constant (Brevitas's dynamo export: `weight → Q → Clip →
    DQ`, per channel too) that the grid fold cannot take: the DQ reads the integers the Q and
    the Clip compute, stored, exactly.
    """

    code = "QDQ509"
    name = "reduced-range-quantizer"
    message = "Clip {clip} narrows the {dtype} integers of {quantize} to [{low}, {high}]"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt in ctx.index.qtensors:
            for clips, readers, fixable in _folds(ctx, qt):
                qtype = ctx.index.params(qt.quantize).qtype
                low, high = _integer_range(ctx, clips, qtype)
                if not fixable and _stores(ctx, qt, clips, readers):  # Brevitas's dynamo export: weight → Q → Clip → DQ
                    readers, fixable = [None] + readers, True
                yield self.finding(
                    ctx, clips[0], [ctx.value_name(qt)], subject=(qt, clips, readers), fixable=fixable,
                    clip=", ".join(mention(c) for c in clips), quantize=f"QuantizeLinear {mention(qt.quantize)}",
                    dtype=qtype.name, low=_text(low), high=_text(high),
                )
            clips, stored = _clipped_constant(qt)
            if clips:
                qtype = ctx.index.params(qt.dequantizes[0]).qtype
                low, high = _integer_range(ctx, clips, qtype)
                yield self.finding(
                    ctx, clips[-1], [ctx.value_name(qt)], subject=(qt, clips, None), fixable=_constant_folds(ctx, qt, clips),
                    clip=", ".join(mention(c) for c in clips), quantize=f"the stored {stored.name}",
                    dtype=qtype.name, low=_text(low), high=_text(high),
                )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        qt, clips, readers = finding.subject
        if readers is None:
            return _fold_clipped_constant(ctx, qt, clips, finding, self.code)
        if readers[0] is None:
            return _store_clipped_weight(ctx, qt, clips, readers[1:], finding, self.code)
        params = ctx.index.params(qt.quantize)
        qtype = params.qtype
        low, high = _integer_range(ctx, clips, qtype)
        old_scale, old_zp = float(params.scale.ravel()[0]), float(params.zero_point.ravel()[0])
        old_range = ((low - old_zp) * old_scale, (high - old_zp) * old_scale)
        new_scale = old_scale * (high - low) / (qtype.qmax - qtype.qmin)
        new_zp = float(np.clip(np.rint(qtype.qmin - (low - old_zp) * old_scale / new_scale), qtype.qmin, qtype.qmax))
        new_range = ((qtype.qmin - new_zp) * new_scale, (qtype.qmax - new_zp) * new_scale)

        clip = finding.values["clip"]
        exact = (low, high) == (qtype.qmin, qtype.qmax)
        reason = (f"Clip {clip} removed" if exact else
                  f"Clip {clip} [{_text(low)}, {_text(high)}] folded into the grid: range "
                  f"[{old_range[0]:.6g}, {old_range[1]:.6g}] → [{new_range[0]:.6g}, {new_range[1]:.6g}], "
                  f"step {old_scale:.6g} → {new_scale:.6g}")
        changes: list[Change] = []
        for value in [qt] + readers:
            changes += set_params(ctx, value, new_scale, self.code, reason, zero_point=new_zp, going=clips)
        for reader in readers:
            for dq in reader.dequantizes:
                ctx.edits.set_input(dq, 0, qt.integer)
        if not changes:  # the grid stays: only the Clip goes
            changes.append(Change(self.code, mention(clips[0]), ctx.value_name(qt), clip, None, reason))
        for change in changes:
            change.values.update(old_range=list(old_range), new_range=list(new_range))
        return changes


def _clipped_constant(qt: QTensor) -> tuple[list[ir.Node], ir.Tensor | None]:
    """The integer Clips (first to last) between stored integers and the DQs of `qt`, and the constant."""
    if qt.quantize is not None:
        return [], None
    clips, tensor = clipped_integers(qt.integer)
    source = resolve_constant(tensor) if clips else None
    return (clips, tensor) if source is not None else ([], None)


def _constant_folds(ctx: CheckContext, qt: QTensor, clips: list[ir.Node]) -> bool:
    """Whether the fix folds the Clips of stored integers into a constant: their bounds are known and
    the integers are not a graph output."""
    low, high = _integer_range(ctx, clips, ctx.index.params(qt.dequantizes[0]).qtype)
    return low is not None and high is not None and not ctx.index.is_graph_output(qt.integer)


def _fold_clipped_constant(ctx: FixContext, qt: QTensor, clips: list[ir.Node], finding: Finding,
                           code: str) -> list[Change]:
    """Point the DQs at the integers the Clips compute, stored as a constant: exact."""
    stored = clips[0].inputs[0]
    values = source_values(ctx.model, resolve_constant(stored))
    low, high = _integer_range(ctx, clips, ctx.index.params(qt.dequantizes[0]).qtype)
    folded = ctx.model.new_constant(ctx.new_name(f"{stored.name}_clipped"), np.clip(values, low, high).astype(values.dtype))
    for dq in qt.dequantizes:
        ctx.edits.set_input(dq, 0, folded)
    clip = finding.values["clip"]
    return [Change(code, mention(clips[-1]), ctx.value_name(qt), f"{stored.name} → Clip {clip}", folded.name,
                   f"Clip {clip} of stored integers folded into a constant, so a new scale re-quantizes them")]


def _stores(ctx: CheckContext, qt: QTensor, clips: list[ir.Node], readers: list[QTensor | None]) -> bool:
    """Whether the integers a Q of a float constant makes, clipped, can be stored for the DQs after
    the Clips (exact, any granularity): the Clips are read by those DQs alone, with the Q's
    parameters and constant bounds."""
    params = ctx.index.params(qt.quantize)
    low, high = _integer_range(ctx, clips, params.qtype)
    return (
        qt.from_constant and not qt.dequantizes and not params.dynamic and not params.block_size
        and params.qtype.bits >= 8
        and low is not None and high is not None and bool(readers)
        and all(r is not None and params.same_values(ctx.index.params(r.nodes[0])) for r in readers)
        and not any(ctx.index.is_graph_output(c.outputs[0]) for c in clips)
    )


def _store_clipped_weight(ctx: FixContext, qt: QTensor, clips: list[ir.Node], readers: list[QTensor],
                          finding: Finding, code: str) -> list[Change]:
    """Point the DQs after the Clips at the integers the Q and the Clips compute, stored: exact."""
    params = ctx.index.params(qt.quantize)
    weights = source_values(ctx.model, resolve_constant(qt.quantize.inputs[0]))
    low, high = _integer_range(ctx, clips, params.qtype)
    axis = None if params.granularity == PER_TENSOR else params.axis
    scale, zero_point = (along(v, weights.ndim, axis) for v in (params.scale, params.zero_point))
    # Divided in the weight's own type, as QuantizeLinear does.
    integers = np.clip(np.rint(weights / scale.astype(weights.dtype)) + zero_point, low, high)
    stored = ctx.model.new_constant(ctx.new_name(f"{ctx.value_name(qt)}_stored"),
                                    integers.astype(helper.tensor_dtype_to_np_dtype(params.qtype.onnx_type)))
    for value in readers:
        for dq in value.dequantizes:
            ctx.edits.set_input(dq, 0, stored)
    clip = finding.values["clip"]
    return [Change(code, mention(clips[0]), ctx.value_name(qt), f"Q → Clip {clip}", stored.name,
                   f"the integers QuantizeLinear {mention(qt.quantize)} and Clip {clip} compute from a constant "
                   "stored for the DQs, so a new scale re-quantizes them")]


def _folds(ctx: CheckContext, qt: QTensor) -> Iterator[tuple[list[ir.Node], list[QTensor | None], bool]]:
    """Each integer Clip a Q's value passes through: the Clips, the values of the DQs after them,
    and whether the fix can fold them into one grid."""
    if qt.quantize is None:
        return
    params = ctx.index.params(qt.quantize)
    qtype = params.qtype
    if qtype is None or qtype.is_float:
        return
    consumers = ctx.index.consumers_through(qt.integer)
    for clip, _ in consumers:
        if clip.op != "Clip" or not clip.outputs:
            continue
        clips, readers = _clip_tree(ctx, clip)
        low, high = _integer_range(ctx, clips, qtype)
        fixable = (
            low is not None and high is not None and low < high
            and params.granularity == PER_TENSOR and not params.dynamic and not params.block_size
            and len(consumers) == 1 and not qt.dequantizes
            and not any(ctx.index.is_graph_output(c.outputs[0]) for c in clips)
            and bool(readers) and all(r is not None and params.same_values(ctx.index.params(r.nodes[0]))
                                      for r in readers)
            and len({clip_bounds(ctx, c) for c in clips}) == 1
        )
        yield clips, readers, fixable


def folded_clips(ctx: CheckContext, qt: QTensor) -> list[ir.Node]:
    """The integer Clips on a value's way from its Q or to its DQs that QDQ509's fix removes (it runs
    first in the rule sets): a rule that moves the zero-point is judged on the value after the fold."""
    if ReducedRangeQuantizer.code not in ctx.enabled:
        return []
    clips, _ = _clipped_constant(qt)
    if clips:  # stored integers → Clip → DQ (Brevitas)
        return clips if _constant_folds(ctx, qt, clips) else []
    if qt.quantize is None:  # the DQs after a Clip: find the Q before it
        tensor = qt.integer
        while tensor.inputs and tensor.inputs[0].op == "Clip" and tensor.inputs[0].inputs:
            tensor = tensor.inputs[0].inputs[0]
        origin = tensor.inputs[0] if tensor is not qt.integer and tensor.inputs else None
        upstream = ctx.index.qtensor_of(origin) if origin is not None and origin.op == QUANTIZE else None
        return folded_clips(ctx, upstream) if upstream is not None else []
    return [clip for clips, _, fixable in _folds(ctx, qt) if fixable for clip in clips]


def _clip_tree(ctx: CheckContext, clip: ir.Node) -> tuple[list[ir.Node], list[QTensor | None]]:
    """The Clip, the Clips that read its integers (removing a no-op DQ → Q between two PyTorch
    quantizers leaves `Clip → Clip`), and the value of each DQ that reads any of them (None for a
    reader that is neither)."""
    clips: list[ir.Node] = []
    values: list[QTensor | None] = []
    pending = [clip]
    while pending:
        node = pending.pop()
        clips.append(node)
        for reader, _ in ctx.index.consumers_through(node.outputs[0]):
            if reader.op == "Clip" and reader.outputs:
                pending.append(reader)
                continue
            value = ctx.index.qtensor_of(reader) if reader.op == DEQUANTIZE else None
            if value is None or all(value is not v for v in values):
                values.append(value)
    return clips, values


def _integer_range(ctx: CheckContext, clips: list[ir.Node], qtype: QuantType) -> tuple[float | None, float | None]:
    """The integers a chain of Clips lets through, within the type."""
    low, high = float(qtype.qmin), float(qtype.qmax)
    for clip in clips:
        clip_low, clip_high = clip_bounds(ctx, clip)
        if clip_low is None or clip_high is None:
            return None, None
        low, high = max(low, float(np.ceil(clip_low))), min(high, float(np.floor(clip_high)))
    return low, high


def _text(bound: float | None) -> str:
    return "?" if bound is None else str(int(bound))
