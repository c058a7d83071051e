"""QDQ7xx: fixed DPU numerics that the float model does not reproduce.

The AMD NPU/DPU computes a few ops with fixed-point constants of its own: LeakyRelu with a slope
rounded to a multiple of 1/256, Sigmoid as HardSigmoid, HardSigmoid with 2731/16384 instead of 1/6,
and average pooling with a dyadic multiplier instead of 1/(kh·kw). AMD's quantizers (Quark ONNX
`SimulateDPU`, vai_q, pytorch_nndct) rewrite the float graph so that it computes what the DPU
computes; a model that skipped that step is evaluated on CPU with numbers the NPU will not produce.
None of these rules needs Q/DQ to apply; every DPU constant is a rule parameter whose value is in
rules/npu.toml (the defaults here are placeholders that a rule set must replace).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Iterable, Sequence

import numpy as np
import onnx

from qdq.graph import ir
from qdq.quant.index import resolve_constant, source_values
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register
from qdq.support.errors import RuleSetError

# How close a Mul's constant must be to the factor to count as the DPU rescale.
_MUL_RTOL = 1e-9
# How close a HardSigmoid's alpha and beta must be to the DPU's (Quark's check_hard_sigmoid_condition).
_HSIG_ATOL = 1e-6


def dpu_avgpool_multiplier(area: int, search_bits: int, *, table: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The (k, n) with which the DPU approximates 1/area as k/2^n.

    An area listed in `table` uses its fixed (k, n). Otherwise, for n in range(0, search_bits +
    ceil(log2 area)), k_n = round(2^n / area) (Python round, half to even); the n with the smallest
    |k_n/2^n − 1/area| wins, the first (smallest n) on ties, compared in double precision as AMD's
    flows do. A power-of-two area gives k/2^n == 1/area exactly.
    """
    if area < 1:
        raise ValueError(f"kernel area must be positive, got {area}")
    for row in table:
        if len(row) != 3:
            raise ValueError(f"avgpool multiplier table rows are [area, k, n], got {list(row)}")
        if row[0] == area:
            return int(row[1]), int(row[2])
    ceil_log2 = (area - 1).bit_length()  # exact ceil(log2 area) for area >= 1
    best: tuple[float, int, int] | None = None
    for n in range(0, search_bits + ceil_log2):
        k = round(2**n / area)
        diff = abs(k / 2**n - 1 / area)
        if best is None or diff < best[0]:
            best = (diff, k, n)
    if best is None:  # search_bits + ceil_log2 <= 0: no shift to try, divide by 1
        return 1, 0
    return best[1], best[2]


def dpu_avgpool_factor(area: int, search_bits: int, *, table: Sequence[Sequence[int]]) -> float:
    """What the float mean must be multiplied by to give the DPU's mean: area·k/2^n.

    3×3 → 0.984375, 5×5 → 0.9765625, 6×6 → 0.984375, 7×7 and 14×14 → 1.0048828125, and exactly 1.0
    for a power-of-two area, with rules/npu.toml's table and 7 search bits. The first three come
    from the fixed table; the plain search would give 1.001953125, 1.0009765625 and 1.001953125
    there (see `dpu_avgpool_multiplier`).
    """
    k, n = dpu_avgpool_multiplier(area, search_bits, table=table)
    return area * k / 2**n


@register
class LeakyReluSlope(Rule):
    """A LeakyRelu's alpha should be a slope the DPU can represent: a multiple of 1/256.

    Why: the DPU multiplies negative inputs by round(alpha·256)/256 (rounded half to even, as
    Python's `round`), so with alpha = 0.1 it computes 26/256 = 0.1015625·x. The float model,
    and every accuracy number measured with it, uses 0.1. AMD's quantizers rewrite alpha for that
    reason (Quark `ConvertLeakyReluToDPUVersion`; pytorch_nndct hard-codes 0.1015625). An absent
    alpha is the ONNX default 0.01, which the DPU computes as 3/256. The denominator is the
    `slope_denominator` parameter.

    Example: `LeakyRelu(alpha=0.1)`; the fix sets alpha to 0.1015625 so that the float model
    reproduces the hardware. Approximate: negative outputs change by (0.1015625 − 0.1)·x.
    """

    code = "QDQ701"
    name = "leaky-relu-slope"
    message = "LeakyRelu {node} has alpha {alpha:.8g}; the DPU computes it with slope {dpu_alpha:.10g} ({slope})"
    severity = Severity.WARNING
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"slope_denominator": 0}  # rules/npu.toml: 256

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        denominator = _positive_int(ctx, self.code, "slope_denominator")
        for node in ctx.index.nodes_of(["LeakyRelu"]):
            if node.domain not in (None, "", "ai.onnx"):
                continue
            alpha = float(node.attrs.get("alpha", 0.01))
            if not np.isfinite(alpha):
                continue
            numerator = round(alpha * denominator)
            dpu_alpha = numerator / denominator
            # The attribute is float32: a slope that is already the DPU's up to float32 is clean.
            if np.float32(dpu_alpha) == np.float32(alpha):
                continue
            yield self.finding(
                ctx, node, [*node.inputs[:1], *node.outputs[:1]], subject=node,
                alpha=_f32_repr(alpha), dpu_alpha=dpu_alpha, slope=f"{numerator}/{denominator}",
            )

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        node: ir.Node = finding.subject
        old = finding.values["alpha"]
        new = finding.values["dpu_alpha"]
        ctx.edits.set_attr(node, "alpha", float(new))
        return [Change(self.code, mention(node), None, old, new, f"alpha set to the DPU slope {finding.values['slope']}")]


@register
class HardSigmoidDpu(Rule):
    """The DPU computes HardSigmoid(1/6) with 2731/16384, and Sigmoid as that HardSigmoid.

    Why: for a HardSigmoid with alpha ≈ 1/6 and beta 0.5 (absent or 0.5), the DPU computes
    x·2731/16384 + 0.5 instead of x/6 + 0.5: a slope 1.22e-4 (relative) steeper. AMD's quantizers
    make the float model reproduce it with a Mul by `dpu_factor` = (2731/16384)/(1/6) =
    1.0001220703125 right after the HardSigmoid (Quark `ConvertHardSigmoidToDPUVersion`); this
    rule reports a qualifying HardSigmoid whose only reader is not such a Mul (a constant equal to
    `dpu_factor` within 1e-9 relative). The DPU compiler also replaces every Sigmoid with that
    HardSigmoid (Quark `ConvertSigmoidToHardSigmoid`), so with `sigmoid_replaced` every Sigmoid is
    reported too: the NPU will not compute 1/(1 + e^-x). Parameters: `alpha`, `beta`,
    `dpu_factor`, `sigmoid_replaced`. Information only; there is no fix.

    Example: `HardSigmoid(alpha=0.1666667) → QuantizeLinear`, or `Conv → Sigmoid → Mul` (a SiLU):
    on the NPU both compute x·2731/16384 + 0.5, clipped to [0, 1].
    """

    code = "QDQ702"
    name = "hard-sigmoid-dpu"
    message = "{op} {node}: the DPU computes {dpu} instead of {float_model}{detail}"
    severity = Severity.INFO
    parameters = {"alpha": 0.0, "beta": 0.0, "dpu_factor": 0.0, "sigmoid_replaced": False}  # rules/npu.toml

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        alpha, beta = _positive_float(ctx, self.code, "alpha"), float(ctx.params["beta"])
        factor = _positive_float(ctx, self.code, "dpu_factor")
        slope = Fraction(alpha * factor).limit_denominator(1 << 20)
        dpu = f"x·{slope.numerator}/{slope.denominator} + {beta:g}"
        for node in ctx.graph.nodes:
            if node.domain not in (None, "", "ai.onnx") or not node.outputs:
                continue
            if node.op == "Sigmoid" and ctx.params["sigmoid_replaced"]:
                yield self.finding(
                    ctx, node, [*node.inputs[:1], node.outputs[0]], op=node.op, dpu=f"HardSigmoid {dpu}",
                    float_model="1/(1 + e^-x)", detail=" (the DPU compiler replaces Sigmoid with HardSigmoid)",
                    dpu_factor=factor,
                )
            elif node.op == "HardSigmoid":
                node_alpha = float(node.attrs.get("alpha", 0.2))
                node_beta = float(node.attrs.get("beta", 0.5))
                if abs(node_alpha - alpha) >= _HSIG_ATOL or abs(node_beta - beta) >= _HSIG_ATOL:
                    continue
                if _rescaled_by(ctx, node.outputs[0], factor):
                    continue
                yield self.finding(
                    ctx, node, [*node.inputs[:1], node.outputs[0]], op=node.op, dpu=dpu,
                    float_model=f"x·{_f32_repr(node_alpha):.7g} + {beta:g}",
                    detail=f" (relative difference {factor - 1:.2e}; no Mul by {factor!r} follows to reproduce it)",
                    dpu_factor=factor,
                )


@register
class AvgPoolDpuMultiplier(Rule):
    """An average pool whose kernel area is not a power of two is rescaled on the DPU.

    Why: the DPU does not divide by the kernel area. It computes the mean of a kh×kw window as
    sum·k/2^n, which for a kernel area A that is not a power of two is not sum/A: a 3×3 pool
    computes sum·7/64, 0.984375 times the mean. AMD's quantizers insert a `Mul` by that factor
    after the pool so that the float model reproduces it (Quark `ConvertAvgPoolToDPUVersion`);
    this rule reports a pool whose only reader is not such a Mul (a constant equal to the factor
    within 1e-9 relative, or equal in the constant's own type).

    The factor is A·k/2^n. Areas in `table` (rows [area, k, n]; by default 3×3, 5×5, 6×6, 7×7 and
    14×14, which AMD's flows hard-code) use their fixed k/2^n; for any other area, k_n = round(2^n/A)
    for n in range(0, `search_bits` + ceil(log2 A)) and the n with the smallest |k_n/2^n − 1/A| wins
    (the first on ties). The plain search does not reproduce the hard-coded 3×3, 5×5 and 6×6 values
    (it would pick 57/512, 41/1024 and 57/2048), so the table is needed. A kernel side above
    `max_kernel` is not rescaled (factor 1.0).

    Ops are `ops` (AveragePool, GlobalAveragePool), 2-D kernels only: AveragePool's `kernel_shape`,
    GlobalAveragePool's input height and width. A GlobalAveragePool whose input shape is unknown
    (no value_info, and ONNX shape inference cannot tell) is skipped rather than guessed, so the
    rule never reports a kernel it has not seen. AMD's ONNX flow rescales square kernels only; a
    non-square one is reported with the factor for its area and marked non-square, as the DPU
    still divides by a dyadic multiplier. Quark splits a GlobalAveragePool with kh·kw > 512 into
    two smaller pools with factors of their own; for those the factor reported, computed for the
    whole area, is an estimate.

    Example: `GlobalAveragePool` over a 1×1280×7×7 tensor → `QuantizeLinear`: the DPU computes
    1.0048828125 times the float mean; insert `Mul(1.0048828125)` before the Q.
    """

    code = "QDQ703"
    name = "avgpool-dpu-multiplier"
    message = (
        "{op} {node} has a {kernel} kernel; the DPU computes the mean as sum·{k}/2^{shift}, "
        "{factor:.10g} times the float mean, and no Mul by that factor follows{detail}"
    )
    severity = Severity.WARNING
    parameters = {
        "ops": ["AveragePool", "GlobalAveragePool"],
        "search_bits": 0,  # rules/npu.toml: 7, 255 and AMD's fixed multipliers
        "max_kernel": 0,
        "table": [],
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ops = set(ctx.params["ops"])
        search_bits = ctx.params["search_bits"]
        if not isinstance(search_bits, int) or search_bits < 0:
            raise RuleSetError(f"{self.code}.search_bits must be a non-negative integer, got {search_bits!r}")
        max_kernel = _positive_int(ctx, self.code, "max_kernel")
        table = ctx.params["table"]
        if any(len(row) != 3 for row in table):
            raise RuleSetError(f"{self.code}.table rows must be [area, k, n], got {table}")
        shapes = _InferredShapes(ctx)
        for node in ctx.index.nodes_of(ops):
            if node.domain not in (None, "", "ai.onnx") or not node.outputs:
                continue
            kernel = _kernel_of(node, shapes)
            if kernel is None or max(kernel) > max_kernel:
                continue
            area = kernel[0] * kernel[1]
            k, shift = dpu_avgpool_multiplier(area, search_bits, table=table)
            factor = area * k / 2**shift
            if factor == 1.0 or _rescaled_by(ctx, node.outputs[0], factor):
                continue
            detail = ""
            if kernel[0] != kernel[1]:
                detail = f" (non-square: AMD's ONNX flow does not rescale it; factor for area {area})"
            yield self.finding(
                ctx, node, [*node.inputs[:1], node.outputs[0]], op=node.op, kernel=kernel,
                factor=factor, k=k, shift=shift, detail=detail,
            )


def _kernel_of(node: ir.Node, shapes: _InferredShapes) -> list[int] | None:
    """The [kh, kw] a pool averages over, or None when it is not a known 2-D kernel."""
    if node.op == "GlobalAveragePool":
        if not node.inputs:
            return None
        shape = shapes.of(node.inputs[0])
        if shape is None or len(shape) != 4:
            return None
        kernel = shape[2:]
    else:
        kernel = node.attrs.get("kernel_shape")
        if kernel is None:
            return None
    kernel = list(kernel)
    if len(kernel) != 2 or not all(isinstance(d, (int, np.integer)) and d > 0 for d in kernel):
        return None
    return [int(d) for d in kernel]


class _InferredShapes:
    """Static shapes: the graph's own, else ONNX shape inference on the model (run once, on demand)."""

    def __init__(self, ctx: CheckContext):
        self._ctx = ctx
        self._inferred: dict[str, list[Any]] | None = None

    def of(self, tensor: ir.Tensor) -> list[Any] | None:
        if tensor.shape is not None and _static(tensor.shape):
            return list(tensor.shape)
        if self._inferred is None:
            self._inferred = self._infer()
        shape = self._inferred.get(tensor.name)
        return shape if shape is not None and _static(shape) else None

    def _infer(self) -> dict[str, list[Any]]:
        try:
            inferred = onnx.shape_inference.infer_shapes(self._ctx.model.proto)
        except Exception:  # a model shape inference cannot handle: shapes stay unknown
            return {}
        shapes: dict[str, list[Any]] = {}
        graph = inferred.graph
        for info in [*graph.value_info, *graph.input, *graph.output]:
            tensor_type = info.type.tensor_type
            if not tensor_type.HasField("shape"):
                continue
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        return shapes


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, (int, np.integer)) and d > 0 for d in shape)


def _rescaled_by(ctx: CheckContext, tensor: ir.Tensor, factor: float) -> bool:
    """Whether the only reader of `tensor` is a Mul by a constant equal to `factor`.

    Equal means within 1e-9 relative, or equal once the factor is rounded to the constant's type.
    """
    if ctx.index.is_graph_output(tensor) or len(tensor.outputs) != 1:
        return False
    mul = tensor.outputs[0]
    if mul.op != "Mul" or mul.domain not in (None, "", "ai.onnx") or len(mul.inputs) != 2:
        return False
    others = [t for t in mul.inputs if t is not tensor]
    if len(others) != 1:
        return False
    source = resolve_constant(others[0])
    if source is None:
        return False
    try:
        values = np.asarray(source_values(ctx.model, source))
    except Exception:  # unreadable external data: cannot tell, so not a rescale
        return False
    if values.size == 0 or not np.issubdtype(values.dtype, np.floating):
        return False
    as_type = np.asarray(factor).astype(values.dtype)
    close = np.abs(values.astype(np.float64) - factor) <= _MUL_RTOL * abs(factor)
    return bool(np.all(close | (values == as_type)))


def _positive_int(ctx: CheckContext, code: str, key: str) -> int:
    value = ctx.params[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise RuleSetError(f"{code}.{key} must be a positive integer, got {value!r} (rules/npu.toml sets the DPU's)")
    return value


def _positive_float(ctx: CheckContext, code: str, key: str) -> float:
    value = float(ctx.params[key])
    if not np.isfinite(value) or value <= 0:
        raise RuleSetError(f"{code}.{key} must be a positive number, got {value!r} (rules/npu.toml sets the DPU's)")
    return value


def _f32_repr(value: float) -> float:
    """A float32 attribute value as it was written: 0.1, not 0.10000000149011612."""
    return float(str(np.float32(value)))
