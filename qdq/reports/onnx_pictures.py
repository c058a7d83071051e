"""The finding pictures of the HTML lint and fix reports: a neighbourhood (qdq.reports.neighbourhood) as data
for the page script (`assets/onnx_view.js`), with each Q/DQ coloured by its parameters.

Within one picture, Q/DQ nodes with the same scale and zero point share a colour and different ones
differ, so a Concat whose inputs are quantized three ways shows three colours. Pictures drawn with
one palette (a finding before and after its fix) give the same parameters the same colour.
"""

from __future__ import annotations

from html import escape
from typing import Any

from qdq.reports.html_assets import json_data, scripts
from qdq.reports.neighbourhood import Neighbourhood

NAME_CHARS = 28  # what fits on a box's second line

CSS = """
.picture svg text{font-family:monospace;font-size:11px} .picture g.node rect{fill:#fff;stroke:#999}
.picture g.node text.l0{font-weight:bold} .picture g.node text.l1,.picture g.node text.l2{font-size:10px;fill:#444}
.picture g.centre rect{stroke:#c00;stroke-width:3} .picture g.qdq rect{stroke:#555}
.picture g.edge path{fill:none;stroke:#999} .picture g.edge path.head{fill:#999;stroke:none}
.picture g.edge.marked path{stroke:#c00;stroke-width:2} .picture g.edge.marked path.head{fill:#c00}
.swatch{display:inline-block;padding:0 6px;margin:2px 6px 2px 0;border:1px solid #888;font-family:monospace;font-size:11px}
"""


def colour(k: int) -> str:
    """The k-th parameter colour: hues a golden angle apart, light enough for black text."""
    return f"hsl({(k * 137.508 + 200) % 360:.0f},75%,80%)"


def picture(holder: str, label: str, neighbourhood: Neighbourhood,
            palette: dict[str, str] | None = None) -> dict[str, Any]:
    """What the script draws into the element `holder`: boxes, edges (the finding's tensors marked) and
    the legend of parameter colours. A Q feeding only a DQ with its parameters (a quantized tensor, the
    common case) is one box, which halves the height of most pictures. `palette` (parameters → colour)
    is shared with the pictures drawn with it, and grows with the parameters this one adds."""
    merged = _quantized_tensors(neighbourhood)
    quantized = {b: tensor for _, b, tensor in neighbourhood.edges if b in merged}
    by_id = {node.id: node for node in neighbourhood.nodes}
    palette = {} if palette is None else palette
    for node in neighbourhood.nodes:
        if node.params is not None and node.params not in palette:
            palette[node.params] = colour(len(palette))
    colours = {node.params: palette[node.params] for node in neighbourhood.nodes if node.params is not None}
    nodes = []
    for node in neighbourhood.nodes:
        if node.id in merged.values():
            continue
        dq = merged.get(node.id)
        op = "Q → DQ" if dq else node.op
        shown = quantized.get(node.id, node.name) if dq else node.name  # a pair is named by the tensor it quantizes
        name = shown if len(shown) <= NAME_CHARS else "…" + shown[-(NAME_CHARS - 1):]
        box = {"id": node.id, "lines": [op, name] + ([node.params] if node.params else []),
               "title": f"{node.op} {node.name}" + (f" → {by_id[dq].op} {by_id[dq].name}" if dq else "")
               + (f"\n{node.params}" if node.params else ""),
               "cls": " ".join(c for c in ("centre" if node.centre else "", "qdq" if node.params else "") if c)}
        if node.params is not None:
            box["fill"] = colours[node.params]
        nodes.append(box)
    into = {dq: q for q, dq in merged.items()}
    edges = [[into.get(a, a), b, tensor, "marked" if tensor in neighbourhood.tensors else ""]
             for a, b, tensor in neighbourhood.edges if b not in into]
    return {"holder": holder, "label": label, "nodes": nodes, "edges": edges, "legend": colours}


def _quantized_tensors(neighbourhood: Neighbourhood) -> dict[str, str]:
    """Q id -> DQ id for each Q whose only consumer is a DQ with the same parameters and no other producer."""
    by_id = {node.id: node for node in neighbourhood.nodes}
    out: dict[str, list[str]] = {}
    into: dict[str, list[str]] = {}
    for a, b, _ in neighbourhood.edges:
        out.setdefault(a, []).append(b)
        into.setdefault(b, []).append(a)
    pairs = {}
    for node in neighbourhood.nodes:
        consumers = out.get(node.id, [])
        if node.op == "QuantizeLinear" and not node.centre and len(consumers) == 1:
            dq = by_id[consumers[0]]
            if dq.op == "DequantizeLinear" and not dq.centre and dq.params == node.params and len(into[dq.id]) == 1:
                pairs[node.id] = dq.id
    return pairs


def legend(data: dict[str, Any]) -> str:
    """The colour swatches of one picture, as HTML under it."""
    return "".join(f"<span class='swatch' style='background:{c}'>{escape(params)}</span>"
                   for params, c in data["legend"].items())


def page_scripts(pictures: list[dict[str, Any]]) -> str:
    return json_data("onnx-pictures-data", pictures) + scripts("onnx_view.js")
