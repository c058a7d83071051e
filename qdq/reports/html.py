"""`qdq lint --format html`: one self-contained page, each finding with a picture of where it sits.

Each finding shows its rule, severity, node, message and what the target builds there, and a drawing
of its neighbourhood in the ONNX graph (qdq.reports.neighbourhood: the node, its Q/DQ nodes, the producers
and consumers two hops out), with each Q/DQ coloured by scale and zero point so that a mismatch is
visible. Inline CSS and scripts (dagre lays the pictures out); no external resource, so the page opens
without network access. Every name taken from a model is escaped. The fix report
(reports/fix_html.py) builds on the pieces here.
"""

from __future__ import annotations

from collections import Counter
from html import escape
from typing import Any

from qdq.engine.lint import LintReport, LintResult
from qdq.engine.registry import all_rules
from qdq.reports import onnx_pictures
from qdq.reports.text import describe, summary_line
from qdq.rewrite.rule import Finding, Severity

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.3em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc} code{font-size:12px}
table{border-collapse:collapse} td,th{border-bottom:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
.finding{border:1px solid #ddd;border-left:5px solid #999;margin:12px 0;padding:6px 10px}
.finding.error{border-left-color:#c00} .finding.warning{border-left-color:#e0a000} .finding.info{border-left-color:#4c72b0}
.finding:target{outline:2px solid #4c72b0} .finding h3{font-size:1em;margin:0 0 4px}
.effect{color:#555} .muted{color:#777} .note{background:#fff8e0;border-left:4px solid #e0b000;padding:4px 8px}
.pictures{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start} .picture{overflow:auto;max-width:100%}
.pictures.pair{display:grid;grid-template-columns:1fr 1fr} .pictures.pair>div{min-width:0}
.pictures h4{margin:4px 0;font-size:12px;color:#555} .fixed{color:#282} .remains{color:#c00}
""" + onnx_pictures.CSS
MAX_PICTURES = 300  # beyond this a page gets slow to open (~1 s per 100 pictures); the most severe come first
KEY = "Pictures: the finding's node (red border), its Q/DQ nodes, producers and consumers two hops out; Q/DQ " \
      "nodes with the same scale and zero point share a colour; red edges carry the finding's tensors."


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    pictures: list[dict[str, Any]] = []
    sections, number = [], 0
    for result in report.results:
        cards = []
        for finding in sorted(result.findings, key=lambda f: (-f.severity, f.code, f.node or "")):
            number += 1
            drawing = picture_block(f"picture-{number}", "", finding, finding.neighbourhood, pictures)
            cards.append(card(number, finding, f"<div class='pictures'>{drawing}</div>"))
        notes = "".join(f"<p class='note'>{escape(note)}</p>" for note in result.notes)
        clean = "" if cards else "<p>No findings.</p>"
        sections.append(f"<h2>{escape(str(result.model_path))}</h2>{notes}{clean}{''.join(cards)}")
    sections += [f"<h2>{escape(str(m.model_path))}</h2><p class='note'>could not be read: {escape(m.error)}</p>"
                 for m in report.unreadable]
    summary = summary_line(report, fail_on)
    return page(f"qdq lint: {summary}", f"<p class='muted'>{KEY}</p>"
                + rules_table(report.findings) + "".join(sections), pictures)


def card(number: int, finding: Finding, body: str) -> str:
    """One finding: rule (linked to the rules table), severity and node, the message, the target's effect."""
    effect = f"<p class='effect'>→ {escape(finding.effect)}</p>" if finding.effect else ""
    return (f"<div class='finding {escape(str(finding.severity))}' id='finding-{number}'>"
            f"<h3>{number}. <a href='#rule-{escape(finding.code)}'>{escape(finding.code)}</a> "
            f"[{escape(str(finding.severity))}] <code>{escape(finding.node or '')}</code></h3>"
            f"<p>{escape(describe(finding))}</p>{effect}{body}</div>")


def picture_block(holder: str, heading: str, finding: Finding, neighbourhood, pictures: list[dict[str, Any]],
                  palette: dict[str, str] | None = None) -> str:
    """A picture's holder and colour legend (its data appended to `pictures`), or why there is none;
    pictures given one `palette` colour equal parameters alike."""
    title = f"<h4>{escape(heading)}</h4>" if heading else ""
    if len(pictures) >= MAX_PICTURES:
        return f"<div>{title}<p class='muted'>No picture: a page draws at most {MAX_PICTURES}.</p></div>"
    if neighbourhood is None:
        why = "about the whole model" if not (finding.node or finding.tensors) else "not in this model"
        return f"<div>{title}<p class='muted'>No picture: the finding's node is {why}.</p></div>"
    data = onnx_pictures.picture(holder, f"{finding.code} at {finding.node or ''} {heading}".strip(), neighbourhood,
                                 palette)
    pictures.append(data)
    return f"<div>{title}<div class='picture' id='{holder}'></div><p>{onnx_pictures.legend(data)}</p></div>"


def rules_table(findings: list[Finding]) -> str:
    counts = Counter(f.code for f in findings)
    if not counts:
        return ""
    rules = all_rules()
    rows = "".join(f"<tr id='rule-{escape(code)}'><td><code>{escape(code)}</code></td><td>{n}</td>"
                   f"<td>{escape(rules[code].name if code in rules else '')}</td>"
                   f"<td><code>qdq explain {escape(code)}</code></td></tr>" for code, n in sorted(counts.items()))
    return f"<table><tr><th>rule</th><th>findings</th><th>name</th><th>documentation</th></tr>{rows}</table>"


def page(title: str, body: str, pictures: list[dict[str, Any]]) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>{body}"
            + (onnx_pictures.page_scripts(pictures) if pictures else "") + "</body></html>\n")
