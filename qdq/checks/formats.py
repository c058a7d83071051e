"""QDQ5xx: the quantization formats a target accepts (types, granularity and axis, zero-points, power-of-two scales).

Which types and forms are allowed is target knowledge and comes from the rule set: the NPU wants
per-tensor symmetric int8 with power-of-two scales, TensorRT allows per-channel weights, etc.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np
from onnx import TensorProto

from qdq.checks.reduced_range import clip_bounds, folded_clips
from qdq.graph import ir
from qdq.graph.ops import NON_NEGATIVE_OPS, SIGN_KEEPING_OPS, sign_carrying
from qdq.quant import pow2
from qdq.quant.dtypes import DEQUANTIZE_ONLY, QuantType, quant_type, type_name
from qdq.quant.histogram import Histogram
from qdq.quant.index import PER_AXIS, PER_TENSOR, QUANTIZE, QParams, QTensor, is_uniform
from qdq.quant.operands import ACTIVATION, BIAS, WEIGHT, WEIGHT_INPUT, output_channel_axis, role
from qdq.quant.rounding import quantize
from qdq.rewrite.insertion import float_type
from qdq.rewrite.requantize import (describe, effective_values, same_real_values, set_params, why_grid_is_fixed,
                                    why_type_is_fixed)
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError


# The two 8-bit integer types: the same grid, shifted by 128 (q_uint8 = q_int8 + 128).
_EIGHT_BIT = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
# Which activations QDQ505 rewrites: to `activation_type` ("" for none), only those whose scale has a
# type in `scale_types` ([] for any). Rules that leave those values to QDQ505 read them as well.
_RETYPE_PARAMETERS = {"activation_type": "", "scale_types": []}


def _values(ctx: CheckContext, look: np.ndarray | None = None) -> Iterable[tuple[QTensor, QParams, str]]:
    """Every quantized value with constant parameters, its params and its role.

    `look`, a mask over the rows of the index's table, leaves out the values whose first node's row
    it clears: rules pass the rows a vectorised test could not clear, so most values cost nothing.
    """
    index = ctx.index
    if "value_rows" not in index.memo:  # the row of each value's first node (-1 without one)
        index.memo["value_rows"] = np.fromiter(
            (index.table.row_of.get(id(qt.nodes[0]), -1) if qt.nodes else -1 for qt in index.qtensors),
            dtype=np.int64, count=len(index.qtensors))
    rows = index.memo["value_rows"]
    wanted = range(len(rows)) if look is None else np.flatnonzero((rows < 0) | look[rows])
    for i in wanted:
        qt = index.qtensors[i]
        if not qt.nodes:
            continue
        params = index.params(qt.nodes[0])
        if not params.dynamic:
            yield qt, params, role(index, qt)



@register
class UnsupportedQuantType(Rule):
    """Activations, weights and biases must use a quantized type the target supports.

    Why: a compiler that supports only int8 rejects a uint16 activation, or falls back to float.
    Each role has its own list in the rule set (`activation_types`, `weight_types`,
    `bias_types`; an empty list allows any type).

    Example: the NPU set allows int8 and uint8 activations, int8 weights and int8 or int32
    biases; `Q(x, zero_point: int16)` is reported.

    An 8-bit activation that QDQ505 rewrites exactly to the rule set's `activation_type`
    (TensorRT: uint8 → int8) is reported there, once, with that fix; `activation_type` and
    `scale_types` sit in the rule set's [params] so both rules read the same values.

    The fix, where int8 is allowed, moves activations of another integer type (onnxruntime's
    uint16 and int16 PTQ) to int8 over the range their grid spans, 8 bits fewer (approximate;
    QDQ503 makes them symmetric afterwards), and handles uint8 weights (onnxruntime's U8U8
    models). A uint8 weight whose integers minus zero-point fit int8 (always with zero-point
    128) keeps its grid: integers and zero-point move by -zero-point, exact. Otherwise the
    channels that do not fit are re-quantized once, from the effective weights, to the
    symmetric int8 scale that covers their largest weight (not uint8's whole range, which
    would cost a bit); approximate, with its cost in the change report.
    """

    code = "QDQ501"
    name = "unsupported-quant-type"
    message = "{role} {tensor} is {dtype}; the target supports {allowed}"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"activation_types": [], "weight_types": [], "bias_types": [], **_RETYPE_PARAMETERS}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        # A type every role allows is never reported: only the other rows are looked at.
        lists = [ctx.params[f"{kind}_types"] for kind in (ACTIVATION, WEIGHT, BIAS)]
        everywhere = [t for t in np.unique(table.elem_type) if all(not a or type_name(int(t)) in a for a in lists)]
        for qt, params, kind in _values(ctx, ~np.isin(table.elem_type, everywhere)):
            allowed = ctx.params[f"{kind}_types"]
            dtype = type_name(params.elem_type)
            if allowed and dtype not in allowed and ctx.params["activation_type"] in allowed \
                    and _retyped(ctx, params, kind):
                continue  # QDQ505's finding, with its exact fix
            if allowed and dtype not in allowed:
                fixable = "int8" in allowed and _int8_fixable(ctx, qt, params) and (
                    (kind == WEIGHT and dtype == "uint8")
                    or (kind == ACTIVATION and qt.quantize is not None and params.granularity == PER_TENSOR
                        and params.qtype is not None and not params.qtype.is_float)
                )
                yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt, fixable=fixable, role=kind,
                                   tensor=ctx.value_name(qt), dtype=dtype, allowed=", ".join(allowed))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        qt = finding.subject
        params = ctx.index.params(qt.nodes[0])
        if finding.values["role"] == ACTIVATION:
            return _int8_over_the_same_range(ctx, qt, params, self.code)
        scale, zp = params.scale, params.zero_point
        steps = _largest_steps(ctx, qt, params)
        if np.all(zp == 128) or np.all(steps <= 127):
            reason = "uint8 → int8 weights: the same grid, integers moved by -zero-point (exact)"
            new_scale, new_zp = scale, np.zeros_like(zp)
        else:  # the smallest symmetric int8 scale that represents every weight
            reason = "uint8 → symmetric int8 weights covering the weights' range"
            new_scale, new_zp = np.maximum(steps, 127) * scale / 127, np.zeros_like(zp)
        changes = set_params(ctx, qt, new_scale, self.code, reason, zero_point=new_zp, axis=params.axis,
                             elem_type=TensorProto.INT8)
        for change in changes:
            change.old, change.new = f"uint8 {change.old}", f"int8 {change.new}"
        return changes


def _largest_steps(ctx: CheckContext, qt: QTensor, params: QParams) -> np.ndarray:
    """The largest |q - zero-point| of a weight, per scale; the type's own bound when the weights are not constant."""
    weights = effective_values(ctx, qt)
    qtype = params.qtype
    zp = params.zero_point.astype(np.float64)
    if weights is None:
        return np.maximum(zp - qtype.qmin, qtype.qmax - zp)
    magnitude = np.abs(weights.astype(np.float64))
    if params.scale.size > 1:
        axes = tuple(a for a in range(magnitude.ndim) if a != params.axis % magnitude.ndim)
        largest = magnitude.max(axis=axes) if magnitude.size else np.zeros(params.scale.shape)
    else:
        largest = np.asarray(magnitude.max() if magnitude.size else 0.0).reshape(params.scale.shape)
    return np.rint(largest / params.scale.astype(np.float64))


def _int8_over_the_same_range(ctx: FixContext, qt: QTensor, params: QParams, code: str) -> list[Change]:
    """An activation of another integer type (uint16, int16) as int8 over the range its grid spans.

    The range keeps both ends, so a zero-point at the type minimum (a folded Relu) stays at int8's
    minimum and still clips at 0; QDQ503 makes the grid symmetric afterwards where the target asks.
    """
    qtype = params.qtype
    scale, zp = float(params.scale.ravel()[0]), float(params.zero_point.ravel()[0])
    low, high = (qtype.qmin - zp) * scale, (qtype.qmax - zp) * scale
    new_scale = (high - low) / 255
    new_zp = float(np.clip(np.rint(-128 - low / new_scale), -128, 127))
    cost = f"{qtype.bits - 8} bits fewer" if qtype.bits > 8 else "the same grid"
    reason = f"{qtype.name} → int8 over the same range [{low:.6g}, {high:.6g}]: {cost}"
    changes = set_params(ctx, qt, new_scale, code, reason, zero_point=new_zp, elem_type=TensorProto.INT8)
    for change in changes:
        change.old, change.new = f"{qtype.name} {change.old}", f"int8 {change.new}"
    return changes


def _int8_fixable(ctx: CheckContext, qt: QTensor, params: QParams) -> bool:
    """Whether a uint8 weight can become int8: not blocked, positive scales, nothing else reads its integers."""
    return bool(not params.block_size and np.all(params.scale > 0)) and why_type_is_fixed(ctx, qt) is None


@register
class PerAxisScale(Rule):
    """Values whose role the target quantizes per tensor must have a single scale.

    Why: the AMD NPU has one fix position per tensor (the reference tool silently reads element 0
    of a per-channel scale); TensorRT allows per-channel weights but not activations. Parameter
    `allow_per_axis` lists the roles (activation, weight, bias) that may be per-axis.

    Example: a Conv weight with 16 per-channel scales on the NPU. The fix takes the largest
    scale for the whole tensor, so no weight saturates, and re-quantizes the stored integers;
    approximate, and the change report gives the weights' SQNR and how many round to zero.
    Stored integers that use under half their type (Brevitas's 4- and 6-bit weights in int8)
    take the finest scale that holds every value instead: the largest would keep them on a
    4-bit grid inside an 8-bit type.

    With `power_of_two = true` (for a target whose scales are powers of two) that scale is
    rounded up to a power of two here, so the per-channel values are rounded once, onto the grid
    QDQ504 would give them, instead of twice. The npu rule set leaves it off: on PP-OCR's
    per-channel direction classifier it raised the weights' SQNR from 30.3 to 31.9 dB with no
    measurable task gain, and it put digits-trained ResNet and YOLO logits further from their
    float twins (docs/benchmarks.md, issue 35).
    """

    code = "QDQ502"
    name = "per-axis-scale"
    message = "{role} {tensor} is quantized per axis ({count} scales); the target needs one scale"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"allow_per_axis": ["weight"], "power_of_two": False}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt, params, kind in _values(ctx, ~ctx.index.table.per_tensor()):
            if params.granularity == PER_TENSOR or kind in ctx.params["allow_per_axis"]:
                continue
            yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt,
                               fixable=_per_axis_fixable(params) and (_integers_internal(ctx, qt) or same_real_values(
                                   params.scale, params.zero_point, params.scale.max(), params.zero_point.ravel()[0])),
                               role=kind, tensor=ctx.value_name(qt), count=int(params.scale.size))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        return _one_scale(ctx, finding.subject, self.code, "one scale for the whole tensor: the largest",
                          ctx.params["power_of_two"])


def _integers_internal(ctx: CheckContext, qt: QTensor, zero_point_moves: bool = False) -> bool:
    """Whether a value's integers may take a new grid: nothing but its own Q, DQs and stored
    integers writes or reads them (`set_params` refuses the others), once QDQ509 has folded the
    integer Clips it folds."""
    going = folded_clips(ctx, qt)
    return why_grid_is_fixed(ctx, qt, going, zero_point_moves=zero_point_moves) is None


def _per_axis_fixable(params: QParams) -> bool:
    """Whether per-axis parameters can become one scale: not blocked, one zero-point, positive scales."""
    return bool(not params.block_size and is_uniform(params.zero_point) and np.all(params.scale > 0))


def _one_scale(ctx: FixContext, qt: QTensor, code: str, reason: str, power_of_two: bool = False) -> list[Change]:
    """Make a per-axis value per-tensor with its largest scale, so no value saturates; stored integers
    follow. Stored integers narrower than their type (Brevitas's 4- and 6-bit weights in int8), which
    the largest scale would leave a bit or more of the type unused, take the finest scale that holds
    every value instead. POWER_OF_TWO rounds that scale up to a power of two, in the same step."""
    params = ctx.index.params(qt.nodes[0])
    scale, zero_point = float(params.scale.max()), float(params.zero_point.ravel()[0])
    values = effective_values(ctx, qt) if qt.stored else None
    if values is not None and values.size:
        holds = 0.0  # the finest scale whose grid reaches both extremes from the zero-point
        for extreme, room in ((float(values.max()), params.qtype.qmax - zero_point),
                              (float(values.min()), params.qtype.qmin - zero_point)):
            if extreme != 0:
                holds = max(holds, extreme / room) if extreme * room > 0 else math.inf
        if 0 < holds <= scale / 2:
            scale, reason = holds, reason.replace("the largest", "the finest that holds every value (they use under half the type)")
    if power_of_two:
        scale, reason = float(_ceil(np.asarray(scale))), f"{reason}, rounded up to a power of two"
    return set_params(ctx, qt, scale, code, reason, zero_point=zero_point)


@register
class AsymmetricZeroPoint(Rule):
    """Zero-points must be 0 (signed types) or the midpoint (unsigned, when the target allows it).

    Why: symmetric quantization lets the integer kernel skip the zero-point corrections; the
    AMD NPU supports only int8 with zero-point 0, or uint8 with 128 (parameter
    `unsigned_midpoint`; false means unsigned types need 0 as well).

    Example: `Q(x, scale=0.02, zero_point=-10 int8)`. The fix picks the symmetric scale that
    still covers the old range, [-118·0.02, 137·0.02] → scale 137·0.02/127, so nothing the old
    grid represented saturates; stored integers are re-quantized. Approximate.

    A zero-point at the type minimum (uint8 0, int8 -128) makes the Q clip every negative value
    to 0: onnxruntime's `quantize_static` removes a Relu before a Q this way. A symmetric grid
    would let those negative values through, so with `keep_clip = "relu"` the fix first puts the
    clip back as a Relu on that Q's input (other readers of the float tensor keep their values;
    the NPU and TensorRT fuse it into the Conv or Add before it), unless the tensor cannot be
    negative anyway (`nonnegative` ops such as a Relu or Sigmoid, a Clip at min >= 0, or ops in
    `through` applied to such values). Example: `Conv → Q(s, zp=-128 int8)` becomes
    `Conv → Relu → Q(255·s/127, zp=0)`: the same outputs on [0, 255·s], one step twice as
    coarse. `keep_clip = ""` leaves the clip out.

    The old grid also clipped at its top, (qmax − zp)·s: where a Clip(0, 6) of a hard-swish or a
    Relu6 was folded, that top is the network's own bound, and where it is the calibrated maximum
    the input model saturates there too. The symmetric grid ends at the same top, but a later
    rule that widens it (QDQ504 rounding the scale up to a power of two, up to twice as wide)
    lets values through that the input model clipped. With `keep_clip = "clip"` the fix puts back
    both ends, `Clip(0, (qmax − zp)·s)`, so the outputs stay those of the old grid whatever scale
    the tensor ends with. Measured on PP-OCR's text detector converted for the NPU: detection F1
    0.576 with the Relu, 0.967 with the Clip (docs/benchmarks.md).

    An activation QDQ505 rewrites to the rule set's `activation_type` is judged as it will be
    (TensorRT: uint8 zp 128 becomes int8 zp 0, which QDQ505's exact fix alone resolves, so it
    is not reported here; uint8 zp 110 becomes int8 zp -18, reported and fixed after it). Those
    values share one cause, the exporter's asymmetric 8-bit activations, which QDQ505 already
    lists one by one: they are reported here in one finding (two when some cannot be fixed) that
    says what the target needs, not once per tensor.
    """

    code = "QDQ503"
    name = "asymmetric-zero-point"
    message = "{what}; the target needs {needs}"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    parameters = {
        "unsigned_midpoint": True,
        "keep_clip": "relu",
        "nonnegative": list(NON_NEGATIVE_OPS),
        "through": list(SIGN_KEEPING_OPS),
        **_RETYPE_PARAMETERS,
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if ctx.params["keep_clip"] not in ("relu", "clip", ""):
            raise RuleSetError(f"{self.code}.keep_clip must be \"relu\", \"clip\" or \"\", "
                               f"got {ctx.params['keep_clip']!r}")
        retyped: dict[bool, list[tuple[QTensor, QParams]]] = {True: [], False: []}  # by fixability
        for qt, params, kind in _values(ctx, ~_symmetric_rows(ctx)):
            if params.qtype is None or params.qtype.is_float:
                continue
            # Judged on the type QDQ505 gives the value first: uint8 with zp 128 becomes int8 with 0.
            qtype, zero_point = _after_retype(ctx, qt, params, kind)
            expected = _expected_zero_point(qtype, ctx.params["unsigned_midpoint"])
            if is_uniform(zero_point) and zero_point.flat[0] == expected:
                continue
            zps = np.unique(params.zero_point)
            fixable = (params.granularity == PER_TENSOR and bool(np.all(params.scale > 0))
                       and _integers_internal(ctx, qt, zero_point_moves=True)
                       and not _loses_negatives(ctx, qt, qtype, zero_point, expected))
            if qtype.onnx_type != params.elem_type:
                retyped[fixable].append((qt, params))
                continue
            tensor = ctx.value_name(qt)
            yield self.finding(ctx, qt.nodes[0], [tensor], subject=[qt], fixable=fixable, role=kind, tensor=tensor,
                               zero_point=_zp_text(zps), expected=int(expected),
                               what=f"{kind} {tensor} has zero-point {_zp_text(zps)}", needs=str(int(expected)))
        for fixable, members in retyped.items():
            if members:
                yield self._retyped_finding(ctx, members, fixable)

    def _retyped_finding(self, ctx: CheckContext, members: list[tuple[QTensor, QParams]], fixable: bool) -> Finding:
        """One finding for the activations QDQ505 moves to `activation_type` that stay asymmetric there."""
        old = type_name(members[0][1].elem_type)
        new = ctx.params["activation_type"]
        expected = int(_expected_zero_point(quant_type(_EIGHT_BIT[new]), ctx.params["unsigned_midpoint"]))
        zps = np.unique(np.concatenate([params.zero_point.ravel() for _, params in members])).astype(int)
        kept = expected + (128 if new == "int8" else -128)  # the zero-point that would have stayed symmetric
        shown = ", ".join(map(str, zps)) if zps.size <= 3 else f"{zps.min()} … {zps.max()}"
        count = f"{len(members)} {old} activation{'s' if len(members) > 1 else ''}"
        what = (f"{count} {'have' if len(members) > 1 else 'has'} zero-points {shown}, not {kept}: "
                f"QDQ505 makes them {new} exactly (zero-point {'−' if new == 'int8' else '+'} 128), still asymmetric")
        names = [ctx.value_name(qt) for qt, _ in members]
        return self.finding(ctx, None, names, subject=[qt for qt, _ in members], fixable=fixable, role=ACTIVATION,
                            tensor=names[0] if len(names) == 1 else None, zero_point=_zp_text(zps),
                            expected=expected, what=what, needs=f"{new} with zero-point {expected}")

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        return [change for qt in finding.subject for change in self._symmetric(ctx, qt)]

    def _symmetric(self, ctx: FixContext, qt: QTensor) -> list[Change]:
        """Give one value the symmetric parameters that cover its old range (its own type first, when QDQ505 retypes it)."""
        # The check judged the value as QDQ505 retypes it; that fix runs first in a full run, else here.
        changes = _retype(ctx, qt, self.code) if _retypable(ctx, qt) else []
        params = ctx.index.params(qt.nodes[0])
        qtype = params.qtype
        scale, zp = float(params.scale.ravel()[0]), float(params.zero_point.ravel()[0])
        low, high = (qtype.qmin - zp) * scale, (qtype.qmax - zp) * scale
        new_zp = _expected_zero_point(qtype, ctx.params["unsigned_midpoint"])
        candidates = [high / (qtype.qmax - new_zp)] + ([-low / (new_zp - qtype.qmin)] if new_zp > qtype.qmin else [])
        new_scale = max(c for c in candidates if c > 0) if any(c > 0 for c in candidates) else scale
        keep = ctx.params["keep_clip"]
        if keep and zp == qtype.qmin and qt.quantize is not None \
                and role(ctx.index, qt) == ACTIVATION and _can_be_negative(ctx, qt.quantize.inputs[0], set()):
            changes.append(_insert_clip(ctx, qt, self.code, high if keep == "clip" else None))
        return changes + set_params(ctx, qt, new_scale, self.code, "symmetric parameters covering the old range",
                                    zero_point=new_zp)


def _loses_negatives(ctx: CheckContext, qt: QTensor, qtype: QuantType, zero_point: np.ndarray, expected: float) -> bool:
    """Whether zero-point `expected` at an unsigned type's minimum would drop negative values the grid holds
    (uint16 with zp 30000 → 0 on a target without `unsigned_midpoint`); a tensor that cannot be
    negative loses nothing."""
    if qtype.signed or expected != qtype.qmin or np.all(zero_point <= qtype.qmin):
        return False
    return qt.quantize is None or _can_be_negative(ctx, qt.quantize.inputs[0], set())


def _insert_clip(ctx: FixContext, qt: QTensor, code: str, high: float | None) -> Change:
    """Put the clip a zero-point at the type minimum made back on this Q's input only: a Relu, or with
    `high` a Clip(0, high) that also keeps the old grid's top."""
    quantize, tensor = qt.quantize, qt.quantize.inputs[0]
    if high is None:
        op, bounds, what = "Relu", [], "Relu re-inserted: the old zero point clipped at 0"
    else:
        dtype = float_type(tensor)
        op, what = "Clip", f"Clip(0, {high:g}) re-inserted: the old grid clipped at 0 and at {high:g}"
        bounds = [ir.Constant(ctx.new_name(f"{tensor.name}_{end}"), np.asarray(value, dtype))
                  for end, value in (("min", 0.0), ("max", high))]
    clipped = ir.Variable(ctx.new_name(f"{tensor.name}_{op.lower()}"), dtype=tensor.dtype, shape=tensor.shape)
    node = ir.Node(op, ctx.new_name(f"{tensor.name}_{op}"), inputs=[tensor, *bounds], outputs=[clipped])
    ctx.edits.add_node(node)
    ctx.edits.set_input(quantize, 0, clipped)
    after = f" after {tensor.inputs[0].op} {mention(tensor.inputs[0])}" if tensor.inputs else ""
    return Change(code, mention(quantize), tensor.name, "clipped by the zero-point", f"{op} {node.name}",
                  f"{what}; no numeric cost, one {op} node{after} for the target to fuse", {"inserted": node.name})


def _can_be_negative(ctx: CheckContext, tensor: ir.Tensor, seen: set[int]) -> bool:
    """Whether a float tensor may hold negative values, as far as its producers show (True when unsure)."""
    if id(tensor) in seen:
        return True
    seen.add(id(tensor))
    if isinstance(tensor, ir.Constant):
        return bool(np.any(np.asarray(tensor.values) < 0))
    dq = ctx.index.dequantize_feeding(tensor)
    if dq is not None:
        return _dequantized_can_be_negative(ctx, dq, seen)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is None:
        return True
    if producer.op in ctx.params["nonnegative"]:
        return False
    if producer.op == "Clip":
        low = clip_bounds(ctx, producer)[0]
        return low is None or low < 0
    if producer.op in ctx.params["through"]:
        return any(_can_be_negative(ctx, t, seen) for t in sign_carrying(producer.op, producer.inputs))
    return True


def _dequantized_can_be_negative(ctx: CheckContext, dq, seen: set[int]) -> bool:
    """A DQ gives no negative value when its zero-point is the type minimum, or when the Q before it
    (same zero-point) quantizes a tensor that has none."""
    params = ctx.index.params(dq)
    if params.dynamic or params.qtype is None or params.qtype.is_float or not is_uniform(params.zero_point):
        return True
    zp = params.zero_point.ravel()[0]
    if zp == params.qtype.qmin:
        return False
    integers = dq.inputs[0]
    quantize = integers.inputs[0] if len(integers.inputs) == 1 else None
    if quantize is None or quantize.op != QUANTIZE or ctx.index.qtensor_of(quantize) is None:
        return True
    q_params = ctx.index.params(quantize)
    same_zp = not q_params.dynamic and is_uniform(q_params.zero_point) and q_params.zero_point.ravel()[0] == zp
    return not same_zp or _can_be_negative(ctx, quantize.inputs[0], seen)


def _symmetric_rows(ctx: CheckContext) -> np.ndarray:
    """Per row of the index's table: True when every decoded zero-point is the one QDQ503 expects, on a
    type QDQ505 cannot rewrite (with an invalid `activation_type`, none: the rules reading it raise)."""
    table = ctx.index.table
    retype = ctx.params["activation_type"]

    def expected(onnx_type: int) -> float | None:
        qtype = quant_type(onnx_type)
        if retype not in ("", *_EIGHT_BIT) or qtype is None or qtype.is_float or (retype and qtype.name in _EIGHT_BIT):
            return None
        return _expected_zero_point(qtype, ctx.params["unsigned_midpoint"])

    zero_point = table.per_type(expected)
    return (table.zero_point.low == zero_point) & (table.zero_point.high == zero_point)


def _expected_zero_point(qtype, unsigned_midpoint: bool) -> float:
    """0 for signed types; the midpoint (128 for uint8) for unsigned ones when the target allows it."""
    if qtype.signed or not unsigned_midpoint:
        return 0.0
    return float(2 ** (qtype.bits - 1))


def _zp_text(zps: np.ndarray) -> str:
    return str(int(zps[0])) if zps.size == 1 else f"{zps.size} different values"


_ROUNDINGS = ("ceil", "nearest", "min-error")


@register
class NonPow2Scale(Rule):
    """Every scale must be an exact power of two (the NPU's fix-point format).

    Why: the AMD NPU (XINT8, Vitis-AI fix-point) rescales by bit shifts, so each tensor has a
    fix position `pos` with `scale = 2^-pos`. A float scale is not compiled as it is.

    How the fix rounds (parameters `rounding` for activations, `weight_rounding` for weights and
    biases): `ceil` takes the next larger power of two, which never clips a value the old grid
    represented (the reference tool rounds in the log domain and can clip; defect D8);
    `nearest` rounds log2 to the nearest integer; `min-error` tries the ceil position and the
    four finer ones and keeps the one with the smallest squared error: on a weight's own values,
    and on an activation's values measured by `qdq fix --calibrate` (a histogram of what the
    input model's Q reads, from the coarsest position that holds all of them; AMD Quark's MinMSE
    does the same). There the error of the values a grid saturates counts `clip_weight` times
    (default 2): a clipped value's error has one sign and falls on the largest activations, so
    it adds up downstream where rounding errors partly cancel; measured on FX QAT exports and
    PP-OCR (docs/benchmarks.md), plain squared error (1) put MobileNetV2 further from its
    float twin than `ceil`, and 2 did not. Without data an activation's `min-error` is `ceil`:
    the input's grid is all that is known of its values. Int32 biases are left to QDQ606,
    which sets them to input × weight scale (`exempt_int32_bias`).

    Example: `Q(x, scale=0.0123)` → `scale=2^-6 = 0.015625` with `ceil`. Approximate; stored
    integers are re-quantized.
    """

    code = "QDQ504"
    name = "non-pow2-scale"
    message = "{role} {tensor} has scale {scale}, not a power of two"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"rounding": "ceil", "weight_rounding": "ceil", "exempt_int32_bias": True, "clip_weight": 2.0}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for name in ("rounding", "weight_rounding"):
            if ctx.params[name] not in _ROUNDINGS:
                raise RuleSetError(f"{self.code}.{name} must be one of {', '.join(_ROUNDINGS)}, got {ctx.params[name]!r}")
        weight = ctx.params["clip_weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 1:
            raise RuleSetError(f"{self.code}.clip_weight must be a number >= 1, got {weight!r}")
        table = ctx.index.table
        pow2_rows = table.scale.every(pow2.exact)  # most scales, tested at once
        for qt, params, kind in _values(ctx, ~pow2_rows):
            if kind == BIAS and params.elem_type in DEQUANTIZE_ONLY and ctx.params["exempt_int32_bias"]:
                continue
            if pow2.all_pow2(params.scale):
                continue
            # Blocked scales (int4 weight-only) are not re-quantized: left as they are.
            fixable = (not params.block_size and bool(np.all(np.isfinite(params.scale) & (params.scale > 0)))
                       and _integers_internal(ctx, qt))
            yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=(qt, kind), fixable=fixable, role=kind,
                               tensor=ctx.value_name(qt), scale=describe(params.scale, np.zeros(1)))

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        qt, kind = finding.subject
        params = ctx.index.params(qt.nodes[0])
        method = ctx.params["rounding"] if kind == ACTIVATION else ctx.params["weight_rounding"]
        measured = _measured(ctx, qt) if kind == ACTIVATION and method == "min-error" else None
        if measured is not None and params.granularity == PER_TENSOR:
            scale = _least_error_on_data(*measured, params, float(ctx.params["clip_weight"]))
            method = "least squared error on the calibration data"
        elif method == "min-error":
            real = effective_values(ctx, qt)
            scale = _min_error_scale(real.astype(np.float64), params) if real is not None else _ceil(params.scale)
            method = "min-error" if real is not None else "ceil"
        elif method == "nearest":
            scale = np.exp2(np.rint(np.log2(params.scale)))
        else:
            scale = _ceil(params.scale)
        return set_params(ctx, qt, scale.reshape(params.scale.shape), self.code, f"power-of-two scale ({method})")


def _ceil(scale: np.ndarray) -> np.ndarray:
    return np.exp2(np.ceil(np.log2(scale)))


def _measured(ctx: FixContext, qt: QTensor) -> tuple[Histogram, tuple[float, float]] | None:
    """The calibration histogram of the values an activation's Q reads, with the bounds of a Clip in
    between (one QDQ503 put back reads the histogram of the tensor it clips); None without data."""
    histograms = getattr(ctx.ranges, "histogram", None) or {}
    value = qt.float_input
    if value is None:
        return None
    producer = value.inputs[0] if value.inputs else None
    if producer is not None and producer.op == "Clip" and producer.inputs:
        low, high = clip_bounds(ctx, producer)
        measured = histograms.get(ctx.names.original(producer.inputs[0].name))
        if low is not None and high is not None and measured is not None and measured.total:
            return measured, (low, high)
    measured = histograms.get(ctx.names.original(value.name))
    return (measured, (-math.inf, math.inf)) if measured is not None and measured.total else None


def _least_error_on_data(measured: Histogram, bounds: tuple[float, float], params: QParams,
                         clip_weight: float) -> np.ndarray:
    """The power of two with the least squared error on the measured values (clipped to `bounds`,
    saturated ones weighted `clip_weight`), starting from the coarsest that holds them all where
    that is coarser than the input's scale rounded up."""
    qtype, zp = params.qtype, float(params.zero_point.ravel()[0])
    reach = min(qtype.qmax - zp, zp - qtype.qmin)  # grid steps on the short side
    # The histogram's limit R holds every value; R / reach clips none.
    holds_all = -math.ceil(math.log2(measured.limit / reach)) if reach > 0 and measured.limit else None
    return _least_error_scale(
        params, lambda scale: measured.squared_error(scale, qtype.qmin, qtype.qmax, zp, bounds, clip_weight), holds_all)


def _min_error_scale(real: np.ndarray, params: QParams) -> np.ndarray:
    """The power of two with the least squared error on a weight's own values."""
    if params.granularity != PER_TENSOR:
        return _ceil(params.scale)
    qtype, zp = params.qtype, float(params.zero_point.ravel()[0])

    def error(scale: float) -> float:
        integers, _ = quantize(real, scale, zp, qtype.qmin, qtype.qmax)
        return float(np.sum(((integers - zp) * scale - real) ** 2))

    return _least_error_scale(params, error)


def _least_error_scale(params: QParams, error: Callable[[float], float], coarsest: int | None = None) -> np.ndarray:
    """The power of two with the least `error(scale)`, from the input's scale rounded up (or position
    `coarsest`, if coarser) to four positions finer; of equal errors, the coarsest."""
    ceil_pos = -math.ceil(math.log2(float(params.scale.ravel()[0])))
    first = ceil_pos if coarsest is None else min(coarsest, ceil_pos)
    errors = {pos: error(2.0**-pos) for pos in range(first, ceil_pos + 5)}
    return np.asarray(2.0 ** -min(errors, key=lambda pos: (errors[pos], pos)))




@register
class ActivationType(Rule):
    """Activations should use the 8-bit integer type the target's fast kernels take.

    Why: onnxruntime on x86 runs uint8 activations with int8 weights (U8S8) fast; int8
    activations are converted to uint8 by its QDQS8ToU8 pass only where a Q has a single
    consumer, so most node units of an int8 model mix types and stay float (FX and PT2E QAT
    exports ran 1.4-2.2x slower than fp32; rewritten to uint8 they ran 0.6-0.8x). TensorRT
    wants int8 (`activation_type = "int8"`); "" means no preference.

    Example: `Q(x, s=0.05, zp=0 int8) → DQ`. The fix writes uint8 with zp 128 on the Q and every
    DQ of the value: q + 128 with zp + 128 dequantizes to the same numbers. Exact. Integers
    stored in the model (a constant addend that onnxruntime's quantizer writes as int8 beside a
    uint8 activation, which keeps the Add float) get a new constant holding them shifted. Integers
    read from a graph input, and Q outputs that are graph outputs, are not rewritten. A 16-bit
    activation is reported without a fix where no QDQ501 names it: onnxruntime's QLinear kernels
    are 8-bit, so its node units run in float, and 8 bits would drop the precision it was given.
    """

    code = "QDQ505"
    name = "activation-type"
    message = "activation {tensor} is {dtype}; the target wants {expected}{how}"
    severity = Severity.WARNING
    fix_safety = FixSafety.EXACT
    parameters = _RETYPE_PARAMETERS

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt, params, kind in _values(ctx):
            if _wide(ctx, params, kind):
                yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt, fixable=False,
                                   tensor=ctx.value_name(qt), dtype=type_name(params.elem_type),
                                   expected=ctx.params["activation_type"],
                                   how=" (its node units run in float; re-quantize it with 8 bits if that precision will do)")
                continue
            if not _retyped(ctx, params, kind):
                continue
            reason = why_type_is_fixed(ctx, qt)
            yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt, fixable=reason is None,
                               tensor=ctx.value_name(qt), dtype=type_name(params.elem_type),
                               expected=ctx.params["activation_type"],
                               how=f" (not rewritten: {reason})" if reason else "")

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        return _retype(ctx, finding.subject, self.code)


def _wide(ctx: CheckContext, params: QParams, kind: str) -> bool:
    """A 16-bit activation where the target's kernels take `activation_type` (8-bit) and no QDQ501
    of the rule set reports the type."""
    return (kind == ACTIVATION and ctx.params["activation_type"] in _EIGHT_BIT and "QDQ501" not in ctx.enabled
            and type_name(params.elem_type) in ("int16", "uint16"))


def _retyped(ctx: CheckContext, params: QParams, kind: str) -> bool:
    """Whether QDQ505 reports this value: an activation of the other 8-bit type than `activation_type`
    whose scale type is in `scale_types` (QDQ501 and QDQ503 ask too, to leave it to QDQ505)."""
    expected = ctx.params["activation_type"]
    if expected not in ("", *_EIGHT_BIT):
        raise RuleSetError(f"activation_type must be \"\", int8 or uint8, got {expected!r}")
    dtype = type_name(params.elem_type)
    if not expected or kind != ACTIVATION or dtype not in _EIGHT_BIT or dtype == expected:
        return False
    scale_types = ctx.params["scale_types"]
    return not scale_types or type_name(params.scale_source.elem_type) in scale_types


def _retypable(ctx: CheckContext, qt: QTensor) -> bool:
    """Whether QDQ505's fix rewrites this value."""
    return _retyped(ctx, ctx.index.params(qt.nodes[0]), role(ctx.index, qt)) and why_type_is_fixed(ctx, qt) is None


def _after_retype(ctx: CheckContext, qt: QTensor, params: QParams, kind: str) -> tuple[QuantType, np.ndarray]:
    """The integer type and zero-point a value has once QDQ505's fix has run (its own where that fix does not apply)."""
    if kind != ACTIVATION or not _retypable(ctx, qt):
        return params.qtype, params.zero_point
    new = ctx.params["activation_type"]
    return quant_type(_EIGHT_BIT[new]), params.zero_point + (128 if new == "uint8" else -128)


def _retype(ctx: FixContext, qt: QTensor, code: str) -> list[Change]:
    """QDQ505's fix: the other 8-bit type, integers and zero-point shifted by 128 (exact)."""
    params = ctx.index.params(qt.nodes[0])
    old, new = type_name(params.elem_type), ctx.params["activation_type"]
    shift = 128 if new == "uint8" else -128
    changes = set_params(ctx, qt, params.scale, code, f"{old} → {new}: integers and zero-point move by {shift}",
                         zero_point=params.zero_point + shift, axis=params.axis, elem_type=_EIGHT_BIT[new])
    for change in changes:
        change.old, change.new = f"{old} {change.old}", f"{new} {change.new}"
    return changes


@register
class WeightAxis(Rule):
    """Per-channel weight scales must run along the op's output channels.

    Why: an integer Conv or MatMul factors the weight scale out of each output's sum, which
    works only when every output channel has one scale. Per-axis scales along another axis
    (say Conv axis 1, the input channels) are legal ONNX but TensorRT rejects them and no
    integer kernel can use them. The output-channel axis: Conv 0, ConvTranspose 1, Gemm 0 with
    transB else 1, MatMul the weight's last axis. `conv_transpose_axis` overrides ConvTranspose's
    for runtimes that read it elsewhere (TensorRT before 10.2 wanted axis 0).

    Example: a Conv weight [16, 8, 3, 3] quantized with 8 scales along axis 1. The fix takes
    the largest scale for the whole tensor (as QDQ502 does), so no weight saturates, and
    re-quantizes the stored integers. Approximate; the change report gives the weights' SQNR.
    """

    code = "QDQ506"
    name = "weight-axis"
    message = "weight {tensor} of {op} {consumer} has per-channel scales along axis {axis}; its output channels are axis {expected}"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"ops": ["Conv", "ConvTranspose", "Gemm", "MatMul"], "conv_transpose_axis": 1}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops = set(ctx.params["ops"])
        for qt, params, kind in _values(ctx, ~ctx.index.table.per_tensor()):
            rank = params.data_rank
            if kind != WEIGHT or params.granularity != PER_AXIS or not rank:
                continue
            axis = params.axis % rank
            for consumer in _weight_readers(ctx, qt):
                expected = (ctx.params["conv_transpose_axis"] if consumer.op == "ConvTranspose"
                            else output_channel_axis(consumer, rank))
                if consumer.op in ops and expected != axis:
                    yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt,
                                       fixable=_per_axis_fixable(params), tensor=ctx.value_name(qt), op=consumer.op,
                                       consumer=mention(consumer), axis=axis, expected=expected)
                    break

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        reason = f"per-channel scales along axis {finding.values['axis']} replaced by one scale: the largest"
        return _one_scale(ctx, finding.subject, self.code, reason)


def _weight_readers(ctx: CheckContext, qt: QTensor) -> list:
    """The ops that read this value as their weight input."""
    readers = []
    for dq in qt.dequantizes:
        for consumer, _ in ctx.index.consumers_through(dq.outputs[0]):
            slot = WEIGHT_INPUT.get(consumer.op)
            if slot is not None and slot < len(consumer.inputs) and ctx.index.dequantize_feeding(consumer.inputs[slot]) is dq:
                readers.append(consumer)
    return readers
