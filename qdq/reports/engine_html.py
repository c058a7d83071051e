"""`qdq compare --format html`: one self-contained page: both engine graphs side by side, the time as a
chart, the differences and every layer as tables.

Inline CSS, an inline SVG chart and inline scripts (the graphs: see engine_graph); no external
resource, so the file can be attached to a CI run or mailed and opens anywhere without network access.
Every string that comes from the engine files (layer, tensor and file names) is escaped: a layer name
may hold `<`, `&` or quotes.

Links stay inside the page: a difference points to its box in the graphs, its row in the layer table
and its rule; a box to its difference and rule; a chart bar to its layer row; a layer row back to its
differences.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from html import escape
from pathlib import Path

from qdq.reports import engine_graph
from qdq.reports.engine_text import tensorrt
from qdq.trt.align import Pair
from qdq.trt.diff import Comparison, Difference, summary
from qdq.trt.hazards import RULES
from qdq.trt.layers import Layer
from qdq.trt.onnx_map import OnnxMapping

TOP_LAYERS = 25  # chart rows: the layers with the largest time difference; the rest are summed in a note
COLOURS = {"A": "#4c72b0", "B": "#dd8452"}
KINDS = {
    "only-in-b": "a layer only the candidate B has (an extra Q/DQ or reformat, or a compute layer)",
    "only-in-a": "a layer only the reference A has",
    "precision": "a paired layer whose input or output data types changed",
    "fusion": "A fuses ops into one layer that B runs apart",
}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.3em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}
nav a{margin-right:1em} code{font-size:12px}
table{border-collapse:collapse} td,th{border-bottom:1px solid #ddd;padding:2px 6px;vertical-align:top}
th{background:#f4f4f4;text-align:left;white-space:nowrap} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
table.wide{width:100%} table.wide th{position:sticky;top:0}
.name{font-family:monospace;font-size:12px;overflow-wrap:anywhere}
.io{font-family:monospace;font-size:11px;color:#555;white-space:nowrap} .muted{color:#777}
td.a,td.b{min-width:16em} td.what{max-width:26em}
tr.only-in-b td.b,tr.only-in-b td.bio{background:#fdd} tr.only-in-a td.a,tr.only-in-a td.aio{background:#ddf}
tr.precision td.aio,tr.precision td.bio{background:#fec} tr.fusion td{background:#eef8e6}
tr.diff.only-in-b td.kind{background:#fdd} tr.diff.only-in-a td.kind{background:#ddf}
tr.diff.precision td.kind{background:#fec} tr.diff.fusion td.kind{background:#eef8e6}
tr:target{outline:2px solid #4c72b0}
.tag{font-size:11px;border-radius:3px;padding:0 4px;background:#eee;margin-left:4px}
.note{background:#fff8e0;border-left:4px solid #e0b000;padding:4px 8px;margin:4px 0}
.failed{background:#fde8e8;border-left:4px solid #c00;padding:4px 8px;font-weight:bold}
.legend span{display:inline-block;padding:0 6px;margin-right:6px}
svg text{font-family:monospace;font-size:11px} svg a:hover text{fill:#4c72b0}
.legend button{margin-left:1em;font-size:12px}
.legend span.only-in-b{background:#fdd;border:1px solid #c00} .legend span.only-in-a{background:#ddf;border:1px solid #33a}
.legend span.precision{background:#fec;border:1px solid #c70} .legend span.fusion{background:#eef8e6;border:1px solid #4a4}
.graphs{overflow:auto;max-height:85vh;border:1px solid #ddd;max-width:none}
.graphs g.node rect{fill:#fff;stroke:#999} .graphs g.node text.l0{font-weight:bold}
.graphs g.node text.l1,.graphs g.node text.l2{fill:#555;font-size:10px}
.graphs g.qdq rect{stroke-dasharray:4 2} .graphs g.noop rect{fill:#f6f6f6;stroke:#ccc} .graphs g.noop text{fill:#999}
.graphs g.reformat rect{fill:#f4f0ff}
.graphs g.only-in-b rect{fill:#fdd;stroke:#c00;stroke-width:2.5} .graphs g.only-in-a rect{fill:#ddf;stroke:#33a;stroke-width:2.5}
.graphs g.precision rect{fill:#fec;stroke:#c70;stroke-width:2.5} .graphs g.fusion rect{fill:#eef8e6;stroke:#4a4;stroke-width:2.5}
.graphs g.block rect{fill:#f0f0f0;stroke:#888} .graphs g.block.has-diff rect{stroke:#c00}
.graphs g.node:target rect{stroke:#4c72b0;stroke-width:4} .graphs a.badge text{fill:#c00;font-weight:bold}
.graphs g.edge path{fill:none;stroke:#999} .graphs g.edge path.head{fill:#999;stroke:none}
.graphs g.edge.int8 path{stroke:#3a3} .graphs g.edge.int8 path.head{fill:#3a3;stroke:none}
.graphs g.edge.fp16 path{stroke:#d80} .graphs g.edge.fp16 path.head{fill:#d80;stroke:none}
.graphs g.edge.order path{stroke-dasharray:3 3}
.graphs g.band rect{fill:#fafafa} .graphs g.band.odd rect{fill:#f1f4f8} .graphs text.region{cursor:pointer}
.graphs g.band text.region{font-weight:bold;fill:#333} .graphs g.band text.count{fill:#c00}
.graphs text.side{font-weight:bold;font-size:13px} .graphs g.block{cursor:pointer}
body.graphs-alone{max-width:none} body.graphs-alone>*:not(.graphs-section){display:none}
body.graphs-alone .graphs{max-height:none;border:none}
"""


@dataclass(frozen=True)
class Unit:
    """One time unit for the whole page: µs when the engines run under a millisecond."""

    name: str
    per_ms: float
    digits: int

    @classmethod
    def for_totals(cls, *totals_ms: float | None) -> Unit:
        return cls("µs", 1000.0, 1) if max((t or 0.0 for t in totals_ms), default=0.0) < 1.0 else cls("ms", 1.0, 4)

    def __call__(self, ms: float) -> str:
        return f"{ms * self.per_ms:.{self.digits}f}"

    def signed(self, ms: float) -> str:
        return f"{ms * self.per_ms:+.{self.digits}f}"


def render(comparison: Comparison, mapping: OnnxMapping | None, failed: list[str]) -> str:
    page = _Page(comparison, mapping)
    sections = [page.header(failed), page.summary(), page.chart() if page.timed else "", page.graphs(),
                page.differences(), page.rules(), page.layers()]
    return "".join(sections) + "</body></html>\n"


class _Page:
    """The comparison with the ids, labels and unit its sections share."""

    def __init__(self, comparison: Comparison, mapping: OnnxMapping | None):
        self.comparison, self.mapping = comparison, mapping
        self.timed = comparison.a.has_times and comparison.b.has_times
        self.labels = engine_labels(comparison.a.path, comparison.b.path)
        self.unit = Unit.for_totals(comparison.a.total_ms(), comparison.b.total_ms())
        self.pair_of = {id(layer): j for j, pair in enumerate(comparison.pairs, 1)
                        for layer in (pair.a, pair.b) if layer is not None}
        self.diffs_of: dict[int, list[tuple[int, Difference]]] = {}
        for i, diff in enumerate(comparison.differences, 1):
            self.diffs_of.setdefault(self._pair(diff), []).append((i, diff))

    def _pair(self, diff: Difference) -> int:
        return self.pair_of[id(diff.b if diff.b is not None else diff.a)]

    def header(self, failed: list[str]) -> str:
        c = self.comparison
        notes = c.notes + (self.mapping.notes if self.mapping else [])
        engines = "<br>".join(
            f"{side} ({role}): <code>{escape(str(engine.path))}</code> [{escape(tensorrt(engine))}]"
            + (f", profile <code>{escape(str(engine.profile_path))}</code>" if engine.profile_path else "")
            for side, role, engine in (("A", "reference", c.a), ("B", "candidate", c.b)))
        nav = [("summary", "Summary"), ("graphs", "Engine graphs"), ("differences", f"Differences ({len(c.differences)})"), ("rules", "Rules"),
               ("layers", "All layers")]
        if self.timed:
            nav.insert(1, ("chart", "Time per layer"))
        return (
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>qdq compare: {escape(self.labels['A'])} vs {escape(self.labels['B'])}</title>"
            f"<style>{_CSS}</style></head><body>"
            f"<h1>qdq compare: {escape(self.labels['A'])} vs {escape(self.labels['B'])}</h1><p>{engines}</p>"
            "<nav>" + "".join(f"<a href='#{key}'>{text}</a>" for key, text in nav) + "</nav>"
            + "".join(f"<p class='failed'>Failed --fail-on: {escape(item)}</p>" for item in failed)
            + "".join(f"<p class='note'>{escape(note)}</p>" for note in notes)
        )

    def summary(self) -> str:
        sa, sb = summary(self.comparison.a), summary(self.comparison.b)
        rows = [("layers (without NoOp/Constant)", "layers_without_noops"), ("standalone Q/DQ layers", "qdq_layers"),
                ("reformat layers", "reformat_layers")]
        if sa["int8_layers"] is not None and sb["int8_layers"] is not None:
            rows.append(("INT8 compute layers", "int8_layers"))
        body = "".join(f"<tr><td>{label}</td><td class='num'>{sa[key]}</td><td class='num'>{sb[key]}</td>"
                       f"<td class='num'>{sb[key] - sa[key]:+d}</td></tr>" for label, key in rows)
        if self.timed:
            ta, tb = sa["total_ms"], sb["total_ms"]
            pct = f" ({100 * (tb - ta) / ta:+.1f} %)" if ta else ""
            body += (f"<tr><td>time, sum of averageMs ({self.unit.name})</td><td class='num'>{self.unit(ta)}</td>"
                     f"<td class='num'>{self.unit(tb)}</td><td class='num'>{self.unit.signed(tb - ta)}{pct}</td></tr>")
        totals = self.comparison.totals()
        counts = "".join(f"<tr><td>{label}</td><td class='num'>{n}</td></tr>"
                         for label, n in difference_counts(self.comparison))
        return (
            "<h2 id='summary'>Summary</h2><table><tr><th></th>"
            f"<th class='num'>A</th><th class='num'>B</th><th class='num'>B − A</th></tr>{body}</table>"
            f"<p>{totals['paired']} layers paired ({totals['paired_compute']} of {totals['compute_layers_larger']} "
            "compute layers of the larger engine).</p>"
            f"<table><tr><th>differences (B against A)</th><th class='num'>count</th></tr>{counts}</table>"
        )

    def graphs(self) -> str:
        time = (lambda ms: f"{self.unit(ms)} {self.unit.name}") if self.timed else None
        return engine_graph.section(self.comparison, time)

    def chart(self) -> str:
        """Bars of A and B per layer row, the rows with the largest time difference only."""
        c, unit = self.comparison, self.unit
        drawable = [(j, pair) for j, pair in enumerate(c.pairs, 1)
                    if (_ms(pair.a) or _ms(pair.b)) and math.isfinite(_ms(pair.a) + _ms(pair.b))]
        if not drawable:
            return "<h2 id='chart'>Time per layer (averageMs)</h2><p>No finite layer time to draw.</p>"
        ranked = sorted(drawable, key=lambda jp: -abs(_ms(jp[1].b) - _ms(jp[1].a)))
        shown, hidden = ranked[:TOP_LAYERS], ranked[TOP_LAYERS:]
        if hidden:
            rest = (f"The {len(shown)} layer rows with the largest time difference |B − A|, largest first. "
                    f"{len(hidden)} more layers are not drawn (A {unit(sum(_ms(p.a) for _, p in hidden))} "
                    f"{unit.name}, B {unit(sum(_ms(p.b) for _, p in hidden))} {unit.name} together); "
                    "the layer table lists every layer.")
        else:
            rest = f"All {len(shown)} timed layer rows, largest time difference |B − A| first."
        totals = {"A": c.a.total_ms(), "B": c.b.total_ms()}
        return ("<h2 id='chart'>Time per layer (averageMs)</h2>"
                + time_chart(shown, totals, self.labels, unit)
                + f"<p class='muted'>{rest} Each row links to its layer in the table below. Totals are the sums "
                "of every layer's averageMs in the profile.</p>")

    def differences(self) -> str:
        c = self.comparison
        kinds = "; ".join(f"<b>{kind}</b>: {text}" for kind, text in KINDS.items())
        if not c.differences:
            return ("<h2 id='differences'>Differences</h2>"
                    "<p>No differences in Q/DQ or reformat layers, precisions or fusions.</p>")
        head = ("<tr><th>#</th><th>kind</th><th>region</th><th>what</th><th>A layer</th><th>B layer</th>"
                + (f"<th class='num'>B − A ({self.unit.name})</th>" if self.timed else "")
                + "<th>ONNX Q/DQ nodes (B)</th><th>rule</th><th>row</th></tr>")
        rows = []
        for i, diff in enumerate(c.differences, 1):
            delta = diff.delta_ms
            time = (f"<td class='num'>{self.unit.signed(delta) if delta is not None else ''}</td>" if self.timed else "")
            j = self._pair(diff)
            rows.append(
                f"<tr id='diff-{i}' class='diff {escape(diff.kind)}'><td class='num'>{i}</td>"
                f"<td class='kind'>{escape(diff.kind)}</td><td class='region'>{escape(diff.region)}</td>"
                f"<td class='what'>{escape(diff.message)}</td>"
                f"<td class='a'>{self._layer(diff.a)}</td><td class='b'>{self._layer(diff.b)}</td>{time}"
                f"<td class='onnx'>{_onnx(diff)}</td><td class='rule'>{_rule_link(diff.rule)}</td>"
                f"<td><a href='#pair-{j}'>layer {j}</a> <a href='#g{'b' if diff.b is not None else 'a'}-{j}'>graph</a>"
                "</td></tr>")
        return (f"<h2 id='differences'>Differences ({len(c.differences)}), in network order</h2>"
                f"<p class='muted'>{kinds}.</p><table class='wide'>{head}{''.join(rows)}</table>")

    def _layer(self, layer: Layer | None) -> str:
        if layer is None:
            return "<span class='muted'>—</span>"
        tag = f"<span class='tag'>{escape(layer.role)}</span>" if layer.role != "compute" else ""
        io = f"<div class='io'>{escape(_io(layer))}</div>" if layer.detailed else ""
        time = f"<div class='io'>{self.unit(layer.time_ms)} {self.unit.name}</div>" if layer.time_ms is not None else ""
        return f"<span class='name'>{escape(layer.name)}</span>{tag}{io}{time}"

    def rules(self) -> str:
        used = Counter(d.rule for d in self.comparison.differences if d.rule)
        if not used:
            return ("<h2 id='rules'>Rules</h2><p>No Q/DQ placement rule of the trt set applies to these "
                    "differences.</p>")
        rows = "".join(f"<tr id='rule-{escape(code)}'><td><code>{escape(code)}</code></td><td class='num'>{n}</td>"
                       f"<td>{escape(RULES.get(code, ''))}</td></tr>" for code, n in sorted(used.items()))
        onnx = escape(str(self.mapping.model)) if self.mapping else "&lt;B.onnx&gt;"
        lint = ""
        if self.mapping is not None:
            lint = (f"<p><code>{onnx}</code>: {self.mapping.findings} lint finding(s) with rule set "
                    f"'{escape(self.mapping.target)}'; attached to differences: "
                    f"{escape(', '.join(self.mapping.addressed) or 'none')}.</p>")
        return (
            "<h2 id='rules'>Rules that fix these differences</h2>"
            f"<table><tr><th>rule</th><th class='num'>differences</th><th>what it does</th></tr>{rows}</table>{lint}"
            f"<p>Next: run <code>qdq fix --target trt {onnx} -o fixed.onnx</code>, rebuild the engine and compare "
            "again.</p>"
        )

    def layers(self) -> str:
        head = ("<tr><th>#</th><th>region</th><th>A layer</th><th>A types</th>"
                + (f"<th class='num'>A {self.unit.name}</th>" if self.timed else "")
                + "<th>B layer</th><th>B types</th>" + (f"<th class='num'>B {self.unit.name}</th>" if self.timed else "")
                + "<th>differences</th></tr>")
        rows = []
        for j, pair in enumerate(self.comparison.pairs, 1):
            diffs = self.diffs_of.get(j, [])
            kinds = " ".join(sorted({d.kind for _, d in diffs}))
            marked = f" class='{kinds}'" if kinds else ""
            links = "".join(f"<div><a href='#diff-{i}'>{i}</a> {escape(d.kind)}{_rule_link(d.rule, ' ')}</div>"
                            for i, d in diffs)
            rows.append(f"<tr id='pair-{j}'{marked}><td class='num'>{j}</td><td>{escape(pair.region)}</td>"
                        + self._cells(pair.a, "a") + self._cells(pair.b, "b") + f"<td>{links}</td></tr>")
        legend = ("<p class='legend'><span style='background:#fdd'>only in B</span>"
                  "<span style='background:#ddf'>only in A</span><span style='background:#fec'>precision change</span>"
                  "<span style='background:#eef8e6'>fusion split</span></p>")
        return (f"<h2 id='layers'>All layers side by side ({len(self.comparison.pairs)} rows, execution order)</h2>"
                f"{legend}<table class='wide'>{head}{''.join(rows)}</table>")

    def _cells(self, layer: Layer | None, side: str) -> str:
        time = f"<td class='num'>{self.unit(layer.time_ms) if layer and layer.time_ms is not None else ''}</td>"
        if layer is None:
            return f"<td class='name {side}'></td><td class='{side}io'></td>" + (time if self.timed else "")
        tag = f"<span class='tag'>{escape(layer.role)}</span>" if layer.role != "compute" else ""
        io = escape(_io(layer)) if layer.detailed else ""
        return (f"<td class='name {side}'>{escape(layer.name)}{tag}</td><td class='{side}io io'>{io}</td>"
                + (time if self.timed else ""))


def engine_labels(a: Path, b: Path) -> dict[str, str]:
    """A and B by file name; with the parent folder when both files have one name (fp32/ and fp16/)."""
    if a.name != b.name:
        return {"A": a.name, "B": b.name}
    return {"A": f"{a.parent.name}/{a.name}", "B": f"{b.parent.name}/{b.name}"}


def difference_counts(comparison: Comparison) -> list[tuple[str, int]]:
    """The text report's summary numbers, as rows."""
    n = comparison.breakdown()
    return [
        ("standalone Q/DQ layers only in B", n["qdq_only_in_b"]),
        ("reformats only in B", n["reformats_only_in_b"]),
        ("compute layers only in B", n["compute_only_in_b"]),
        ("layers INT8 in A but float in B", n["lost_int8"]),
        ("… of which Conv+Add with a float residual in B", n["float_residual"]),
        ("layers float in A but INT8 in B", n["gained_int8"]),
        ("other data type changes (e.g. FP32 → FP16)", n["other_precision"]),
        ("fusions of A split in B", n["split_fusions"]),
        ("non-NoOp layers only in A", n["only_in_a"]),
    ]


def time_chart(rows: list[tuple[int, Pair]], totals: dict[str, float], labels: dict[str, str], unit: Unit) -> str:
    """Horizontal bars, A above B, one row per (numbered) layer row; an x axis in `unit` with ticks."""
    label_w, plot_w, delta_w, row_h, top = 360, 520, 120, 20, 64
    ticks = axis_ticks(max(max(_ms(p.a), _ms(p.b)) for _, p in rows) * unit.per_ms)
    px = plot_w / ticks[-1]  # pixels per unit
    bottom = top + row_h * len(rows)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{label_w + plot_w + delta_w}' height='{bottom + 48}' "
           "role='img' aria-label='time per layer'>"]
    for k, side in enumerate(("A", "B")):
        y = 14 + 18 * k
        out.append(f"<rect x='0' y='{y - 10}' width='12' height='12' fill='{COLOURS[side]}'/>"
                   f"<text x='18' y='{y}'>{side}: {escape(labels[side])}  total "
                   f"<tspan id='total-{side.lower()}' font-weight='bold'>{unit(totals[side])} {unit.name}</tspan></text>")
    out.append(f"<text x='0' y='{top - 6}' fill='#555'>layer</text>"
               f"<text x='{label_w + plot_w + delta_w - 4}' y='{top - 6}' text-anchor='end' fill='#555'>"
               f"B − A ({unit.name})</text>")
    for t in ticks:
        x = label_w + t * px
        out.append(f"<line x1='{x:.1f}' y1='{top - 2}' x2='{x:.1f}' y2='{bottom + 4}' stroke='#ddd'/>"
                   f"<text class='tick' x='{x:.1f}' y='{bottom + 18}' text-anchor='middle'>{t:g}</text>")
    out.append(f"<line x1='{label_w}' y1='{bottom}' x2='{label_w + plot_w}' y2='{bottom}' stroke='#444'/>"
               f"<text id='axis-label' x='{label_w + plot_w / 2}' y='{bottom + 38}' text-anchor='middle'>"
               f"time per layer, averageMs ({unit.name})</text>")
    for i, (j, pair) in enumerate(rows):
        y = top + i * row_h
        name = (pair.b or pair.a).name
        label = name if len(name) <= 50 else name[:47] + "..."
        out.append(f"<a href='#pair-{j}'><text x='0' y='{y + 14}'><title>{escape(name)}</title>{escape(label)}</text>")
        for offset, side, layer in ((2, "A", pair.a), (10, "B", pair.b)):
            if layer is not None and layer.time_ms:
                out.append(f"<rect class='bar-{side.lower()}' x='{label_w}' y='{y + offset}' "
                           f"width='{max(1.0, layer.time_ms * unit.per_ms * px):.1f}' height='7' fill='{COLOURS[side]}'>"
                           f"<title>{side}: {escape(layer.name)}: {unit(layer.time_ms)} {unit.name}</title></rect>")
        out.append(f"<text x='{label_w + plot_w + delta_w - 4}' y='{y + 14}' text-anchor='end'>"
                   f"{unit.signed(_ms(pair.b) - _ms(pair.a))}</text></a>")
    out.append("</svg>")
    return "".join(out)


def axis_ticks(largest: float) -> list[float]:
    """0 to just above `largest` in about five steps of 1, 2 or 5 times a power of ten."""
    if not largest > 1e-9:  # nothing to scale (also a tiny or NaN time, which would give a zero step)
        return [0.0, 1.0]
    magnitude = 10 ** math.floor(math.log10(largest / 5))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= largest / 5)
    return [round(k * step, 12) for k in range(math.ceil(largest / step - 1e-9) + 1)]


def _onnx(diff: Difference) -> str:
    parts = [f"<code>{escape(node)}</code>" for node in diff.qdq_nodes]
    missing = diff.details.get("not_in_onnx")
    if missing:
        parts.append(f"<div class='muted'>not in the ONNX model: {escape(', '.join(missing))}</div>")
    parts += [f"<div>lint {escape(f['code'])} {escape(f['node'] or '')}: {escape(f['message'])}</div>"
              for f in diff.findings]
    return " ".join(parts)


def _rule_link(code: str | None, before: str = "") -> str:
    return f"{before}<a href='#rule-{escape(code)}'>{escape(code)}</a>" if code else ""


def _io(layer: Layer) -> str:
    return (", ".join(p or "?" for p in layer.input_precisions) + " → "
            + ", ".join(p or "?" for p in layer.output_precisions))


def _ms(layer: Layer | None) -> float:
    return layer.time_ms or 0.0 if layer is not None else 0.0
