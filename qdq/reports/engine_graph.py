"""The engine graphs of `qdq compare --format html`: both engines' layers as boxes, side by side.

One row per row of the alignment, so a layer and its counterpart sit at one height and a layer only
one engine has (an extra Q/DQ or reformat) leaves a gap on the other side. Edges are the tensors
between layers. Boxes of layers a difference names are coloured by its kind and link to the
difference and to the rule that fixes it. Network regions collapse to one row each; a large drawing
starts with the regions without differences collapsed.

This module decides what each box says and links to, as JSON; the page script
(`assets/engine_view.js`) collapses regions and has dagre place the boxes.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from qdq.reports.html_assets import json_data, scripts
from qdq.trt.diff import Comparison, Difference
from qdq.trt.layers import Engine, Layer

# Rows: a larger drawing starts with the regions without differences collapsed, and is laid out
# without dagre's crossing-reduction sweeps (2/3 of its time; engines are nearly chains).
COLLAPSE_ABOVE = 300
NAME_CHARS = 34  # what fits on a box's first line
LEGEND = (
    ("only-in-b", "only in B (extra Q/DQ, reformat or layer)"),
    ("only-in-a", "only in A"),
    ("precision", "precision changed"),
    ("fusion", "fusion split"),
)


def section(comparison: Comparison, time: Callable[[float], str] | None) -> str:
    """The page section: heading, legend, the drawing's holder and its data and scripts.

    `time` formats a layer's averageMs with the page's unit, or is None without profiles.
    """
    data = graph_data(comparison, time)
    legend = "".join(f"<span class='key {kind}'>{escape(text)}</span>" for kind, text in LEGEND)
    collapsed = sum(block["collapsed"] for block in data["blocks"])
    note = (f" {collapsed} of {len(data['blocks'])} regions without differences start collapsed." if collapsed else "")
    return (
        f"<div id='graphs-alone' class='graphs-section'><h2 id='graphs'>Engine graphs side by side "
        f"({len(comparison.pairs)} rows)</h2>"
        "<p class='muted'>Each box is a layer: name, type, data types in → out, time. Edges are tensors, coloured "
        "by data type (INT8 green, FP16 orange, FP32 grey). Paired layers share a row; a coloured box is named "
        "by a difference and links to it, its badge to the rule that fixes it. Click a region's name to "
        f"collapse or expand it.{note} <a href='#graphs-alone'>Show the drawing alone</a> (back: "
        "<a href='#graphs'>the whole page</a>).</p>"
        f"<p class='legend'>{legend}<button id='expand-all'>expand all regions</button> "
        "<button id='collapse-quiet'>collapse regions without differences</button></p>"
        "<div id='engine-graph' class='graphs'><noscript>The drawing needs JavaScript; the tables below list the "
        "same layers.</noscript></div></div>"
        + json_data("engine-graph-data", data) + scripts("engine_view.js")
    )


def graph_data(comparison: Comparison, time: Callable[[float], str] | None) -> dict[str, Any]:
    """Rows (their region block), blocks (regions, collapsible) and each side's boxes and edges."""
    row_of = {id(layer): j for j, pair in enumerate(comparison.pairs, 1)
              for layer in (pair.a, pair.b) if layer is not None}
    diffs_of = _differences_by_layer(comparison)
    blocks: list[dict[str, Any]] = []
    rows: list[int] = []
    for pair in comparison.pairs:
        if not blocks or blocks[-1]["region"] != pair.region:
            blocks.append({"region": pair.region, "diffs": 0, "layers": {"a": 0, "b": 0}, "ms": {"a": 0.0, "b": 0.0}})
        block = blocks[-1]
        for key, layer in (("a", pair.a), ("b", pair.b)):
            if layer is not None:
                block["layers"][key] += 1
                block["ms"][key] += layer.time_ms or 0.0
        rows.append(len(blocks) - 1)
    for diff in comparison.differences:
        layer = diff.b if diff.b is not None else diff.a
        blocks[rows[row_of[id(layer)] - 1]]["diffs"] += 1
    large = len(rows) > COLLAPSE_ABOVE
    for block in blocks:
        block["collapsed"] = large and not block["diffs"]
        block["ms"] = {key: time(ms) if time and ms else "" for key, ms in block["ms"].items()}
    sides = [{"key": key, "label": f"{key.upper()}: {engine.path.name} ({role})",
              "layers": [_box(layer, row_of[id(layer)], diffs_of.get(id(layer), []), time) for layer in engine.layers],
              "edges": _edges(engine, row_of)}
             for key, role, engine in (("a", "reference", comparison.a), ("b", "candidate", comparison.b))]
    return {"rows": rows, "blocks": blocks, "sides": sides, "large": large}


def _differences_by_layer(comparison: Comparison) -> dict[int, list[tuple[int, Difference]]]:
    """Each layer's differences (numbered as the table numbers them), B's pieces of a split fusion included."""
    by_name_b = {layer.name: layer for layer in comparison.b.layers}
    found: dict[int, list[tuple[int, Difference]]] = {}
    for i, diff in enumerate(comparison.differences, 1):
        pieces = [by_name_b[name] for name in diff.details.get("b_pieces", []) if name in by_name_b]
        for layer in [diff.a, diff.b, *pieces]:
            if layer is not None:
                found.setdefault(id(layer), []).append((i, diff))
    return found


def _box(layer: Layer, row: int, diffs: list[tuple[int, Difference]], time: Callable[[float], str] | None) -> dict:
    kinds = list(dict.fromkeys(diff.kind for _, diff in diffs))
    rule = next((diff.rule for _, diff in diffs if diff.rule), None)
    what = _what(layer)
    shown_time = time(layer.time_ms) if time and layer.time_ms is not None else ""
    marks = " ".join(f"#{i}" for i, _ in diffs)
    name = layer.name if len(layer.name) <= NAME_CHARS else layer.name[:NAME_CHARS - 1] + "…"
    title = [layer.name, what] + ([f"tactic {layer.tactic}"] if layer.tactic else []) + \
        ([f"averageMs {shown_time}"] if shown_time else []) + [f"difference {i}: {d.message}" for i, d in diffs]
    box: dict[str, Any] = {
        "j": row,
        "lines": [name, what, " ".join(part for part in (shown_time, marks) if part)],
        "title": "\n".join(title),
        "cls": " ".join([layer.role, *kinds]),
        "href": f"#diff-{diffs[0][0]}" if diffs else f"#pair-{row}",
    }
    if rule:
        box["badge"] = {"text": rule, "href": f"#rule-{rule}"}
    return box


def _what(layer: Layer) -> str:
    """`Convolution  INT8 → FP16`: the logical op (Q or DQ for a standalone one) and its data types."""
    if layer.is_qdq:
        op = {"Q": "Quantize", "DQ": "Dequantize"}.get(layer.qdq_direction or "", "Q/DQ")
    else:
        op = layer.kind or "+".join(layer.ops) or "layer"
    if not layer.detailed:
        return op
    inputs = ",".join(p or "?" for p in layer.input_precisions)
    outputs = ",".join(p or "?" for p in layer.output_precisions)
    return f"{op}  {inputs} → {outputs}"


def _edges(engine: Engine, row_of: dict[int, int]) -> list[list]:
    """[from row, to row, tooltip, class] per tensor between two layers; names-only files have no
    tensors, so their edges follow execution order (class `order`, drawn dashed)."""
    if not engine.detailed:
        layers = engine.layers
        return [[row_of[id(x)], row_of[id(y)], "execution order (names-only file)", "order"]
                for x, y in zip(layers, layers[1:])]
    producers = engine.producers()
    edges = []
    for layer in engine.layers:
        for tensor in layer.inputs:
            producer = producers.get(tensor.name)
            if producer is not None and producer is not layer:
                precision = tensor.precision or "?"
                edges.append([row_of[id(producer)], row_of[id(layer)], f"{tensor.name} ({precision})",
                              precision.lower()])
    return edges
