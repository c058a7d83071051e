"""QDQ6xx: the NPU's shift limits between fix positions (power-of-two scales, `scale = 2^-pos`).

A fix-point NPU rescales with bit shifts, and its shifters are narrow: an Add can align inputs
at most 7 positions apart, a Conv's output shift `wpos + ipos - opos` must lie in [0, 16], and
so on. Each rule here reads the positions of one op's operands (see qdq/quant/operands.py), checks
one shift against bounds from the rule set, and moves one position to repair it, in the
direction the NPU catalogue gives (`../shared/reference/npu-pow2-constraints.md`, section 5).

Values whose scale is not a per-tensor power of two are skipped here; QDQ502 and QDQ504 report
them, and the fix driver runs those first.
"""

from __future__ import annotations

from typing import Iterable

from qdq.graph import ir
from qdq.quant.dtypes import type_name
from qdq.quant.index import QTensor
from qdq.quant.operands import BIAS_INPUT, WEIGHT_INPUT, input_value, output_value, pos_of
from qdq.rewrite.requantize import set_params
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError

# How a Conv's output position is found (fused activations, DPU multiplies): set in the rule set.
_OUTPUT_LOOKUP = {"output_through": [], "output_through_mul": []}


class _ShiftRule(Rule):
    """Shared plumbing: operand positions, and moving one operand to a new position."""

    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE

    def output(self, ctx: CheckContext, node: ir.Node) -> QTensor | None:
        return output_value(ctx.index, node, ctx.params["output_through"], ctx.params["output_through_mul"])

    def nodes(self, ctx: CheckContext) -> Iterable[ir.Node]:
        return ctx.index.nodes_of(ctx.params["ops"])

    def move(self, ctx: FixContext, qt: QTensor, pos: int, node: ir.Node, why: str) -> list[Change]:
        return set_params(ctx, qt, 2.0**-pos, self.code, f"{mention(node)}: {why}")

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in self.nodes(ctx):
            violation = self.violation(ctx, node)
            if violation is not None:
                tensors, values = violation
                yield self.finding(ctx, node, tensors, subject=node, **values)

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        # Recomputed from the graph as it is now: an earlier fix may have moved these positions.
        return self.repair(ctx, finding.subject) if self.violation(ctx, finding.subject) else []

    def violation(self, ctx: CheckContext, node: ir.Node) -> tuple[list, dict] | None:
        raise NotImplementedError

    def repair(self, ctx: FixContext, node: ir.Node) -> list[Change]:
        raise NotImplementedError


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _positions(ctx: CheckContext, node: ir.Node) -> list[tuple[QTensor, int]] | None:
    """(value, pos) of every input; None when an input is not a power-of-two quantized value."""
    found = []
    for i in range(len(node.inputs)):
        qt = input_value(ctx.index, node, i)
        pos = pos_of(ctx.index, qt)
        if pos is None:
            return None
        found.append((qt, pos))
    return found or None


def _names(ctx: CheckContext, *values: QTensor | None) -> list[str]:
    return [ctx.value_name(v) for v in values if v is not None]


@register
class ShiftRead(_ShiftRule):
    """An Add or Sub may read inputs at most `max_gap` fix positions apart (the exponent gap).

    Why: the NPU aligns the inputs of an elementwise add with one shifter of limited width;
    `shift_read = max(ipos) - min(ipos)` must be at most 7 on AMD DPUs.

    Example: a residual Add with inputs at pos 1 and 9 (gap 8). The fix coarsens the finer
    input to pos 8, the finest the limit allows; its producer's output scale doubles.
    """

    code = "QDQ601"
    name = "shift-read"
    message = "{node}: inputs are {gap} fix positions apart (positions {positions}); the limit is {max_gap}"
    parameters = {"ops": ["Add", "Sub"], "max_gap": 7, **_OUTPUT_LOOKUP}

    def violation(self, ctx, node):
        operands = _positions(ctx, node)
        if operands is None or len(operands) < 2:
            return None
        positions = [p for _, p in operands]
        gap = max(positions) - min(positions)
        if gap <= ctx.params["max_gap"]:
            return None
        return _names(ctx, *(qt for qt, _ in operands)), {"gap": gap, "positions": positions, "max_gap": ctx.params["max_gap"]}

    def repair(self, ctx, node):
        operands = _positions(ctx, node)
        limit = min(p for _, p in operands) + ctx.params["max_gap"]
        changes: list[Change] = []
        for qt, pos in operands:
            if pos > limit:
                changes += self.move(ctx, qt, limit, node, f"input pos {pos} → {limit} (exponent gap ≤ {ctx.params['max_gap']})")
        return changes


class _OutputShift(_ShiftRule):
    """`shift = f(input positions) - opos` must lie in [min, max]; the fix moves the output."""

    def input_term(self, positions: list[int]) -> int:
        raise NotImplementedError

    def operands(self, ctx, node):
        inputs = _positions(ctx, node)
        output = self.output(ctx, node)
        opos = pos_of(ctx.index, output)
        if inputs is None or opos is None:
            return None
        return inputs, output, opos

    def violation(self, ctx, node):
        found = self.operands(ctx, node)
        if found is None:
            return None
        inputs, output, opos = found
        shift = self.input_term([p for _, p in inputs]) - opos
        low, high = ctx.params["min"], ctx.params["max"]
        if low <= shift <= high:
            return None
        return _names(ctx, *(qt for qt, _ in inputs), output), {"shift": shift, "min": low, "max": high}

    def repair(self, ctx, node):
        inputs, output, opos = self.operands(ctx, node)
        term = self.input_term([p for _, p in inputs])
        new = term - _clamp(term - opos, ctx.params["min"], ctx.params["max"])
        return self.move(ctx, output, new, node, f"output pos {opos} → {new} ({self.name} in [{ctx.params['min']}, {ctx.params['max']}])")


@register
class ShiftWriteAdd(_OutputShift):
    """An Add's output position must be close to its coarsest input: `min(ipos) - opos` in [-7, 25].

    Why: the NPU writes the sum with a shift of limited range. The reference tool checks Add
    only; Sub is computed the same way, so the default `ops` include it.

    Example: inputs at pos 6 and 7, output at pos 14: shift -8. The fix sets the output to pos
    13 (shift -7); the output scale doubles.
    """

    code = "QDQ602"
    name = "shift-write-add"
    message = "{node}: output shift {shift} (min input pos - output pos) is outside [{min}, {max}]"
    parameters = {"ops": ["Add", "Sub"], "min": -7, "max": 25, **_OUTPUT_LOOKUP}

    def input_term(self, positions):
        return min(positions)


@register
class ShiftWriteMul(_OutputShift):
    """A Mul of quantized inputs must write with `sum(ipos) - opos` in [0, 32].

    Why: the product of two fix-point numbers has position `ipos0 + ipos1`; the NPU shifts it
    to the output position with a shifter of this range. The reference tool fixes this without
    counting the change, so its loop can stop early (defect D6); here every change counts.

    Example: inputs at pos 7 and 7, output at pos 16: shift -2. The fix sets the output to
    pos 14.
    """

    code = "QDQ603"
    name = "shift-write-mul"
    message = "{node}: output shift {shift} (sum of input pos - output pos) is outside [{min}, {max}]"
    parameters = {"ops": ["Mul"], "min": 0, "max": 32, **_OUTPUT_LOOKUP}

    def input_term(self, positions):
        return sum(positions)


class _Weighted(_ShiftRule):
    """Conv-like ops: input, weight, bias and output positions."""

    def operands(self, ctx, node):
        weight_index = WEIGHT_INPUT.get(node.op)
        if weight_index is None:
            return None
        data = input_value(ctx.index, node, 0)
        weight = input_value(ctx.index, node, weight_index)
        output = self.output(ctx, node)
        ipos, wpos, opos = (pos_of(ctx.index, v) for v in (data, weight, output))
        if None in (ipos, wpos, opos):
            return None
        return data, weight, output, ipos, wpos, opos


@register
class ShiftCut(_Weighted):
    """A Conv-like op's output shift `wpos + ipos - opos` must lie in [0, 16].

    Why: the accumulator has position `wpos + ipos`; the NPU shifts it right by `shift_cut` to
    the output position. The reference tool checks Conv and Gemm only; ConvTranspose and MatMul
    have the same accumulator and are checked too (defect D7).

    Repair: too large a shift makes the weight coarser (`wpos := max + opos - ipos`), which
    never saturates a weight. Too small a shift (the output finer than the accumulator) moves
    the output coarser by default (`low_repair = "output"`, as Vitis-AI's NNDCT does); the
    reference tool makes the weight finer instead (`low_repair = "weight"`), which can saturate
    weights; the change report counts them. Stored weights are re-quantized either way.

    Example: a Conv with tiny weights: ipos 7, wpos 15, opos 0 → shift 22; the fix sets wpos to 9.
    """

    code = "QDQ604"
    name = "shift-cut"
    message = "{node}: shift_cut {shift} (wpos {wpos} + ipos {ipos} - opos {opos}) is outside [{min}, {max}]"
    parameters = {
        "ops": ["Conv", "Gemm", "ConvTranspose", "MatMul"], "min": 0, "max": 16, "low_repair": "output", **_OUTPUT_LOOKUP,
    }

    def violation(self, ctx, node):
        found = self.operands(ctx, node)
        if found is None:
            return None
        data, weight, output, ipos, wpos, opos = found
        shift = wpos + ipos - opos
        if ctx.params["min"] <= shift <= ctx.params["max"]:
            return None
        return _names(ctx, data, weight, output), {
            "shift": shift, "wpos": wpos, "ipos": ipos, "opos": opos, "min": ctx.params["min"], "max": ctx.params["max"],
        }

    def repair(self, ctx, node):
        data, weight, output, ipos, wpos, opos = self.operands(ctx, node)
        low, high = ctx.params["min"], ctx.params["max"]
        shift = wpos + ipos - opos
        if ctx.params["low_repair"] not in ("output", "weight"):
            raise RuleSetError(f"{self.code}.low_repair must be 'output' or 'weight', got {ctx.params['low_repair']!r}")
        if shift < low and ctx.params["low_repair"] == "output":
            new = wpos + ipos - low
            return self.move(ctx, output, new, node, f"output pos {opos} → {new} (shift_cut {shift} < {low})")
        new = _clamp(shift, low, high) + opos - ipos
        return self.move(ctx, weight, new, node, f"weight pos {wpos} → {new} (shift_cut {shift} outside [{low}, {high}])")


@register
class ShiftBias(_Weighted):
    """An integer bias must sit close to the accumulator: `wpos + ipos - bpos` within bounds.

    Why: the NPU adds the bias to the accumulator after shifting it left by `shift_bias`; the
    shifter allows at most 15, and at least `min(0, shift_cut + output_bits - accumulator_bits)`
    (0 when the op feeds a LeakyRelu, parameter `zero_min_before`). Applies to biases of the
    types in `types` (int8 and int16 by default): an int32 bias must equal input × weight scale exactly
    (QDQ606) and then has shift 0.

    Example: ipos 7, wpos 9, int8 bias at pos 0: shift 16 > 15. The fix moves the bias to pos 1
    and re-quantizes it (saturation is reported).
    """

    code = "QDQ605"
    name = "shift-bias"
    message = "{node}: shift_bias {shift} (wpos {wpos} + ipos {ipos} - bpos {bpos}) is outside [{min}, {max}]"
    parameters = {
        "ops": ["Conv", "Gemm", "ConvTranspose"], "max": 15, "accumulator_bits": 24, "output_bits": 8,
        "zero_min_before": ["LeakyRelu"], "types": ["int8", "int16"], **_OUTPUT_LOOKUP,
    }

    def bias(self, ctx, node):
        index = BIAS_INPUT.get(node.op)
        bias = input_value(ctx.index, node, index) if index is not None else None
        if bias is None or type_name(ctx.index.params(bias.nodes[0]).elem_type) not in ctx.params["types"]:
            return None
        return bias

    def bounds(self, ctx, node, shift_cut: int) -> tuple[int, int]:
        consumers = node.outputs[0].outputs if node.outputs else []
        if any(c.op in ctx.params["zero_min_before"] for c in consumers):
            return 0, ctx.params["max"]
        return min(0, shift_cut + ctx.params["output_bits"] - ctx.params["accumulator_bits"]), ctx.params["max"]

    def state(self, ctx, node):
        bias = self.bias(ctx, node)
        bpos = pos_of(ctx.index, bias)
        found = self.operands(ctx, node) if bpos is not None else None  # the bias first: most ops have none
        if found is None:
            return None
        data, weight, output, ipos, wpos, opos = found
        low, high = self.bounds(ctx, node, wpos + ipos - opos)
        return bias, bpos, ipos, wpos, low, high

    def violation(self, ctx, node):
        state = self.state(ctx, node)
        if state is None:
            return None
        bias, bpos, ipos, wpos, low, high = state
        shift = wpos + ipos - bpos
        if low <= shift <= high:
            return None
        return _names(ctx, bias), {"shift": shift, "wpos": wpos, "ipos": ipos, "bpos": bpos, "min": low, "max": high}

    def repair(self, ctx, node):
        bias, bpos, ipos, wpos, low, high = self.state(ctx, node)
        new = wpos + ipos - _clamp(wpos + ipos - bpos, low, high)
        return self.move(ctx, bias, new, node, f"bias pos {bpos} → {new} (shift_bias in [{low}, {high}])")


def _qualifying_hard_sigmoid(node: ir.Node, alpha: float) -> bool:
    """The HardSigmoid the DPU implements: alpha = 1/6 and beta 0.5 (ONNX's default alpha is 0.2)."""
    return (
        node.op == "HardSigmoid"
        and abs(float(node.attrs.get("alpha", 0.2)) - alpha) < 1e-6
        and abs(float(node.attrs.get("beta", 0.5)) - 0.5) < 1e-6
    )


@register
class HardSigmoidShift(_ShiftRule):
    """A HardSigmoid needs input pos in [0, 15], output pos ≥ 7 and `14 + ipos - opos` in [0, 31].

    Why: the DPU computes HardSigmoid(x) = x·2731/16384 + 0.5 with fixed shifts; its output
    position is read after the DPU multiply that follows it (parameter `output_through_mul`).
    Only HardSigmoid with alpha 1/6 and beta 0.5 is the DPU's (parameter `alpha`).

    Example: a HardSigmoid whose output Q has pos 6: the fix moves it to 7 (a finer scale:
    HardSigmoid's output lies in [0, 1], which pos 7 covers up to 127/128).
    """

    code = "QDQ607"
    name = "hard-sigmoid-shift"
    message = "{node}: HardSigmoid positions ipos {ipos}, opos {opos} break {detail}"
    parameters = {
        "ops": ["HardSigmoid"], "alpha": 1 / 6, "input_min": 0, "input_max": 15, "output_min": 7,
        "shift_offset": 14, "shift_max": 31, **_OUTPUT_LOOKUP,
    }

    def operands(self, ctx, node):
        if not _qualifying_hard_sigmoid(node, ctx.params["alpha"]):
            return None
        data, output = input_value(ctx.index, node, 0), self.output(ctx, node)
        ipos, opos = pos_of(ctx.index, data), pos_of(ctx.index, output)
        return None if ipos is None or opos is None else (data, output, ipos, opos)

    def targets(self, ctx, ipos: int, opos: int) -> tuple[int, int]:
        p = ctx.params
        new_ipos = _clamp(ipos, p["input_min"], p["input_max"])
        new_opos = max(opos, p["output_min"])
        shift = p["shift_offset"] + new_ipos - new_opos
        if shift < 0 or shift > p["shift_max"]:
            new_opos = p["shift_offset"] + new_ipos - _clamp(shift, 0, p["shift_max"])
        return new_ipos, new_opos

    def violation(self, ctx, node):
        found = self.operands(ctx, node)
        if found is None:
            return None
        data, output, ipos, opos = found
        if self.targets(ctx, ipos, opos) == (ipos, opos):
            return None
        p = ctx.params
        detail = (f"ipos in [{p['input_min']}, {p['input_max']}], opos ≥ {p['output_min']}, "
                  f"{p['shift_offset']} + ipos - opos in [0, {p['shift_max']}]")
        return _names(ctx, data, output), {"ipos": ipos, "opos": opos, "detail": detail}

    def repair(self, ctx, node):
        data, output, ipos, opos = self.operands(ctx, node)
        new_ipos, new_opos = self.targets(ctx, ipos, opos)
        changes: list[Change] = []
        if new_ipos != ipos:
            changes += self.move(ctx, data, new_ipos, node, f"HardSigmoid input pos {ipos} → {new_ipos}")
        if new_opos != opos:
            changes += self.move(ctx, output, new_opos, node, f"HardSigmoid output pos {opos} → {new_opos}")
        # Later alignments (a pool after the HardSigmoid) must not make the output coarser again.
        ctx.ceilings.lower(_names(ctx, output)[0], 2.0 ** -max(new_opos, ctx.params["output_min"]))
        return changes


@register
class SwishShift(_OutputShift):
    """The Mul of x·HardSigmoid(x) (hard swish) must write with `ipos0 + ipos1 - opos` in [0, 15].

    Why: the DPU runs x·hsigmoid(x) as one swish unit with a narrower output shifter than a
    plain Mul (QDQ603 allows 32).

    Example: x at pos 4, hsigmoid at pos 7, output at pos -5: shift 16. The fix sets the output
    to pos -4.
    """

    code = "QDQ608"
    name = "swish-shift"
    message = "{node}: swish output shift {shift} (ipos0 + ipos1 - opos) is outside [{min}, {max}]"
    parameters = {"ops": ["Mul"], "alpha": 1 / 6, "min": 0, "max": 15, **_OUTPUT_LOOKUP}

    def nodes(self, ctx):
        return [n for n in super().nodes(ctx) if _is_swish(ctx, n, ctx.params["alpha"])]

    def input_term(self, positions):
        return sum(positions)


def _is_swish(ctx: CheckContext, mul: ir.Node, alpha: float) -> bool:
    """x · HardSigmoid(x), seen through the Q/DQ around both operands."""
    sources = [_float_source(ctx, t) for t in mul.inputs]
    if len(sources) != 2:
        return False
    for this, other in (sources, sources[::-1]):
        producer = this.inputs[0] if len(this.inputs) == 1 else None
        if producer is not None and _qualifying_hard_sigmoid(producer, alpha) and producer.inputs:
            if _float_source(ctx, producer.inputs[0]) is other:
                return True
    return False


def _float_source(ctx: CheckContext, tensor: ir.Tensor) -> ir.Tensor:
    """The float tensor a value was quantized from, looking back through DQ → Q; else itself."""
    dq = ctx.index.dequantize_feeding(tensor)
    qt = ctx.index.qtensor_of(dq) if dq is not None else None
    if qt is not None and qt.float_input is not None:
        return qt.float_input
    return tensor
