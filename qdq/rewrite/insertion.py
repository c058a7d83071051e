"""Give a float operand the Q/DQ its consumer should read: reuse one, calibrate one, or quantize a constant.

Placement fixes need a scale for a tensor that has none on this edge. The data-free answers are
the Q the same tensor already has for another consumer (TensorRT's "one Q/DQ per tensor") and
the Q its values reach unchanged through ops that only move them (a nearest Resize, a Reshape);
a constant weight can be quantized from its own values; anything else needs data, which
`qdq fix --calibrate` provides as measured ranges (`CheckContext.ranges`).

These helpers read graph edges, not the quantization index, because one fix run inserts nodes
the index has not seen: the second consumer of a tensor must find the Q the first fix created.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from onnx import helper

from qdq.graph import ir
from qdq.graph.float_types import element_type
from qdq.graph.ops import PER_AXIS_OPSET
from qdq.quant.dtypes import quant_type
from qdq.quant.index import DEQUANTIZE, QDQ_DOMAINS, QUANTIZE, resolve_constant
from qdq.quant.rounding import RoundingCost, along, quantize
from qdq.rewrite.requantize import describe
from qdq.rewrite.rule import Change, CheckContext, FixContext, mention


def existing_quantize(tensor: ir.Tensor) -> ir.Node | None:
    """A per-tensor Q that already quantizes this tensor (one with DQ readers first), if any.

    The output of a Cast to the float type of a Q of the Cast's input counts as that input: ModelOpt
    exports a quantizer's other readers through such a float → float Cast, and a DQ of that Q gives
    its reader the same type."""
    candidates = _quantizes(tensor)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if not candidates and producer is not None and producer.op == "Cast" and producer.inputs:
        to = producer.attrs.get("to")
        candidates = [q for q in _quantizes(producer.inputs[0]) if _scale_type(q) == to]
    candidates.sort(key=lambda q: not _dequantizes_of(q))
    return candidates[0] if candidates else None


def _quantizes(tensor: ir.Tensor) -> list[ir.Node]:
    return [
        n for n in tensor.outputs
        if n.op == QUANTIZE and n.domain in QDQ_DOMAINS and n.inputs and n.inputs[0] is tensor and n.outputs
        and _per_tensor(n)
    ]


def _scale_type(quantize: ir.Node) -> int | None:
    """The ONNX element type of a Q's constant scale (None through a Cast): what a DQ of it outputs."""
    source = resolve_constant(quantize.inputs[1]) if len(quantize.inputs) > 1 else None
    if source is None or any(node.op == "Cast" for node in source.via):
        return None
    return element_type(source.constant.dtype)


def read_through(ctx: FixContext, consumer: ir.Node, slot: int, quantize: ir.Node, code: str, reason: str) -> Change:
    """Point input `slot` of `consumer` at a DQ of `quantize`'s output, creating the DQ if it has none."""
    tensor = consumer.inputs[slot]
    readers = _dequantizes_of(quantize)
    if readers:
        dequantize = readers[0]
    else:
        out = ir.Variable(ctx.new_name(f"{tensor.name}_dequantized"), dtype=tensor.dtype, shape=tensor.shape)
        attrs = {"axis": quantize.attrs["axis"]} if "axis" in quantize.attrs else {}
        dequantize = ir.Node(DEQUANTIZE, ctx.new_name(f"{tensor.name}_DequantizeLinear"), attrs=attrs,
                             inputs=[quantize.outputs[0], *quantize.inputs[1:]], outputs=[out])
        ctx.edits.add_node(dequantize)
    ctx.edits.set_input(consumer, slot, dequantize.outputs[0])
    return Change(code, mention(consumer), tensor.name, "float", f"DQ({mention(quantize)})", reason)


def quantize_hint(ctx: CheckContext, tensor: ir.Tensor, movers: Iterable[str] = ()) -> tuple[bool, str]:
    """Whether a float tensor can get a Q, and how (for a finding's message): its existing Q, the Q
    its values reach through `movers`, the calibration data, or none, in which case the fix needs data."""
    quantize = existing_quantize(tensor)
    if quantize is not None:
        return True, f"; it already has {mention(quantize)} ({describe_quantize(quantize)}) for another consumer"
    quantize = downstream_quantize(tensor, movers)
    if quantize is not None:
        return True, f"; it reaches {mention(quantize)} ({describe_quantize(quantize)}) unchanged, whose grid it can take"
    if ctx.ranges is not None and tensor.name in ctx.ranges:
        return True, "; its scale will come from the calibration data"
    return False, "; no Q/DQ for it exists in the graph, so the scale needs data (run `qdq fix --calibrate FILE.npz` to measure it)"


def quantize_for(ctx: FixContext, tensor: ir.Tensor, dtype: str, movers: Iterable[str] = ()) -> ir.Node | None:
    """The Q a float tensor should be read through: its existing one, else a new one with the grid of the
    Q its values reach through `movers`, else a new one from calibration data."""
    existing = existing_quantize(tensor)
    if existing is not None:
        return existing
    downstream = downstream_quantize(tensor, movers)
    if downstream is not None:
        return _new_quantize(ctx, tensor, downstream.inputs[1:], dict(downstream.attrs), downstream.outputs[0].dtype)
    return calibrated_quantize(ctx, tensor, dtype)


def downstream_quantize(tensor: ir.Tensor, movers: Iterable[str]) -> ir.Node | None:
    """The per-tensor Q that alone reads what a chain of single-consumer `movers` makes of `tensor`.

    Those ops only move, repeat or select values (a Resize only in mode nearest), so quantizing
    `tensor` on that Q's grid gives the very integers the Q makes after them: a scale without data.
    """
    movers = set(movers)
    while len(tensor.outputs) == 1:
        node = tensor.outputs[0]
        if node.op == QUANTIZE and node.domain in QDQ_DOMAINS and node.inputs[0] is tensor and _per_tensor(node):
            return node
        moves = node.op in movers and (node.op != "Resize" or node.attrs.get("mode", "nearest") == "nearest")
        if not moves or not node.outputs or node.inputs[0] is not tensor:
            return None
        tensor = node.outputs[0]
    return None


def calibrated_quantize(ctx: FixContext, tensor: ir.Tensor, dtype: str) -> ir.Node | None:
    """A new Q for `tensor` with a scale from its measured range (None without calibration data)."""
    if ctx.ranges is None or tensor.name not in ctx.ranges:
        return None
    low, high = ctx.ranges[tensor.name]
    scale, zero_point = range_params(low, high, dtype)
    return _new_quantize(ctx, tensor, [
        ir.Constant(ctx.new_name(f"{tensor.name}_scale"), np.asarray(scale, dtype=float_type(tensor))),
        ir.Constant(ctx.new_name(f"{tensor.name}_zero_point"), np.asarray(zero_point).astype(dtype)),
    ], {}, np.dtype(dtype))


def _new_quantize(ctx: FixContext, tensor: ir.Tensor, params: list[ir.Tensor], attrs: dict, dtype) -> ir.Node:
    """A Q of `tensor` with these scale and zero-point tensors (integers of `dtype`), added to the graph."""
    out = ir.Variable(ctx.new_name(f"{tensor.name}_quantized"), dtype=dtype, shape=tensor.shape)
    quantize = ir.Node(QUANTIZE, ctx.new_name(f"{tensor.name}_QuantizeLinear"), inputs=[tensor, *params],
                       outputs=[out], attrs=attrs)
    ctx.edits.add_node(quantize)
    return quantize


def float_type(tensor: ir.Tensor) -> np.dtype:
    """The float type of a tensor a new Q/DQ reads or replaces (its scale must have it); float32 if unknown."""
    try:
        # np.dtype(None) is float64; a tensor holds the ONNX enum for types numpy lacks (bfloat16, `ir.element_dtype`).
        dtype = np.dtype(tensor.dtype) if tensor.dtype is not None else None
    except TypeError:
        dtype = None
    return dtype if dtype in (np.float16, np.float32, np.float64) else np.dtype(np.float32)


def range_params(low: float, high: float, dtype: str) -> tuple[float, int]:
    """Scale and zero-point covering [low, high]: symmetric for signed types, min/max for unsigned."""
    qtype = quant_type(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if qtype.signed:
        scale = max(-low, high) / qtype.qmax
        return (scale if scale > 0 else 1.0), 0
    scale = (high - low) / (qtype.qmax - qtype.qmin)
    if scale <= 0:
        return 1.0, qtype.qmin
    return scale, int(np.clip(np.rint(qtype.qmin - low / scale), qtype.qmin, qtype.qmax))


def quantized_weight(ctx: FixContext, consumer: ir.Node, slot: int, axis: int, code: str) -> Change:
    """Replace a float constant weight by int8 per-channel integers (symmetric, max-abs) and a DQ.

    Before opset 13 a DequantizeLinear has one scale, so the weight gets one max-abs scale: raising
    the model's opset would change what its other ops mean (Squeeze's axes, Split's split)."""
    weight = consumer.inputs[slot]
    scale_type = float_type(weight)  # the DQ gives the scale's type: a float16 model stays float16
    values = np.asarray(weight.values, dtype=np.float64)
    axis = axis % values.ndim
    if ctx.model.opset < PER_AXIS_OPSET:
        amax, grid = np.max(np.abs(values)), "per-tensor"
    else:
        others = tuple(i for i in range(values.ndim) if i != axis)
        amax, grid = (np.max(np.abs(values), axis=others) if others else np.abs(values)), f"per-channel (axis {axis})"
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(scale_type)
    broadcast = along(scale, values.ndim, axis) if scale.ndim else scale
    q, unclipped = quantize(values, broadcast, 0.0, -127, 127)
    cost = RoundingCost.of(values, q, unclipped, broadcast, 0.0).values()
    read_dequantized(ctx, consumer, slot, q.astype(np.int8), scale, axis)
    sqnr = cost.setdefault("sqnr_db", float("inf"))
    where = "per output channel" if scale.ndim else "one scale (opset < 13 has no per-axis DQ)"
    return Change(code, mention(consumer), weight.name, "float", f"int8 {grid}",
                  f"weight quantized from its own values, max-abs {where} (SQNR {sqnr} dB)", cost)


def read_dequantized(ctx: FixContext, consumer: ir.Node, slot: int, integers: np.ndarray, scale: np.ndarray,
                     axis: int) -> None:
    """Point input `slot` of `consumer` (a float constant) at a new DQ of `integers` (zero-point 0).

    `scale` has the constant's float type: 0-d (per tensor), or one element per index of `axis`.
    Only a per-axis DQ gets the `axis` attribute: DequantizeLinear before opset 13 has none.
    """
    constant = consumer.inputs[slot]
    out = ir.Variable(ctx.new_name(f"{constant.name}_dequantized"), dtype=constant.dtype, shape=list(integers.shape))
    dequantize = ir.Node(DEQUANTIZE, ctx.new_name(f"{constant.name}_DequantizeLinear"), attrs={"axis": axis} if scale.ndim else {}, inputs=[
        ctx.model.new_constant(ctx.new_name(f"{constant.name}_quantized"), integers),
        ir.Constant(ctx.new_name(f"{constant.name}_scale"), scale),
        ir.Constant(ctx.new_name(f"{constant.name}_zero_point"), np.zeros(scale.shape, dtype=integers.dtype)),
    ], outputs=[out])
    ctx.edits.add_node(dequantize)
    ctx.edits.set_input(consumer, slot, out)


def describe_quantize(quantize: ir.Node) -> str:
    """`2^-5` or `0.0123 zp 3`, for a Q whose parameters are constants."""
    scale, zero_point = (_constant_values(t) for t in (list(quantize.inputs) + [None, None])[1:3])
    return describe(scale, zero_point if zero_point is not None else np.zeros(1)) if scale is not None else mention(quantize)


def _per_tensor(quantize: ir.Node) -> bool:
    scale = _constant_values(quantize.inputs[1]) if len(quantize.inputs) > 1 else None
    return scale is not None and scale.size == 1


def _constant_values(tensor: ir.Tensor | None) -> np.ndarray | None:
    """A constant's values, also when a Constant node or an Identity/Cast chain holds it (PyTorch's
    convert_fx writes Q parameters so, until QDQ2xx turns them into initializers)."""
    source = resolve_constant(tensor) if tensor is not None else None
    return np.asarray(source.constant.values) if source is not None else None


def _dequantizes_of(quantize: ir.Node) -> list[ir.Node]:
    return [n for n in quantize.outputs[0].outputs if n.op == DEQUANTIZE and n.domain in QDQ_DOMAINS]
