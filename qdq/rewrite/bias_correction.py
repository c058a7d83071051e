"""Bias correction: the mean output shift a weight's rounding causes, and what the graph tells of a conv's mean input.

Rounding a conv's weights W to Ŵ moves each output channel's mean by Σ (Ŵ − W)·E[x] over the
weights that read input channel c, times that channel's mean E[x_c] (Nagel et al. 2019). The
per-tensor power-of-two grid rounds the narrow channels coarsely and not symmetrically, so the
shift does not average out; subtracting it from the bias removes it, exactly in expectation.

What E[x_c] is depends on what is known (docs/equalization.md):

- measured: with `qdq fix --calibrate`, each channel's mean over the samples, as the input
  model computes it (`qdq.quant.calibrate.Measured`);
- modelled, without data, only where the conv reads the rectified output of another conv P
  (a Relu, a Clip from 0, or a Q whose zero-point sits at its type's minimum): P's channel c
  is taken as Gaussian with mean b_c (P's bias) and standard deviation σ_c = k·‖w_c‖₂ / 4, k
  chosen so that the largest channel's b_c + 4σ_c reaches the range P's Q covers; the mean
  of the rectified Gaussian is b·Φ(b/σ) + σ·φ(b/σ). Elsewhere (a linear input, a pool, an
  Add) nothing in the graph gives the mean, and the bias is left as it is.
"""

from __future__ import annotations

import math

import numpy as np

from qdq.graph import ir
from qdq.quant import equalize
from qdq.quant.index import resolve_constant, source_values
from qdq.quant.operands import BIAS_INPUT, WEIGHT_INPUT, input_value
from qdq.rewrite.requantize import effective_values
from qdq.rewrite.rule import CheckContext

# How far above a channel's mean the Q's range is taken to reach, in standard deviations: the
# largest of the 10^4 to 10^6 values a calibration set gives a channel.
_SIGMAS_IN_RANGE = 4.0


def shift(ideal: np.ndarray, held: np.ndarray, group: int, means: np.ndarray) -> np.ndarray:
    """Each output channel's expected shift, Σ (held − ideal)·E[x] over its weights (borders' padding ignored)."""
    channels = equalize.input_channels(ideal.shape, group)
    error = (held - ideal).reshape(ideal.shape[0], ideal.shape[1], -1).sum(axis=2)
    return (error * means[channels]).sum(axis=1)


def input_means(ctx: CheckContext, conv: ir.Node, data_free: bool) -> tuple[np.ndarray, str] | None:
    """E[x_c] for each input channel of a conv, and whether it was "measured" or "modelled"; None if unknown."""
    tensor = conv.inputs[0]
    measured = getattr(ctx.ranges, "channel_mean", None) or {}
    if tensor.name in measured:
        return np.asarray(measured[tensor.name], dtype=np.float64), "measured"
    if not data_free:
        return None
    modelled = _rectified_means(ctx, conv)
    return (modelled, "modelled") if modelled is not None else None


def _rectified_means(ctx: CheckContext, conv: ir.Node) -> np.ndarray | None:
    """The model above, for a conv reading a rectified conv output through its Q/DQ."""
    dequantize = ctx.index.dequantize_feeding(conv.inputs[0])
    value = ctx.index.qtensor_of(dequantize) if dequantize is not None else None
    if value is None or value.quantize is None or value.float_input is None:
        return None
    params = ctx.index.params(value.quantize)
    if params.dynamic or params.scale.size != 1 or params.qtype is None:
        return None
    zero_point, step = float(params.zero_point.ravel()[0]), float(params.scale.ravel()[0])
    rectified = zero_point == params.qtype.qmin
    tensor = value.float_input
    for _ in range(4):  # back through a Relu and a Q/DQ pair to the conv that makes the values
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if producer is None:
            return None
        if producer.op in ("Relu", "Clip") and _from_zero(ctx, producer):
            rectified, tensor = True, producer.inputs[0]
        elif producer.op == "DequantizeLinear":
            source = ctx.index.qtensor_of(producer)
            if source is None or source.quantize is None or source.float_input is None:
                return None
            tensor = source.float_input
        elif producer.op == "Conv" and rectified:
            return _rectified_gaussian(ctx, producer, (params.qtype.qmax - zero_point) * step)
        else:
            return None
    return None


def _from_zero(ctx: CheckContext, node: ir.Node) -> bool:
    """A Relu, or a Clip whose lower bound is 0."""
    if node.op == "Relu":
        return True
    low = node.attrs.get("min")
    if len(node.inputs) > 1 and node.inputs[1].name:
        source = resolve_constant(node.inputs[1])
        low = float(source_values(ctx.model, source).ravel()[0]) if source is not None else None
    return low == 0


def _rectified_gaussian(ctx: CheckContext, producer: ir.Node, largest: float) -> np.ndarray | None:
    weight = input_value(ctx.index, producer, WEIGHT_INPUT["Conv"])
    values = effective_values(ctx, weight) if weight is not None else None
    if values is None or largest <= 0:
        return None
    bias = conv_bias(ctx, producer)
    norms = np.sqrt(np.square(values.astype(np.float64)).reshape(values.shape[0], -1).sum(axis=1))
    means = bias if bias is not None else np.zeros_like(norms)
    amplitude = equalize.amplitudes(values, np.maximum(means, 0), largest)  # b_c + k·‖w_c‖ reaches the range
    sigma = np.maximum(amplitude - np.maximum(means, 0), 1e-12 * largest) / _SIGMAS_IN_RANGE
    ratio = means / sigma
    phi = np.exp(-ratio ** 2 / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(ratio / math.sqrt(2)))
    return means * cdf + sigma * phi


def conv_bias(ctx: CheckContext, node: ir.Node) -> np.ndarray | None:
    """A conv's bias as the model computes it: dequantized, or the float constant; None without one or if computed."""
    slot = BIAS_INPUT[node.op]
    if slot >= len(node.inputs) or not node.inputs[slot].name:
        return None
    quantized = input_value(ctx.index, node, slot)
    if quantized is not None:
        values = effective_values(ctx, quantized)
    else:
        source = resolve_constant(node.inputs[slot])
        values = source_values(ctx.model, source) if source is not None else None
    return values.astype(np.float64).ravel() if values is not None else None

