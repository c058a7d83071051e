"""QDQ511: bias correction for the rounding of weights onto one power-of-two grid per tensor."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from qdq.checks.equalization import on_target_grid, read_conv, write_bias
from qdq.quant import equalize
from qdq.rewrite.bias_correction import input_means, shift
from qdq.rewrite.requantize import set_params
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, Severity, mention, register


@register
class BiasCorrection(Rule):
    """Convolutions whose weights, rounded onto one power-of-two grid, shift their mean output.

    Why: the NPU's per-tensor power-of-two grid rounds a conv's narrow channels coarsely, and
    the rounding errors of a channel do not cancel: each output channel's mean moves by
    Σ (Ŵ − W)·E[x]. Subtracting that from the bias removes the shift in expectation (Nagel et
    al. 2019). E[x] per input channel is measured with `qdq fix --calibrate`; without data it
    is modelled only where the conv reads another conv's rectified output (`bias_data_free`,
    docs/equalization.md), and elsewhere the bias stays.

    Example: a 1×1 conv after a Relu, per-channel weights in the input, mean inputs 0.1…2.3.
    The fix writes the weights on their per-tensor power-of-two grid (the one QDQ502 and
    QDQ504 would give: the largest weight does not clip) and the bias, less the shift, as a
    float constant for QDQ610 to quantize. Approximate; the change report gives the weights'
    SQNR and the largest shift removed. Convs that QDQ510 equalizes are corrected there.
    """

    code = "QDQ511"
    name = "bias-correction"
    message = ("{node}: rounding its weights onto one power-of-two grid shifts its mean output by up to {largest:.3g}; "
               "the bias can take it back ({source} input means)")
    severity = Severity.INFO
    fix_safety = FixSafety.APPROXIMATE
    parameters = {"ops": ["Conv"], "bias_data_free": False}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            # Cheapest first: most convs have no known means (no data), and reading weights dequantizes them.
            found = None if on_target_grid(ctx, node) else input_means(ctx, node, ctx.params["bias_data_free"])
            conv = read_conv(ctx, node) if found is not None else None
            if conv is None or found[0].size != conv.values.shape[1] * conv.group:
                continue
            integers, step = equalize.pow2_grid(conv.values)
            moved = shift(conv.values, integers * step, conv.group, found[0])
            if not np.any(moved):
                continue
            yield self.finding(ctx, node, [ctx.value_name(conv.weight)], subject=(conv, moved),
                               largest=float(np.abs(moved).max()), source=found[1])

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        conv, moved = finding.subject
        integers, step = equalize.pow2_grid(conv.values)
        reason = f"{mention(conv.node)}: weights on their per-tensor power-of-two grid, bias corrected"
        changes = set_params(ctx, conv.weight, step, self.code, reason, zero_point=0.0,
                             integers=integers.astype(np.int8))
        bias = (conv.bias if conv.bias is not None else np.zeros(moved.size)) - moved
        changes.append(write_bias(ctx, conv.node, bias, self.code, reason, moved, scaled=False))
        return changes

