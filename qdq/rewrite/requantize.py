"""Give a quantized value new parameters, keeping what the model computes as close as the new grid allows.

This is where the reference NPU tool goes wrong (defects D1-D4 in the NPU catalogue): it rewrites
a DequantizeLinear's scale but leaves the stored integers alone, so every weight silently changes
by 2^(old - new). Here a scale change:

- reaches every Q and DQ of the value, found through graph edges (`QTensor.nodes`), never names;
- never edits a constant in place: new constants are created, so an initializer shared with
  another value keeps its old contents;
- re-quantizes stored integers (int8 weights, int32 biases) with round-half-to-even and clipping,
  `q_new = clip(rint((q_old - zp_old) * s_old / s_new) + zp_new)`, and measures the cost:
  values saturated, non-zero values rounded to zero, and the SQNR of the dequantized tensor;
- for a float weight behind a Q (fake-quantized QAT exports), starts from the effective weights:
  the model computes with the float constant rounded and clipped by the old grid, so the Q is
  given those values as a new constant before its grid changes; a weight the old scale clipped
  at ±127 would otherwise grow by up to new scale / old scale. The cost is measured against them.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Iterator, Sequence

import numpy as np
from onnx import helper

from qdq.graph import ir
from qdq.graph.ops import QUANTIZE
from qdq.quant import pow2
from qdq.quant.dtypes import QuantType, quant_type
from qdq.quant.index import QParams, QTensor, clipped_integers, resolve_constant, source_values
from qdq.quant.rounding import RoundingCost, along, cost_sentence, quantize
from qdq.rewrite.rule import Change, CheckContext, FixContext, mention
from qdq.support import progress

# Values per block when re-quantizing a weight: bounds the float64 temporaries (~40 bytes a value).
_BLOCK_ELEMENTS = 1 << 22

log = logging.getLogger("qdq")


def set_params(
    ctx: FixContext,
    qt: QTensor,
    scale: float | np.ndarray,
    code: str,
    reason: str,
    zero_point: float | np.ndarray | None = None,
    axis: int | None = None,
    elem_type: int | None = None,
    integers: np.ndarray | None = None,
    going: Sequence[ir.Node] = (),
) -> list[Change]:
    """Set the scale (and optionally zero-point, axis and integer type) of every Q and DQ of `qt`; one Change.

    `scale` may change shape (per-axis to per-tensor); `zero_point` defaults to the old one,
    which must then be uniform; `elem_type` (an ONNX type, int8 → uint8 say) is carried by the
    new zero-point constant. `integers` are the values the new grid should hold when the caller
    chose them itself rather than by rounding (QDQ508 moves weight pairs onto a bound); the cost
    is then measured against the values the model computed before. `going` are nodes the caller
    removes in the same fix, whose reading or writing of the integers does not hold their grid.
    Returns no change when the values are already these, or when others hold the grid
    (`why_grid_is_fixed`).
    """
    first = ctx.index.params(qt.nodes[0])
    name = ctx.value_name(qt)
    if first.dynamic:
        raise ValueError(f"{qt.integer.name}: parameters are computed at run time")
    if first.block_size:  # a rule offered a fix it cannot make: leave the value as it is, say so
        log.warning("%s: blocked parameters (block_size %d) are not re-quantized; left unchanged", name, first.block_size)
        return []
    old_scale, old_zp = first.scale, first.zero_point
    new_scale = np.asarray(scale, dtype=np.float64)
    new_zp = _new_zero_point(old_zp, new_scale, zero_point)
    new_axis = first.axis if axis is None else axis
    new_type = first.elem_type if elem_type is None else elem_type
    moves = _zero_point_moves(old_zp, new_zp) or new_type != first.elem_type
    fixed = why_grid_is_fixed(ctx, qt, going, zero_point_moves=moves)
    keeps_values = new_type == first.elem_type and same_real_values(old_scale, old_zp, new_scale, new_zp)
    if fixed is not None and not keeps_values:
        # Someone else reads or writes these integers on the grid they have, and it would change.
        log.warning("%s: %s; its parameters are left unchanged", name, fixed)
        return []
    if (_same(old_scale, new_scale) and _same(old_zp, new_zp) and new_axis == first.axis
            and new_type == first.elem_type and integers is None):
        return []

    # Each node keeps the float type it reads its scale in (a Q's fixes its input type, a DQ's its
    # output type; onnxruntime's optimizer gives a float16 Q's DQ a Cast of the scale to float32),
    # with one value: the first node's rounding, which every wider type holds exactly.
    stored_scale = new_scale.astype(_np_type(first.scale_source.elem_type))
    if not np.all(np.isfinite(stored_scale) & (stored_scale > 0)):
        # A scale beyond the scale type's range (2^-25 in float16) would be stored as 0 or inf.
        log.warning("%s: scale %s is not representable as %s; left unchanged", name, describe(new_scale, new_zp),
                    stored_scale.dtype)
        return []
    scale_types = [_scale_dtype(ctx, node, stored_scale.dtype) for node in qt.nodes]
    scale_consts = {dtype: ir.Constant(ctx.new_name(f"{name}_scale"), stored_scale.astype(dtype))
                    for dtype in dict.fromkeys(scale_types)}
    zp_const = None
    if first.zero_point_input is not None or np.any(new_zp != 0) or new_type != first.elem_type:
        zp_const = ir.Constant(ctx.new_name(f"{name}_zero_point"), new_zp.astype(_np_type(new_type)))
    values: dict = {}
    if integers is not None:
        values = _write_integers(ctx, qt, integers, new_scale, new_zp, new_axis, new_type)
    elif qt.stored:
        values = _requantize_stored(ctx, qt, first, new_scale, new_zp, new_axis, new_type)
    elif qt.quantize is not None and not _same_grid(first, new_scale, new_zp, new_axis, new_type):
        values = _pin_float_constant(ctx, qt, new_scale, new_zp, new_axis, new_type)
    for node, scale_type in zip(qt.nodes, scale_types):
        scale_const = scale_consts[scale_type]
        # output_dtype 0 leaves the type to the zero-point, which carries it: setting it anyway
        # trips onnxruntime's int8 → uint8 rewrite, which changes the zero-point but not the attribute.
        dtype = {"output_dtype": new_type} if node.attrs.get("output_dtype") else {}
        ctx.edits.swap_params(node, scale_const, zp_const, axis=new_axis if new_scale.size > 1 else None, **dtype)
    values.update(_pos_shift(old_scale, new_scale))
    return [Change(code, mention(qt.nodes[0]), name, describe(old_scale, old_zp), describe(new_scale, new_zp),
                   cost_sentence(reason, values), values)]


def why_grid_is_fixed(ctx: CheckContext, qt: QTensor, going: Sequence[ir.Node] = (),
                      zero_point_moves: bool = True) -> str | None:
    """Why a value's integers must keep their scale and zero-point, if they must.

    `set_params` rewrites the value's Q, DQs and stored integers. Integers that the caller
    exchanges (a graph input or output), that another op writes (QLinearConv, QGemm, an integer
    Reshape), or that another op reads with its own parameters would then mean something else;
    nodes in `going` are about to be removed and do not count. An integer Clip (PyTorch's
    reduced-range or narrow-range quantizer, QDQ509) counts only when the zero-point moves: its
    bounds are steps from the zero-point, which a new scale leaves as they were.
    """
    if ctx.index.is_graph_output(qt.integer):
        return "its integers are a graph output"
    if ctx.index.is_interface(qt.integer):
        return "its integers are a graph input"

    def holds(node: ir.Node) -> bool:
        return not any(node is other for other in going) and (zero_point_moves or node.op != "Clip")

    if qt.stored:  # new integers go to a new constant: other readers keep the old one
        return None
    producer = qt.integer.inputs[0] if qt.integer.inputs else None
    if qt.quantize is None and (producer is None or holds(producer)):
        return f"its integers come from {mention(producer)} ({producer.op})" if producer is not None \
            else "its integers come from outside the Q/DQ nodes"
    if qt.quantize is None and producer is not None and producer.op == "Clip" and not any(producer is g for g in going):
        source = _clipped_source(producer)
        if source is not None:  # Brevitas's weights: a new scale would leave them as they are
            return f"its integers are {source} through Clip {mention(producer)} (QDQ509 folds it)"
    for consumer, _ in ctx.index.consumers_through(qt.integer):
        if consumer not in qt.dequantizes and holds(consumer):
            return f"{mention(consumer)} ({consumer.op}) reads its integers"
    return None


def _clipped_source(clip: ir.Node) -> str | None:
    """The tensor a chain of integer Clips ending at `clip` reads, unless a QuantizeLinear writes it
    (then a new scale re-quantizes the float values and the Clip's bounds stay steps: None)."""
    _, tensor = clipped_integers(clip.outputs[0])
    producer = tensor.inputs[0] if tensor.inputs else None
    return None if producer is not None and producer.op == QUANTIZE else tensor.name


def why_type_is_fixed(ctx: CheckContext, qt: QTensor) -> str | None:
    """Why a value's integer type cannot change by editing only its own Q/DQ constants, if it cannot."""
    fixed = why_grid_is_fixed(ctx, qt)
    if fixed is not None:
        return fixed
    first = ctx.index.params(qt.nodes[0])
    if not all(first.same_values(ctx.index.params(n)) for n in qt.nodes[1:]):
        return "its Q and DQs disagree (QDQ101)"
    for consumer, via in ctx.index.consumers_through(qt.integer):
        if any(n.op == "Cast" for n in via):
            return "a Cast sits between its integers and its DQ (QDQ203 removes it)"
        if consumer not in qt.dequantizes:
            return f"{mention(consumer)} ({consumer.op}) reads its integers"
    return None


def describe(scale: np.ndarray, zero_point: np.ndarray) -> str:
    """`2^-7` for a power-of-two scale, else the number; the zero-point only when it is not 0."""
    flat = np.asarray(scale, dtype=np.float64).ravel()
    if flat.size == 1:
        value = float(flat[0])
        text = f"2^{-pow2.int_pos(value)}" if pow2.is_pow2(value) else f"{value:.6g}"
    else:
        text = f"{flat.size} per-axis scales in [{flat.min():.6g}, {flat.max():.6g}]"
    zps = np.asarray(zero_point).ravel()
    zps = zps if zps.size <= 1 else np.unique(zps)
    if zps.size > 1 or (zps.size == 1 and zps[0] != 0):
        text += f" zp {int(zps[0])}" if zps.size == 1 else " per-axis zp"
    return text


def _requantize_stored(
    ctx: FixContext, qt: QTensor, params: QParams, scale: np.ndarray, zp: np.ndarray, axis: int, elem_type: int
) -> dict:
    """Write re-quantized integers as a new constant read by every DQ of the value."""
    source = resolve_constant(qt.integer)
    old_q = source_values(ctx.model, source)  # memory-mapped when the weights are external

    def real(rows: slice) -> np.ndarray:
        block = old_q[rows].astype(np.float64)
        zero_point, old_scale = (along(v, old_q.ndim, params.axis, rows) for v in (params.zero_point, params.scale))
        return (block - zero_point) * old_scale

    new_q, values = quantize_blocks(real, old_q.shape, scale, zp, axis, quant_type(elem_type), _np_type(elem_type))
    _store_integers(ctx, qt, new_q)
    return values


def _store_integers(ctx: FixContext, qt: QTensor, integers: np.ndarray) -> None:
    """A new constant of stored integers, read by every DQ of the value."""
    name = ctx.value_name(qt)
    constant = ctx.model.new_constant(ctx.new_name(f"{name}_requantized", replacing=qt.integer.name), integers)
    for node in qt.dequantizes:
        ctx.edits.set_input(node, 0, constant)
    # The index outlives this edit (the fix driver keeps it while fixes only swap constants): point
    # the value at its new integers, or a second move in the same run would re-quantize the old
    # ones with the new scale, changing every weight by old scale / new scale.
    qt.integer = constant


def _pin_float_constant(
    ctx: FixContext, qt: QTensor, scale: np.ndarray, zp: np.ndarray, axis: int, elem_type: int
) -> dict:
    """For a float weight behind a Q: replace the constant by its effective values; measure the new grid on them."""
    weights = effective_values(ctx, qt)
    if weights is None:
        return {}
    _pin_float_input(ctx, qt, weights)

    def real(rows: slice) -> np.ndarray:
        return weights[rows].astype(np.float64)

    return quantize_blocks(real, weights.shape, scale, zp, axis, quant_type(elem_type), None)[1]


def _pin_float_input(ctx: FixContext, qt: QTensor, weights: np.ndarray) -> None:
    """A new float constant for the value's Q to read."""
    name = ctx.value_name(qt)
    constant = ctx.model.new_constant(ctx.new_name(f"{name}_effective", replacing=qt.float_input.name), weights)
    ctx.edits.set_input(qt.quantize, 0, constant)
    qt.float_input = constant  # as `qt.integer` for stored integers: a second move starts from these


def _write_integers(
    ctx: FixContext, qt: QTensor, integers: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, elem_type: int
) -> dict:
    """Make the value hold `integers` on the new grid; the cost against its effective values before.

    Stored integers become a new constant. A float weight behind a Q is pinned to the real values
    the integers stand for, which that Q maps back to exactly these integers (|q| ≤ 2^23).
    """
    before = effective_values(ctx, qt)
    if before is None:
        raise ValueError(f"{ctx.value_name(qt)}: integers computed in the graph cannot be replaced")
    s, z = along(scale, integers.ndim, axis), along(zp, integers.ndim, axis)
    stored = np.asarray(integers).astype(_np_type(elem_type))
    if qt.stored:
        _store_integers(ctx, qt, stored)
    else:
        _pin_float_input(ctx, qt, ((stored.astype(np.float64) - z) * s).astype(before.dtype))
    held = stored.astype(np.float64)
    return RoundingCost.of(before.astype(np.float64), held, held, s, z).values()


def effective_values(ctx: CheckContext, qt: QTensor) -> np.ndarray | None:
    """The float values a weight stands for as the model computes them; None if they are computed in the graph.

    Stored integers are dequantized; a float constant behind a Q is rounded and clipped by that
    Q (a fake-quantized weight's trained values are the clipped ones), in the constant's type.
    Float quantized types (float8) are not modelled: None.
    """
    params = ctx.index.params(qt.nodes[0])
    qtype = params.qtype
    if qtype is None or qtype.is_float:
        return None
    if qt.stored:
        integers = source_values(ctx.model, resolve_constant(qt.integer))
        out = np.empty(integers.shape, dtype=_np_type(params.scale_source.elem_type))
    else:
        source = resolve_constant(qt.quantize.inputs[0]) if qt.quantize is not None and qt.quantize.inputs else None
        if source is None:
            return None
        weights = source_values(ctx.model, source)
        out = np.empty_like(weights)
    for rows in _row_blocks(out.shape):
        s, z = (along(v, out.ndim, params.axis, rows) for v in (params.scale, params.zero_point))
        if qt.stored:
            q = integers[rows].astype(np.float64)
        else:  # divided in the weight's own type, as QuantizeLinear does
            q = np.clip(np.rint(weights[rows] / s.astype(weights.dtype)) + z, qtype.qmin, qtype.qmax)
        out[rows] = (q - z) * s
    return out


def _same_grid(params: QParams, scale: np.ndarray, zp: np.ndarray, axis: int, elem_type: int) -> bool:
    """Whether new parameters represent the same real values, steps and range (a type shift: int8 ↔ uint8 + 128)."""
    old_type, new_type = params.qtype, quant_type(elem_type)
    return (
        old_type is not None and new_type is not None
        and _same(params.scale, scale) and (scale.size == 1 or axis == params.axis)
        and _same(old_type.qmin - params.zero_point, new_type.qmin - zp)
        and _same(old_type.qmax - params.zero_point, new_type.qmax - zp)
    )


def quantize_blocks(
    real: Callable[[slice], np.ndarray], shape: tuple[int, ...], scale: np.ndarray, zp: np.ndarray, axis: int,
    qtype: QuantType, dtype: np.dtype | None,
) -> tuple[np.ndarray | None, dict]:
    """QuantizeLinear's arithmetic and its cost on a tensor given block by block.

    `real(rows)` gives the float values of a block of rows (along the first axis). Blocks keep the
    float64 temporaries of a multi-GB weight to a few hundred MB. The integers come back in
    `dtype`; with None only the cost is measured and no integers are kept.
    """
    q = np.empty(shape, dtype=dtype) if dtype is not None else None
    cost = RoundingCost()
    for rows in _row_blocks(shape):
        progress.tick()  # a multi-GB weight takes minutes
        block = real(rows)
        s, z = along(scale, len(shape), axis, rows), along(zp, len(shape), axis, rows)
        clipped, unclipped = quantize(block, s, z, qtype.qmin, qtype.qmax)
        cost += RoundingCost.of(block, clipped, unclipped, s, z)
        if q is not None:
            q[rows] = clipped
    return q, cost.values()


def _pos_shift(old: np.ndarray, new: np.ndarray) -> dict:
    """Bits lost (positive) or gained by a per-tensor power-of-two move, for the report."""
    if old.size == 1 and new.size == 1 and pow2.is_pow2(float(old.ravel()[0])) and pow2.is_pow2(float(new.ravel()[0])):
        return {"bits_lost": pow2.int_pos(float(old.ravel()[0])) - pow2.int_pos(float(new.ravel()[0]))}
    return {}


def _new_zero_point(old: np.ndarray, scale: np.ndarray, given: float | np.ndarray | None) -> np.ndarray:
    if given is not None:
        return np.broadcast_to(np.asarray(given, dtype=np.float64), scale.shape).copy()
    if old.shape == scale.shape:
        return old.copy()
    uniform = np.unique(old.ravel())
    if uniform.size > 1:
        raise ValueError("per-axis zero-points cannot follow a per-tensor scale")
    return np.full(scale.shape, uniform[0] if uniform.size else 0.0)


def _row_blocks(shape: tuple[int, ...]) -> Iterator[slice]:
    """Slices of about _BLOCK_ELEMENTS values along the first axis (`...`, all of it, for a 0-d tensor)."""
    if not shape:
        yield ...
        return
    per_row = max(1, math.prod(shape[1:]))
    step = max(1, _BLOCK_ELEMENTS // per_row)
    for start in range(0, max(shape[0], 1), step):
        yield slice(start, start + step)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _scale_dtype(ctx: CheckContext, node: ir.Node, default: np.dtype) -> np.dtype:
    """The float type a Q or DQ reads its scale in (`default` when the scale is computed at run time)."""
    source = ctx.index.params(node).scale_source
    return _np_type(source.elem_type) if source is not None else default


def same_real_values(old_scale: np.ndarray, old_zp: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> bool:
    """Whether every integer of the old grid means the same real value on the new one (per-axis
    scales that are all equal becoming that one scale, say)."""
    if scale.size != 1 and scale.shape != old_scale.shape:
        return False
    return bool(np.all(old_scale == scale) and np.all(old_zp == zp))


def _zero_point_moves(old: np.ndarray, new: np.ndarray) -> bool:
    """Whether some integer's zero-point changes (per-axis zeros becoming one zero is no change)."""
    if _same(old, new):
        return False
    before, after = np.unique(old), np.unique(new)
    return not (before.size == after.size == 1 and before[0] == after[0])


def _np_type(onnx_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))
