"""`qdq inspect`: what a model quantizes, how, and which ops still run in float.

The summary answers a deployment engineer's first questions before any rule runs: how much of
the graph an integer-only target can take, where the float islands are, which types and
granularities the quantized tensors use, and whether the scales are powers of two. Only scales and
zero-points are read; weight values are never touched, so large models with external data stay cheap.

How a compute node (`QuantIndex.compute_nodes()`) is classified:

- Its *data inputs* are the float tensors it computes on. Missing optional inputs, integer or bool
  tensors (Reshape shapes, Gather indices, shape arithmetic) and geometry parameters (Resize roi and
  scales, the input of Shape and Size, which read only its shape) are not data. A float constant is data
  unless it comes from a DQ, so a Conv or Gemm with a float bias is not fully quantized.
- Its *data outputs* are the float tensors it produces that something reads.
- `quantized`: every data input comes from a DQ and every data output is read by a Q.
  `float`: no data input comes from a DQ and no data output is read by a Q. `partial`: the rest.
- A node with neither data inputs nor data outputs only does integer shape arithmetic; it is
  counted in `model.integer_only_nodes`, not in `ops`.

A tensor whose element type is unknown counts as float, so an unknown never hides a float op.

`tensors` lists every quantized value, one row each (`qdq inspect --tensors`), under the name the
model gives it: the float tensor a Q reads, or the stored integers a DQ reads.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from qdq.engine.lint import LintResult
from qdq.graph import ir
from qdq.graph.float_types import FLOAT_TYPES
from qdq.graph.model import Model
from qdq.quant import pow2
from qdq.quant.dtypes import type_name
from qdq.quant.index import (
    BLOCKED,
    DEQUANTIZE,
    PER_AXIS,
    PER_TENSOR,
    QParams,
    QTensor,
    QuantIndex,
    onnx_type_of,
    resolve_constant,
)
from qdq.quant.operands import role

QUANTIZED = "quantized"
PARTIAL = "partial"
FLOAT = "float"
# Compute nodes that handle no float tensor at all (shape arithmetic).
INTEGER_ONLY = "integer-only"

# Islands list at most this many node names; the rest is a count.
MAX_ISLAND_NAMES = 10

# Inputs that are geometry, not values a target quantizes.
_GEOMETRY_INPUTS = {"Resize": {1, 2}, "Upsample": {1}, "Shape": {0}, "Size": {0}}
# Ops whose outputs are integer or bool whatever they read: where shape arithmetic starts.
_INT64_OPS = {"Shape", "Size", "NonZero", "ArgMax", "ArgMin"}
_BOOL_OPS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}
# Ops whose output has the type of their first input, as in exporters' shape subgraphs.
_SAME_TYPE_OPS = {
    "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Reshape", "Expand", "Tile", "Transpose",
    "Flatten", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max", "ReduceProd", "Range", "Identity",
}


def summarize(model: Model) -> dict[str, Any]:
    """The quantization summary of a model as a JSON-serialisable dict with stable keys."""
    index = QuantIndex(model)
    types = _ElementTypes()
    compute = index.compute_nodes()
    kinds = {id(node): _classify(index, types, node) for node in compute}
    counted = [node for node in compute if kinds[id(node)] != INTEGER_ONLY]
    islands = _float_islands(index, model.graph.nodes, counted, kinds) if index.has_qdq else []
    summary = {
        "model": {
            "path": str(model.path),
            "opset": model.opset,
            "nodes": len(model.graph.nodes),
            "quantize_nodes": len(index.quantizes),
            "dequantize_nodes": len(index.dequantizes),
            "integer_only_nodes": len(compute) - len(counted),
            "external_data": model.uses_external_data,
        },
        "ops": _op_counts(counted, kinds),
        "float_islands": islands,
        "quantized_tensors": _quantized_tensors(index),
        "scales": _scales(index),
    }
    summary["notes"] = model.notes + _notes(index, summary)
    return summary


# --- ops ------------------------------------------------------------------------------------------


class _ElementTypes:
    """Element types of tensors, known without shape inference: declared, or followed back to a source."""

    def __init__(self) -> None:
        self._known: dict[int, int | None] = {}

    def is_float(self, tensor: ir.Tensor) -> bool:
        elem_type = self.of(tensor)
        return elem_type is None or elem_type in FLOAT_TYPES

    def of(self, tensor: ir.Tensor) -> int | None:
        # Walk a chain of same-type ops iteratively (float chains can be thousands long) and
        # remember the answer for every tensor on the way.
        path: list[int] = []
        found: int | None = None
        while True:
            if id(tensor) in self._known:
                found = self._known[id(tensor)]
                break
            path.append(id(tensor))
            found = _direct_type(tensor)
            producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
            if found is not None or producer is None or producer.op not in _SAME_TYPE_OPS or not producer.inputs:
                break
            tensor = producer.inputs[0]
        for key in path:
            self._known[key] = found
        return found


def _direct_type(tensor: ir.Tensor) -> int | None:
    """The element type when the tensor itself or its producer says it."""
    if isinstance(tensor, ir.Constant):
        return onnx_type_of(tensor)
    # A tensor holds a numpy dtype, or the ONNX enum for types numpy lacks (bfloat16, float8: `ir.element_dtype`).
    dtype = tensor.dtype
    if isinstance(dtype, int):
        if dtype != TensorProto.UNDEFINED:
            return dtype
    elif dtype is not None:
        try:
            return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        except (TypeError, KeyError, ValueError):
            pass
    if len(tensor.inputs) != 1:
        return None
    producer = tensor.inputs[0]
    if producer.op == "Constant":
        source = resolve_constant(tensor)
        return onnx_type_of(source.constant) if source is not None else None
    if producer.op == "Cast":
        return producer.attrs.get("to")
    if producer.op == DEQUANTIZE:
        return TensorProto.FLOAT
    if producer.op in _INT64_OPS:
        return TensorProto.INT64
    if producer.op in _BOOL_OPS:
        return TensorProto.BOOL
    return None


def _classify(index: QuantIndex, types: _ElementTypes, node: ir.Node) -> str:
    """quantized, partial, float or integer-only; see the module docstring."""
    nq = index.node_quant(node)
    geometry = _GEOMETRY_INPUTS.get(node.op, set())
    flags: list[bool] = []
    for position, (tensor, params) in enumerate(zip(node.inputs, nq.inputs)):
        if position in geometry:
            continue
        if params is not None:
            flags.append(True)
        elif tensor.name and types.is_float(tensor):
            flags.append(False)
    for tensor, qs in zip(node.outputs, nq.outputs):
        if (tensor.outputs or index.is_graph_output(tensor)) and types.is_float(tensor):
            flags.append(bool(qs))
    if not flags:
        return INTEGER_ONLY
    if all(flags):
        return QUANTIZED
    return PARTIAL if any(flags) else FLOAT


def _op_counts(nodes: list[ir.Node], kinds: dict[int, str]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for node in nodes:
        row = counts.setdefault(node.op, {QUANTIZED: 0, PARTIAL: 0, FLOAT: 0})
        row[kinds[id(node)]] += 1
    return dict(sorted(counts.items()))


def _float_islands(
    index: QuantIndex, all_nodes: list[ir.Node], counted: list[ir.Node], kinds: dict[int, str]
) -> list[dict[str, Any]]:
    """Connected groups of non-quantized compute nodes, joined by tensors (through pass-throughs)."""
    order = {id(node): position for position, node in enumerate(all_nodes)}
    members = {id(node): node for node in counted if kinds[id(node)] != QUANTIZED}
    parent = {key: key for key in members}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for node in members.values():
        for tensor in node.outputs:
            for consumer, _ in index.consumers_through(tensor):
                if id(consumer) in members:
                    parent[root(id(consumer))] = root(id(node))

    groups: dict[int, list[ir.Node]] = {}
    for key, node in members.items():
        groups.setdefault(root(key), []).append(node)
    # Largest first; equal sizes in graph order.
    ordered = sorted(
        (sorted(nodes, key=lambda n: order[id(n)]) for nodes in groups.values()),
        key=lambda nodes: (-len(nodes), order[id(nodes[0])]),
    )
    return [_island(nodes, order) for nodes in ordered]


def _island(nodes: list[ir.Node], order: dict[int, int]) -> dict[str, Any]:
    names = [node.name or f"<{node.op} #{order[id(node)]}>" for node in nodes]
    return {
        "size": len(nodes),
        "ops": dict(sorted(Counter(node.op for node in nodes).items(), key=lambda kv: (-kv[1], kv[0]))),
        "nodes": names[:MAX_ISLAND_NAMES],
        "more_nodes": max(0, len(nodes) - MAX_ISLAND_NAMES),
    }


# --- quantized tensors and scales ----------------------------------------------------------------------


def _tensor_params(index: QuantIndex, qt: QTensor) -> QParams:
    """The params that define a quantized tensor: its Q's, or for a stored one its first DQ's."""
    return index.params(qt.quantize if qt.quantize is not None else qt.dequantizes[0])


def _quantized_tensors(index: QuantIndex) -> dict[str, Any]:
    """Counts over every quantized value; a weight read by several DQs counts once.

    `stored`: integer constants read by a DQ (weights, biases). `activations`: made by a Q.
    `float_weights`: made by a Q from a float constant (QAT exports keep weights in float and
    quantize them at every run). `other`: integers from a graph input or a computation without
    a Q. Q/DQ pairs with a scale computed at run time are in neither `shared` nor `separate`.
    """
    by_dtype: Counter[str] = Counter()
    by_granularity = {PER_TENSOR: 0, PER_AXIS: 0, BLOCKED: 0}
    stored = activations = float_weights = other = shared = separate = 0
    for qt in index.qtensors:
        params = _tensor_params(index, qt)
        by_dtype[params.qtype.name if params.qtype else type_name(params.elem_type)] += 1
        by_granularity[params.granularity] += 1
        if qt.quantize is not None:
            if qt.float_input is not None and resolve_constant(qt.float_input) is not None:
                float_weights += 1
            else:
                activations += 1
            for dq in qt.dequantizes:
                dq_params = index.params(dq)
                if params.dynamic or dq_params.dynamic:
                    continue
                if params.shares_initializers(dq_params):
                    shared += 1
                else:
                    separate += 1
        elif resolve_constant(qt.integer) is not None:
            stored += 1
        else:
            other += 1
    return {
        "total": len(index.qtensors),
        "by_dtype": dict(sorted(by_dtype.items())),
        "by_granularity": by_granularity,
        "stored": stored,
        "activations": activations,
        "float_weights": float_weights,
        "other": other,
        "qdq_pairs": {"shared": shared, "separate": separate},
    }


def _scales(index: QuantIndex) -> dict[str, Any]:
    """Scale statistics per Q/DQ node; `pos_min`/`pos_max` only when every constant scale is a power of two."""
    constant = [p for p in index.all_params() if p.scale is not None]
    values = np.concatenate([p.scale.ravel() for p in constant]) if constant else np.zeros(0)
    finite = values[np.isfinite(values)]
    pow2_count = sum(1 for p in constant if pow2.all_pow2(p.scale))
    all_pow2 = bool(constant) and pow2_count == len(constant)
    return {
        "count": len(constant),
        "dynamic": sum(1 for p in index.all_params() if p.scale is None),
        "pow2": pow2_count,
        "min": float(finite.min()) if finite.size else None,
        "max": float(finite.max()) if finite.size else None,
        "pos_min": pow2.int_pos(float(values.max())) if all_pow2 else None,
        "pos_max": pow2.int_pos(float(values.min())) if all_pow2 else None,
        "invalid": sum(1 for p in constant if not _valid_scale(p.scale)),
    }


def _valid_scale(scale: np.ndarray) -> bool:
    return bool(scale.size) and bool(np.all(np.isfinite(scale) & (scale > 0)))


def _notes(index: QuantIndex, summary: dict[str, Any]) -> list[str]:
    if not index.has_qdq:
        return ["the model has no QuantizeLinear or DequantizeLinear nodes: it runs entirely in float"]
    notes = []
    ops = summary["ops"].values()
    total = sum(sum(row.values()) for row in ops)
    not_quantized = sum(row[PARTIAL] + row[FLOAT] for row in ops)
    if not_quantized:
        islands = len(summary["float_islands"])
        notes.append(
            f"not fully quantized: {not_quantized} of {total} compute nodes, "
            f"in {_plural(islands, 'float island')}"
        )
    scales = summary["scales"]
    if scales["dynamic"]:
        notes.append(f"scales computed at run time in {_plural(scales['dynamic'], 'Q/DQ node')}")
    if scales["invalid"]:
        notes.append(
            f"zero, negative or non-finite scales in {_plural(scales['invalid'], 'Q/DQ node')}; run `qdq lint`"
        )
    integer_only = summary["model"]["integer_only_nodes"]
    if integer_only:
        notes.append(
            f"left out of the op counts: {_plural(integer_only, 'compute node')} "
            "that only handle integer or bool tensors (shape arithmetic)"
        )
    return notes


# --- one row per quantized tensor ------------------------------------------------------------------------


def tensors(model: Model) -> list[dict[str, Any]]:
    """Every quantized value with its type, granularity, scale, zero-point, fix position and role.

    `scale`, `zero_point` and `pos` are a number when every channel or block has the same one,
    `[min, max]` otherwise, and None when computed at run time; `pos` = -log2(scale) only when
    every scale is an exact power of two.
    """
    index = QuantIndex(model)
    rows = []
    for qt in index.qtensors:
        params = _tensor_params(index, qt)
        rows.append({
            "name": qt.float_input.name if qt.float_input is not None else qt.integer.name,
            "dtype": params.qtype.name if params.qtype else type_name(params.elem_type),
            "granularity": params.granularity,
            "axis": params.axis if params.granularity != PER_TENSOR else None,
            "block_size": params.block_size or None,
            "scale": _value_or_range(params.scale),
            "zero_point": _value_or_range(params.zero_point, int),
            "pos": _pos(params.scale),
            "role": role(index, qt),
        })
    return rows


def _value_or_range(values: np.ndarray | None, kind: type = float) -> Any:
    if values is None or values.size == 0:
        return None
    flat = values.ravel()
    if not np.all(np.isfinite(flat)):
        kind = float  # a float8 zero-point can be NaN; QDQ002 reports it
    low, high = kind(flat.min()), kind(flat.max())
    return low if low == high else [low, high]


def _pos(scale: np.ndarray | None) -> int | list[int] | None:
    if scale is None or not pow2.all_pow2(scale):
        return None
    positions = _value_or_range(scale)
    if isinstance(positions, list):  # the finest scale is the highest position
        return [pow2.int_pos(positions[1]), pow2.int_pos(positions[0])]
    return pow2.int_pos(positions)


def render_tensors(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned columns; a range is `min..max`, a missing value `-`."""
    headers = ("tensor", "dtype", "granularity", "scale", "zero point", "pos", "role")
    table = [headers] + [
        (row["name"], row["dtype"], _granularity_text(row), _range_text(row["scale"], "{:.6g}"),
         _range_text(row["zero_point"], "{:g}"), _range_text(row["pos"], "{}"), row["role"])
        for row in rows
    ]
    widths = [max(len(line[column]) for line in table) for column in range(len(headers))]
    return "".join("  " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() + "\n"
                   for line in table)


def _granularity_text(row: dict[str, Any]) -> str:
    if row["granularity"] == PER_AXIS:
        return f"per-axis {row['axis']}"
    if row["granularity"] == BLOCKED:
        return f"blocked {row['axis']} ({row['block_size']})"
    return row["granularity"]


def _range_text(value: Any, form: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return f"{form.format(value[0])}..{form.format(value[1])}"
    return form.format(value)


# --- text -----------------------------------------------------------------------------------------------


def render_text(summary: dict[str, Any]) -> str:
    """A compact report for the terminal: model line, op table, islands, tensors, scales, notes."""
    m = summary["model"]
    lines = [
        f"Model  {m['path']}",
        f"       opset {m['opset']}, {_plural(m['nodes'], 'node')}: {m['quantize_nodes']} QuantizeLinear, "
        f"{m['dequantize_nodes']} DequantizeLinear; external data: {'yes' if m['external_data'] else 'no'}",
        "",
    ]
    lines += _ops_table(summary["ops"])
    if summary["float_islands"]:
        lines += ["", f"Float islands ({len(summary['float_islands'])}, largest first)"]
        for number, island in enumerate(summary["float_islands"], 1):
            ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in island["ops"].items())
            names = ", ".join(island["nodes"]) + (f", +{island['more_nodes']} more" if island["more_nodes"] else "")
            lines.append(f"  {number:>2}. {_plural(island['size'], 'node'):<9} {ops}: {names}")
    qt = summary["quantized_tensors"]
    if qt["total"]:
        lines += ["", f"Quantized tensors ({qt['total']})"]
        rows = [
            ("dtype", _inline(qt["by_dtype"])),
            ("granularity", _inline({k: v for k, v in qt["by_granularity"].items() if v})),
            ("kind", f"{qt['stored']} stored (weights, biases), {qt['activations']} activations"
             + (f", {qt['float_weights']} float weights quantized at run time" if qt["float_weights"] else "")
             + (f", {qt['other']} other" if qt["other"] else "")),
            ("Q/DQ pairs", f"{qt['qdq_pairs']['shared']} share scale/zero-point initializers, "
             f"{qt['qdq_pairs']['separate']} with separate copies"),
        ]
        lines += _aligned(rows)
    s = summary["scales"]
    if s["count"] or s["dynamic"]:
        lines += ["", "Scales (per Q/DQ node)"]
        rows = [("Q/DQ nodes", f"{s['count']} with constant scales, {s['dynamic']} computed at run time")]
        if s["min"] is not None:
            rows.append(("range", f"{s['min']:.6g} .. {s['max']:.6g}"))
        if s["count"]:
            rows.append(("powers of 2", f"{s['pow2']} of {s['count']}"))
        if s["pos_min"] is not None:
            rows.append(("pos", f"{s['pos_min']} .. {s['pos_max']}  (pos = -log2(scale))"))
        lines += _aligned(rows)
    if "predicted" in summary:
        p = summary["predicted"]
        by_rule = ", ".join(f"{code} x{n}" for code, n in p["by_rule"].items()) or "none"
        lines += ["", f"Predicted by rule set '{p['ruleset']}'"]
        lines += _aligned([
            ("conversion layers", f"{p['conversion_layers']} caused by Q/DQ placement (by rule: {by_rule})"),
            ("findings", f"{p['findings']}; `qdq lint --target {p['ruleset']}` lists them with what the target builds"),
        ])
    if summary["notes"]:
        lines += ["", "Notes"] + [f"  - {note}" for note in summary["notes"]]
    return "\n".join(lines) + "\n"


def predicted(result: LintResult) -> dict[str, Any]:
    """What a rule set with `effect` keys predicts for the whole model: conversion layers per rule.

    A layer two rules both explain counts for each rule but once in the total.
    """
    named: dict[str, set[str]] = {}
    counted: dict[str, int] = {}
    for finding in result.findings:
        if finding.conversions:
            named.setdefault(finding.code, set()).update(finding.conversions)
        elif finding.reformats:
            counted[finding.code] = counted.get(finding.code, 0) + finding.reformats
    by_rule = {code: len(named.get(code, ())) + counted.get(code, 0) for code in {*named, *counted}}
    return {
        "ruleset": result.ruleset.name,
        "conversion_layers": result.predicted_reformats(),
        "by_rule": dict(sorted(by_rule.items())),
        "findings": len(result.findings),
    }



def _ops_table(ops: dict[str, dict[str, int]]) -> list[str]:
    if not ops:
        return ["Ops: no compute nodes"]
    headers = (QUANTIZED, PARTIAL, FLOAT)
    width = max(len("total"), *(len(op) for op in ops))
    totals = {h: sum(row[h] for row in ops.values()) for h in headers}

    def row(label: str, counts: dict[str, int]) -> str:
        cells = "  ".join(f"{counts[h]:>{len(h)}}" for h in headers)
        return f"  {label:<{width}}  {cells}"

    lines = ["Ops".ljust(width + 4) + "  ".join(headers)]
    lines += [row(op, counts) for op, counts in ops.items()]
    if len(ops) > 1:
        lines.append(row("total", totals))
    return lines


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(label) for label, _ in rows)
    return [f"  {label:<{width}}  {text}" for label, text in rows]


def _inline(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "-"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
