"""`qdq fix --report-html`: each finding of the input model, drawn before and after the fix.

One card per finding the input model had: whether the fix removed it, the changes made at its node
or tensors, and two pictures of its neighbourhood (reports/html.py draws them): in the input model
and, around the same node, in the fixed one, so a unified scale shows as one colour where there were
several. Both pictures share a palette: parameters the fix left alone keep their colour. Findings the fixes introduced follow, drawn in the fixed model.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from qdq.engine.fix import FixResult
from qdq.engine.lint import LintResult, identity
from qdq.reports.fix import change_line
from qdq.reports.html import card, page, picture_block, rules_table
from qdq.rewrite.rule import Change, Finding


def render(model: Path, output: Path | None, before: LintResult, after: list, fixed: FixResult, verdict: str) -> str:
    """`after[k]` is the neighbourhood of `before.findings[k]`'s node in the fixed model (None if it is gone)."""
    remaining = {identity(f) for f in fixed.result.findings}
    pictures: list[dict[str, Any]] = []
    cards = []
    for number, (finding, later) in enumerate(zip(before.findings, after), 1):
        status = ("<p><b class='remains'>remains after the fix</b></p>" if identity(finding) in remaining
                  else "<p><b class='fixed'>fixed</b></p>")
        palette: dict[str, str] = {}  # one parameter, one colour, before and after
        drawings = (picture_block(f"before-{number}", "before", finding, finding.neighbourhood, pictures, palette)
                    + picture_block(f"after-{number}", "after", finding, later, pictures, palette))
        cards.append(card(number, finding, status + _changes(fixed.changes, finding)
                          + f"<div class='pictures pair'>{drawings}</div>"))
    known = {identity(f) for f in before.findings}
    introduced = [f for f in fixed.result.findings if identity(f) not in known]
    new_cards = [card(len(before.findings) + k, f, "<div class='pictures'>" + picture_block(
        f"after-{len(before.findings) + k}", "after", f, f.neighbourhood, pictures) + "</div>")
        for k, f in enumerate(introduced, 1)]
    where = f"{model} → {output}" if output is not None else f"{model} (not written)"
    body = (f"<p>{escape(verdict)}; {len(fixed.changes)} change(s) in {fixed.rounds} round(s).</p>"
            + "".join(f"<p class='note'>{escape(note)}</p>" for note in fixed.result.notes)
            + rules_table(before.findings + introduced)
            + f"<h2>Findings of the input model ({len(before.findings)})</h2>" + "".join(cards)
            + (f"<h2>Findings the fixes introduced ({len(introduced)})</h2>" + "".join(new_cards) if introduced else ""))
    return page(f"qdq fix: {where}", body, pictures)


def _changes(changes: list[Change], finding: Finding) -> str:
    """The changes made at the finding's node or on its tensors."""
    mine = [c for c in changes if (c.node and c.node == finding.node) or (c.tensor and c.tensor in finding.tensors)]
    if not mine:
        return ""
    return "<ul>" + "".join(f"<li>{escape(change_line(c))}</li>" for c in mine) + "</ul>"
