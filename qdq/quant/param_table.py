"""The scales and zero-points of every Q/DQ node as columns: decoded in one pass, one row per node.

Why: a 100k-node model has about 75k Q/DQ nodes, nearly all with one-element parameters. Read one
at a time (a protobuf access, a numpy decode and a min and a max per parameter, twice per node),
they cost seconds per lint and again per fix round. Here each element type is decoded by one
`np.frombuffer` and every row reduced by one `reduceat`, so rules can test all rows at once and
look closer only at the rows a test flags.

Rows the fast path does not cover are left undecoded (`decoded` False, NaN bounds) and read one by
one through `QParams`, as before: values behind a Cast, external data, float16 in typed fields,
parameters computed at run time, and parameters a fix has replaced since the table was built.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Callable, Sequence

import numpy as np
from onnx import TensorProto

# Rows are `qdq.quant.index.QParams` and sources its `ConstantSource`s, typed `Any` here: the index
# builds the table, so importing it back would close an import circle.
QParams = ConstantSource = Any

EXTERNAL = TensorProto.EXTERNAL
_UNREAD = object()
# Types the spec allows a scale to have: numpy's layout of their raw_data, and the typed field that
# holds their values otherwise (bfloat16 has neither in numpy's terms, and a double scale is
# invalid: both are read one by one).
SCALE_TYPES = {TensorProto.FLOAT: (np.dtype("<f4"), "float_data"), TensorProto.FLOAT16: (np.dtype("<f2"), None)}
# The same for integer zero-points (the 4-bit and float8 types are packed, and read one by one).
ZERO_POINT_TYPES = {onnx_type: (np.dtype(layout), "int32_data") for onnx_type, layout in (
    (TensorProto.INT8, "i1"), (TensorProto.UINT8, "u1"), (TensorProto.INT16, "<i2"), (TensorProto.UINT16, "<u2"),
    (TensorProto.INT32, "<i4"))}


class ParamColumn:
    """One parameter of every row: its values (float64, read-only, rows back to back) and per-row bounds.

    `low` and `high` are a row's smallest and largest value (NaN when a value is NaN, or when the
    row is not decoded), `ndim` its number of dimensions (-1 when not decoded); `decoded` says
    which rows the column holds.
    """

    def __init__(self, rows: int):
        self.values = np.zeros(0)
        self.start = np.full(rows, -1, dtype=np.int64)
        self.size = np.zeros(rows, dtype=np.int64)
        self.ndim = np.full(rows, -1, dtype=np.int64)
        self.low = np.full(rows, np.nan)
        self.high = np.full(rows, np.nan)

    @property
    def decoded(self) -> np.ndarray:
        return self.start >= 0

    def of(self, row: int, shape: Sequence[int]) -> np.ndarray:
        """A decoded row's values in their shape (a read-only view)."""
        start = self.start[row]
        return self.values[start:start + self.size[row]].reshape(shape)

    def fill(self, sources: list[ConstantSource | None], types: dict[int, tuple[np.dtype, str | None]]) -> None:
        """Decode every row whose source is a stored, inline, uncast constant of one of `types`.

        A type maps to its numpy layout and the typed field that holds its values when raw_data
        does not (onnx's writers use either: onnxruntime's quantizer writes `float_data`).
        """
        groups: dict[tuple[int, str], tuple[list[int], list, list[int]]] = {}
        # Each constant is read once (a Q and its DQ usually share their parameters): the lists of its
        # group, its values and its rank, or None when it is not decoded here.
        read: dict[int, tuple | None] = {}
        for row, source in enumerate(sources):
            if source is None:
                continue
            key = id(source.constant) if not source.via else None  # a path through nodes is judged each time
            place = read.get(key, _UNREAD)
            if place is _UNREAD:
                found = _stored(source, types)
                place = None if found is None else (groups.setdefault(found[:2], ([], [], [])), found[2], found[3])
                if key is not None:
                    read[key] = place
            if place is not None:
                (rows, data, ranks), values, rank = place
                rows.append(row)
                data.append(values)
                ranks.append(rank)
        parts, offset = [], 0
        for (data_type, field), (rows, data, ranks) in groups.items():
            dtype = types[data_type][0]
            if field == "raw_data":
                sizes = np.fromiter(map(len, data), dtype=np.int64, count=len(data)) // dtype.itemsize
                values = np.frombuffer(b"".join(data), dtype=dtype).astype(np.float64)
            else:
                sizes = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
                # Through the element type, as onnx.numpy_helper reads it (an int8 stored as 200 is -56).
                values = np.fromiter(chain.from_iterable(data), dtype=np.float64).astype(dtype).astype(np.float64)
            starts = np.cumsum(sizes) - sizes
            where = np.asarray(rows, dtype=np.int64)
            self.ndim[where] = ranks
            self.start[where], self.size[where] = starts + offset, sizes
            self.low[where] = np.minimum.reduceat(values, starts)
            self.high[where] = np.maximum.reduceat(values, starts)
            parts.append(values)
            offset += values.size
        if parts:
            self.values = np.concatenate(parts)
        self.values.flags.writeable = False

    def every(self, test: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Per row: True when the row is decoded and `test` holds for each of its values."""
        failures = np.concatenate([[0], np.cumsum(~test(self.values))])
        start = np.maximum(self.start, 0)  # forgotten rows leave gaps: count per row, not per run
        return self.decoded & (failures[start + self.size] == failures[start])

    def forget(self, row: int) -> None:
        """Leave a row to be read one by one (its node's parameters were replaced, or it is new)."""
        if row == self.start.size:
            self.start, self.size = np.append(self.start, -1), np.append(self.size, 0)
            self.low, self.high = np.append(self.low, np.nan), np.append(self.high, np.nan)
            self.ndim = np.append(self.ndim, -1)
        self.start[row], self.size[row], self.low[row], self.high[row], self.ndim[row] = -1, 0, np.nan, np.nan, -1


class ParamTable:
    """Every Q/DQ node of an index as a row: its `QParams` and its decoded scale and zero-point columns."""

    def __init__(self, rows: list[QParams]):
        self.rows = rows
        self.row_of = {id(p.node): row for row, p in enumerate(rows)}
        self.elem_type = np.fromiter((p.elem_type for p in rows), dtype=np.int64, count=len(rows))
        self.is_quantize = np.fromiter((p.is_quantize for p in rows), dtype=bool, count=len(rows))
        self.block_size = np.fromiter((p.block_size for p in rows), dtype=np.int64, count=len(rows))
        self.scale = ParamColumn(len(rows))
        self.scale.fill([p.scale_source for p in rows], SCALE_TYPES)
        self.zero_point = ParamColumn(len(rows))
        self.zero_point.fill([p.zero_point_source for p in rows], ZERO_POINT_TYPES)
        for p in rows:  # QParams reads its values from here when it can (`values_of`)
            p.columns = self
        # What `single_scale` answers, per row, as a list: numpy is slow to read one element at a time.
        self._single_scales = np.where(self.per_tensor(), self.scale.low, np.nan).tolist()
        for row in np.flatnonzero(~self.scale.decoded):
            self._single_scales[row] = None

    def values_of(self, params: QParams, which: str) -> np.ndarray | None:
        """A node's decoded "scale" or "zero_point" in its shape (read-only), or None if not decoded."""
        source = params.scale_source if which == "scale" else params.zero_point_source
        row, column = self._row(params, source), getattr(self, which)
        if row is None or column.start[row] < 0:
            return None
        return column.of(row, source.constant.proto.dims)

    def single_scale(self, params: QParams) -> float | None:
        """A node's decoded scale as a float when it is per-tensor (one value, not blocked), NaN when it
        is not; None when its row is not decoded (read it one by one).

        For the rules that ask one node at a time (the NPU's positions): cheaper than `values_of`.
        """
        row = self._row(params, params.scale_source)
        return self._single_scales[row] if row is not None else None

    def _row(self, params: QParams, source: ConstantSource | None) -> int | None:
        """A node's row, unless the constant behind the parameter (`source`) cannot be read from it."""
        # A constant whose values a fix replaced in place has dropped its proto: read it one by one.
        if source is None or getattr(source.constant, "proto", None) is None:
            return None
        return self.row_of.get(id(params.node))

    def per_type(self, value: Callable[[int], float | None]) -> np.ndarray:
        """Per row, `value` of its element type (NaN where it gives None): asked once per type, not per row."""
        column = np.full(len(self.rows), np.nan)
        for onnx_type in np.unique(self.elem_type):
            found = value(int(onnx_type))
            if found is not None:
                column[self.elem_type == onnx_type] = found
        return column

    def plain_shapes(self) -> np.ndarray:
        """Per row: True when the scale is a decoded scalar or 1-D vector, not blocked, and the
        zero-point is absent (or not a constant) or decoded with the scale's shape."""
        scale, zero_point = self.scale, self.zero_point
        same_shape = (zero_point.ndim == scale.ndim) & (zero_point.size == scale.size)
        return (scale.ndim >= 0) & (scale.ndim <= 1) & (self.block_size == 0) & (self._no_constant_zero_point() | same_shape)

    def scalar_params(self) -> np.ndarray:
        """Per row: True when the scale is a decoded 0-d value and the zero-point is absent (or not
        a constant) or a decoded 0-d value too."""
        return (self.scale.ndim == 0) & (self._no_constant_zero_point() | (self.zero_point.ndim == 0))

    def _no_constant_zero_point(self) -> np.ndarray:
        return np.fromiter((p.zero_point_source is None for p in self.rows), dtype=bool, count=len(self.rows))

    def per_tensor(self) -> np.ndarray:
        """Per row: True when its decoded scale is one value and it is not blocked (granularity per-tensor)."""
        return (self.scale.size == 1) & (self.block_size == 0)

    def same_params(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per pair of rows (a[i], b[i]): True when `QParams.same_values` is certainly True for them.

        That is: both per-tensor with a decoded one-value zero-point, of one element type, with equal
        scales and zero-points. False means "compare one by one", not "different" (NaN, per-axis or
        undecoded rows land there).
        """
        scale, zero_point = self.scale, self.zero_point
        single = self.per_tensor() & (zero_point.size == 1)
        return (single[a] & single[b] & (self.elem_type[a] == self.elem_type[b])
                & (scale.low[a] == scale.low[b]) & (zero_point.low[a] == zero_point.low[b]))

    def replace(self, params: QParams) -> None:
        """A node was re-read after a fix swapped its parameters (or added it): its columns are stale."""
        row = self.row_of.setdefault(id(params.node), len(self.rows))
        if row == len(self.rows):
            self.rows.append(params)
            self.elem_type, self.is_quantize = np.append(self.elem_type, 0), np.append(self.is_quantize, False)
            self.block_size = np.append(self.block_size, 0)
        self.rows[row] = params
        self.elem_type[row], self.is_quantize[row], self.block_size[row] = params.elem_type, params.is_quantize, params.block_size
        self.scale.forget(row)
        self.zero_point.forget(row)
        if row == len(self._single_scales):
            self._single_scales.append(None)
        self._single_scales[row] = None


def _stored(source: ConstantSource, types: dict) -> tuple[int, str, object, int] | None:
    """The element type of the TensorProto behind a source, the field holding its values, those
    values and its rank, when they are inline and what the Q/DQ reads (no Cast on the way)."""
    if source.via and any(node.op == "Cast" for node in source.via):
        return None
    proto = source.constant.proto  # the values as read, until a fix sets them
    if not isinstance(proto, TensorProto) or proto.data_location == EXTERNAL:
        return None
    data_type = proto.data_type
    known = types.get(data_type)
    if known is None:
        return None
    dtype, typed = known
    dims = proto.dims
    count = math.prod(dims)
    raw = proto.raw_data  # each read of a bytes field copies it
    # Empty or short data is read one by one, where it gets its error message (Model.constant_values).
    if raw:
        return (data_type, "raw_data", raw, len(dims)) if len(raw) == count * dtype.itemsize else None
    values = getattr(proto, typed) if typed is not None else ()
    return (data_type, typed, values, len(dims)) if count and len(values) == count else None
