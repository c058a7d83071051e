"""QDQ0xx: is each Q/DQ node's scale, zero-point and axis valid at all?

These are spec violations: a runtime rejects the model, or worse, accepts it and computes garbage
(onnxruntime's optimiser can hide a bad per-channel axis until optimisations are turned off).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
from onnx import TensorProto

from qdq.quant.dtypes import DEQUANTIZE_ONLY, QUANT_TYPES, type_name
from qdq.quant.index import BLOCKED, PER_AXIS, QParams
from qdq.rewrite.rule import CheckContext, Finding, Rule, Severity, register

_FLOAT_SCALE_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def _input_rank(p: QParams) -> int | None:
    x = p.node.inputs[0] if p.node.inputs else None
    if x is None or x.shape is None:
        return None
    return len(x.shape)


def _input_dim(p: QParams, axis: int) -> int | None:
    shape = p.node.inputs[0].shape if p.node.inputs else None
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    dim = shape[axis]
    return dim if isinstance(dim, int) and dim > 0 else None


@register
class InvalidScale(Rule):
    """Every scale must be a finite, strictly positive float.

    Why: quantization divides by the scale. A zero, negative, NaN or infinite scale makes the
    quantized values meaningless; runtimes do not check this and silently produce garbage.

    Example: `DequantizeLinear(w_q, scale=0.0)` after an observer saw an all-zero tensor.
    """

    code = "QDQ001"
    name = "invalid-scale"
    message = "{op} {node} has an invalid scale: {problem}"
    severity = Severity.ERROR

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        # Decoded scales are all of a float type: finite and positive when their bounds are.
        valid = (table.scale.low > 0) & (table.scale.high < math.inf)
        for row in np.flatnonzero(~valid):
            p = table.rows[row]
            if p.scale_source is None:
                continue
            problem = _scale_problem(p)
            if problem:
                yield self.finding(ctx, p.node, [p.scale_input], op=p.node.op, problem=problem)


def _scale_problem(p: QParams) -> str | None:
    scale_type = p.scale_source.elem_type
    if scale_type not in _FLOAT_SCALE_TYPES:
        return f"scale type is {type_name(scale_type)}, not a float type"
    values = p.scale
    if values.size == 0:
        return "scale is empty"
    # min and max (not isfinite over all) keep this two cheap calls per node on 100k-node models.
    smallest, largest = float(values.min()), float(values.max())
    if not (math.isfinite(smallest) and math.isfinite(largest)):
        return "scale is NaN or infinite"
    if smallest <= 0:
        return f"scale {smallest:g} is not positive"
    return None


@register
class InvalidZeroPoint(Rule):
    """The zero-point must have a quantized type the op allows, and values that type can hold.

    Why: the zero-point's type is the type of the quantized tensor. QuantizeLinear cannot produce
    int32 (only DequantizeLinear reads int32, for biases); float8 types have no zero-point other
    than 0; a value outside the type's range cannot be stored.

    Example: `QuantizeLinear(x, s, zp=int32(0))` or a float8e4m3fn zero-point of 1.0.
    """

    code = "QDQ002"
    name = "invalid-zero-point"
    message = "{op} {node} has an invalid zero-point: {problem}"
    severity = Severity.ERROR

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        integer = {onnx_type: qtype for onnx_type, qtype in QUANT_TYPES.items() if not qtype.is_float}
        qmin = table.per_type(lambda onnx_type: integer[onnx_type].qmin if onnx_type in integer else None)
        qmax = table.per_type(lambda onnx_type: integer[onnx_type].qmax if onnx_type in integer else None)
        producible = ~(table.is_quantize & np.isin(table.elem_type, list(DEQUANTIZE_ONLY)))
        # Decoded zero-points are all of an integer type: valid when inside its range (NaN compares false).
        valid = producible & (table.zero_point.low >= qmin) & (table.zero_point.high <= qmax)
        for row in np.flatnonzero(~valid):
            p = table.rows[row]
            problem = _zero_point_problem(p)
            if problem:
                yield self.finding(ctx, p.node, [p.zero_point_input], op=p.node.op, problem=problem)


def _zero_point_problem(p: QParams) -> str | None:
    qtype = p.qtype
    if qtype is None:
        return f"type {type_name(p.elem_type)} is not a quantized type"
    if p.is_quantize and p.elem_type in DEQUANTIZE_ONLY:
        return f"QuantizeLinear cannot produce {qtype.name}"
    if p.zero_point_input is None:
        return None
    values = p.zero_point
    if values is None or values.size == 0:
        return None  # no constant zero-point to check (an empty one goes with an empty scale: QDQ001)
    smallest, largest = float(values.min()), float(values.max())
    if qtype.is_float and (smallest != 0 or largest != 0):
        return f"{qtype.name} zero-point must be 0"
    if not qtype.is_float and (smallest < qtype.qmin or largest > qtype.qmax):
        return f"value outside the {qtype.name} range [{qtype.qmin:g}, {qtype.qmax:g}]"
    return None


@register
class InvalidAxis(Rule):
    """A per-axis or blocked Q/DQ must name an axis the input has, with one scale per element or block.

    Why: the spec requires `-rank <= axis < rank` and a 1-D scale as long as that dimension. With
    optimisations on, onnxruntime may fold the node and hide the error; other runtimes reject it.
    A blocked scale (`block_size`) has the input's rank, ceil(size / block_size) on the axis and
    the input's size elsewhere. The ONNX checker does not check this and onnxruntime only fails
    when the model runs ("x_scale must be ceil(Di/block_size) on the quantize axis i").

    Example: a weight of shape (16, 3, 3, 3) with 16 per-channel scales but `axis=1` (size 3).
    ModelOpt 0.47's INT4 AWQ export of a transposed Gemm weight [10, 32] with `axis=0,
    block_size=128` and a scale of shape [10, 1] (laid out for axis 1; axis 0 needs [1, 32]).
    """

    code = "QDQ003"
    name = "invalid-axis"
    message = "{op} {node}: {problem}"
    severity = Severity.ERROR

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        for row in np.flatnonzero(~table.per_tensor()):  # per-tensor rows have no axis to check
            p = table.rows[row]
            if p.granularity not in (PER_AXIS, BLOCKED):
                continue
            rank = _input_rank(p)
            if rank is not None and not -rank <= p.axis < rank:
                problem = f"axis {p.axis} is out of range for a rank-{rank} input"
            elif p.granularity == PER_AXIS:
                problem = _per_axis_length_problem(p)
            else:
                problem = _blocked_shape_problem(p)
            if problem:
                yield self.finding(ctx, p.node, [p.node.inputs[0], p.scale_input], op=p.node.op, problem=problem)


def _per_axis_length_problem(p: QParams) -> str | None:
    shape = p.scale_shape
    if shape is None or len(shape) != 1:
        return None  # shape problems are QDQ004's
    dim = _input_dim(p, p.axis)
    if dim is not None and shape[0] != dim:
        return f"{shape[0]} scales for axis {p.axis}, whose size is {dim}"
    return None


def _blocked_shape_problem(p: QParams) -> str | None:
    """A blocked scale must be ceil(D / block_size) long on the axis and as long as the input elsewhere."""
    shape, rank = p.scale_shape, _input_rank(p)
    if shape is None or rank is None or len(shape) != rank:
        return None  # a rank mismatch is QDQ004's
    axis = p.axis % rank
    dims = [_input_dim(p, i) for i in range(rank)]
    expected = [None if d is None else (-(-d // p.block_size) if i == axis else d) for i, d in enumerate(dims)]
    if all(e is None or e == size for e, size in zip(expected, shape)):
        return None
    wanted = ["?" if e is None else e for e in expected]
    return (f"blocked scale of shape {list(shape)} for an input of shape {['?' if d is None else d for d in dims]} "
            f"with axis {p.axis} and block_size {p.block_size}; it must be {wanted} "
            f"(ceil(size / block_size) on the axis, the input's size elsewhere)")


@register
class QParamShapeMismatch(Rule):
    """Scale and zero-point must have the same shape, and a shape the granularity allows.

    Why: per-tensor parameters are scalars, per-axis ones are 1-D, blocked ones have the input's
    rank. A zero-point shaped differently from its scale, or a 2-D scale without `block_size`, is
    rejected by onnxruntime at session creation. (A 1-element scale next to a 0-d zero-point runs,
    and is left to QDQ201.)

    Example: scale of shape (16,) with a scalar zero-point on a per-channel weight.
    """

    code = "QDQ004"
    name = "qparam-shape-mismatch"
    message = "{op} {node}: {problem}"
    severity = Severity.ERROR

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        table = ctx.index.table
        for row in np.flatnonzero(~table.plain_shapes()):  # plain rows: no test below can flag them
            p = table.rows[row]
            problem = _shape_problem(p)
            if problem:
                yield self.finding(
                    ctx, p.node, [p.scale_input, p.zero_point_input], op=p.node.op, problem=problem
                )


def _scalar_or_single(*shapes: tuple[int, ...]) -> bool:
    """True when every shape is a scalar or a 1-element vector ([] or [1]).

    onnxruntime runs a [1] scale next to a 0-d zero-point (its own quantizer writes bias DQs that
    way); the non-scalar form is QDQ201's warning, with an exact fix, not an error here. A [1, 1]
    zero-point is rejected, so it stays an error.
    """
    return all(tuple(shape) in ((), (1,)) for shape in shapes)


def _shape_problem(p: QParams) -> str | None:
    scale_shape, zp_shape = p.scale_shape, p.zero_point_shape
    if scale_shape is None:
        return None
    if zp_shape is not None and zp_shape != scale_shape and not _scalar_or_single(zp_shape, scale_shape):
        return f"zero-point shape {list(zp_shape)} differs from scale shape {list(scale_shape)}"
    if p.block_size:
        rank = _input_rank(p)
        if rank is not None and len(scale_shape) != rank:
            return f"blocked scale has rank {len(scale_shape)}, the input has rank {rank}"
        return None
    if len(scale_shape) > 1:
        return f"scale of shape {list(scale_shape)} needs block_size (only scalar or 1-D scales otherwise)"
    return None


@register
class DynamicQParams(Rule):
    """Scales and zero-points should be constants, not computed while the model runs.

    Why: placement rules, scale alignment and power-of-two checks need the values, and most
    accelerators (TensorRT, NPUs, onnxruntime's QLinear fusions) only fuse Q/DQ with constant
    parameters; a computed scale keeps the op in float.

    Example: `scale = Div(ReduceMax(Abs(x)), 127)` feeding a QuantizeLinear (dynamic quantization).
    """

    code = "QDQ005"
    name = "dynamic-qparams"
    message = "{op} {node} reads a {what} computed at run time"
    severity = Severity.WARNING

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for p in ctx.index.all_params():
            if p.scale_source is None:
                yield self.finding(ctx, p.node, [p.scale_input], op=p.node.op, what="scale")
            elif p.zero_point_input is not None and p.zero_point_source is None:
                yield self.finding(ctx, p.node, [p.zero_point_input], op=p.node.op, what="zero-point")
