"""QDQ5xx: the quantization formats a target accepts (types, granularity, symmetry, power-of-two scales).

Which types and forms are allowed is target knowledge and comes from the rule set: the NPU wants
per-tensor symmetric int8 with power-of-two scales, TensorRT allows per-channel weights, etc.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from qdq import pow2
from qdq.dtypes import DEQUANTIZE_ONLY, type_name
from qdq.errors import RuleSetError
from qdq.operands import ACTIVATION, BIAS, role
from qdq.quant_index import PER_TENSOR, QParams, QTensor, resolve_constant, source_values
from qdq.requantize import describe, set_params
from qdq.rule import Change, CheckContext, Finding, FixSafety, Rule, Severity, register


def _values(ctx: CheckContext) -> Iterable[tuple[QTensor, QParams, str]]:
    """Every quantized value with constant parameters, its params and its role."""
    for qt in ctx.index.qtensors:
        if not qt.nodes:
            continue
        params = ctx.index.params(qt.nodes[0])
        if not params.dynamic:
            yield qt, params, role(ctx.index, qt)



@register
class UnsupportedQuantType(Rule):
    """Activations, weights and biases must use a quantized type the target supports.

    Why: a compiler that supports only int8 rejects a uint16 activation, or falls back to float.
    Each role has its own list in the rule set (`activation_types`, `weight_types`,
    `bias_types`; an empty list allows any type).

    Example: the NPU set allows int8 and uint8 activations, int8 weights and int8 or int32
    biases; `Q(x, zero_point: int16)` is reported.
    """

    code = "QDQ501"
    name = "unsupported-quant-type"
    message = "{role} {tensor} is {dtype}; the target supports {allowed}"
    severity = Severity.ERROR
    parameters = {"activation_types": [], "weight_types": [], "bias_types": []}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt, params, kind in _values(ctx):
            allowed = ctx.params[f"{kind}_types"]
            dtype = type_name(params.elem_type)
            if allowed and dtype not in allowed:
                yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], fixable=False, role=kind,
                                   tensor=ctx.value_name(qt), dtype=dtype, allowed=", ".join(allowed))


@register
class PerAxisScale(Rule):
    """Values whose role the target quantizes per tensor must have a single scale.

    Why: the AMD NPU has one fix position per tensor (the reference tool silently reads element 0
    of a per-channel scale); TensorRT allows per-channel weights but not activations. Parameter
    `allow_per_axis` lists the roles (activation, weight, bias) that may be per-axis.

    Example: a Conv weight with 16 per-channel scales on the NPU. The fix takes the largest
    scale for the whole tensor, so no weight saturates, and re-quantizes the stored integers;
    approximate, and the change report gives the weights' SQNR and how many round to zero.
    """

    code = "QDQ502"
    name = "per-axis-scale"
    message = "{role} {tensor} is quantized per axis ({count} scales); the target needs one scale"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    edits_graph = False
    parameters = {"allow_per_axis": ["weight"]}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt, params, kind in _values(ctx):
            if params.granularity == PER_TENSOR or kind in ctx.params["allow_per_axis"]:
                continue
            fixable = not params.block_size and np.unique(params.zero_point).size == 1 and np.all(params.scale > 0)
            yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt, fixable=bool(fixable),
                               role=kind, tensor=ctx.value_name(qt), count=int(params.scale.size))

    def fix(self, ctx: CheckContext, finding: Finding) -> list[Change]:
        qt = finding.subject
        params = ctx.index.params(qt.nodes[0])
        return set_params(ctx, qt, params.scale.max(), self.code, "one scale for the whole tensor: the largest",
                          zero_point=params.zero_point.ravel()[0])


@register
class AsymmetricZeroPoint(Rule):
    """Zero-points must be 0 (signed types) or the midpoint (unsigned, when the target allows it).

    Why: symmetric quantization lets the integer kernel skip the zero-point corrections; the
    AMD NPU supports only int8 with zero-point 0, or uint8 with 128 (parameter
    `unsigned_midpoint`; false means unsigned types need 0 as well).

    Example: `Q(x, scale=0.02, zero_point=-10 int8)`. The fix picks the symmetric scale that
    still covers the old range, [-118·0.02, 137·0.02] → scale 137·0.02/127, so nothing the old
    grid represented saturates; stored integers are re-quantized. Approximate.
    """

    code = "QDQ503"
    name = "asymmetric-zero-point"
    message = "{role} {tensor} has zero-point {zero_point}; the target needs {expected}"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    edits_graph = False
    parameters = {"unsigned_midpoint": True}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for qt, params, kind in _values(ctx):
            qtype = params.qtype
            if qtype is None or qtype.is_float:
                continue
            expected = _expected_zero_point(qtype, ctx.params["unsigned_midpoint"])
            zps = np.unique(params.zero_point)
            if zps.size == 1 and zps[0] == expected:
                continue
            fixable = params.granularity == PER_TENSOR and bool(np.all(params.scale > 0))
            yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=qt, fixable=fixable, role=kind,
                               tensor=ctx.value_name(qt), zero_point=_zp_text(zps), expected=int(expected))

    def fix(self, ctx: CheckContext, finding: Finding) -> list[Change]:
        qt = finding.subject
        params = ctx.index.params(qt.nodes[0])
        qtype = params.qtype
        scale, zp = float(params.scale.ravel()[0]), float(params.zero_point.ravel()[0])
        low, high = (qtype.qmin - zp) * scale, (qtype.qmax - zp) * scale
        new_zp = _expected_zero_point(qtype, ctx.params["unsigned_midpoint"])
        candidates = [high / (qtype.qmax - new_zp)] + ([-low / (new_zp - qtype.qmin)] if new_zp > qtype.qmin else [])
        new_scale = max(c for c in candidates if c > 0) if any(c > 0 for c in candidates) else scale
        return set_params(ctx, qt, new_scale, self.code, "symmetric parameters covering the old range", zero_point=new_zp)


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
    `nearest` rounds log2 to the nearest integer; `min-error` (weights only) tries the ceil
    position and the four finer ones and keeps the one with the smallest squared error on the
    weights themselves. Int32 biases are left to QDQ606, which sets them to input × weight
    scale (`exempt_int32_bias`).

    Example: `Q(x, scale=0.0123)` → `scale=2^-6 = 0.015625` with `ceil`. Approximate; stored
    integers are re-quantized.
    """

    code = "QDQ504"
    name = "non-pow2-scale"
    message = "{role} {tensor} has scale {scale}, not a power of two"
    severity = Severity.ERROR
    fix_safety = FixSafety.APPROXIMATE
    edits_graph = False
    parameters = {"rounding": "ceil", "weight_rounding": "ceil", "exempt_int32_bias": True}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for name in ("rounding", "weight_rounding"):
            if ctx.params[name] not in _ROUNDINGS:
                raise RuleSetError(f"{self.code}.{name} must be one of {', '.join(_ROUNDINGS)}, got {ctx.params[name]!r}")
        for qt, params, kind in _values(ctx):
            if kind == BIAS and params.elem_type in DEQUANTIZE_ONLY and ctx.params["exempt_int32_bias"]:
                continue
            if pow2.all_pow2(params.scale):
                continue
            fixable = bool(np.all(np.isfinite(params.scale) & (params.scale > 0)))
            yield self.finding(ctx, qt.nodes[0], [ctx.value_name(qt)], subject=(qt, kind), fixable=fixable, role=kind,
                               tensor=ctx.value_name(qt), scale=describe(params.scale, np.zeros(1)))

    def fix(self, ctx: CheckContext, finding: Finding) -> list[Change]:
        qt, kind = finding.subject
        params = ctx.index.params(qt.nodes[0])
        method = ctx.params["rounding"] if kind == ACTIVATION else ctx.params["weight_rounding"]
        if method == "min-error":
            real = _real_values(ctx, qt, params)
            scale = _min_error_scale(real, params) if real is not None else _ceil(params.scale)
        elif method == "nearest":
            scale = np.exp2(np.rint(np.log2(params.scale)))
        else:
            scale = _ceil(params.scale)
        return set_params(ctx, qt, scale.reshape(params.scale.shape), self.code, f"power-of-two scale ({method})")


def _ceil(scale: np.ndarray) -> np.ndarray:
    return np.exp2(np.ceil(np.log2(scale)))


def _real_values(ctx: CheckContext, qt: QTensor, params: QParams) -> np.ndarray | None:
    """The float values a weight stands for: the constant behind its Q, or its dequantized integers."""
    if qt.quantize is not None:
        source = resolve_constant(qt.quantize.inputs[0]) if qt.quantize.inputs else None
        return source_values(ctx.model, source).astype(np.float64) if source is not None else None
    source = resolve_constant(qt.integer)
    if source is None or params.granularity != PER_TENSOR:
        return None
    return (source_values(ctx.model, source).astype(np.float64) - params.zero_point.ravel()[0]) * params.scale.ravel()[0]


def _min_error_scale(real: np.ndarray, params: QParams) -> np.ndarray:
    """The power of two, from the non-clipping one down to 4 positions finer, with the least squared error."""
    if params.granularity != PER_TENSOR:
        return _ceil(params.scale)
    qtype, zp = params.qtype, float(params.zero_point.ravel()[0])
    start = -math.ceil(math.log2(float(params.scale.ravel()[0])))
    best, best_error = None, math.inf
    for pos in range(start, start + 5):
        scale = 2.0**-pos
        q = np.clip(np.rint(real / scale) + zp, qtype.qmin, qtype.qmax)
        error = float(np.sum(((q - zp) * scale - real) ** 2))
        if error < best_error:
            best, best_error = scale, error
    return np.asarray(best)
