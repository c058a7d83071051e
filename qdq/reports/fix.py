"""The report of `qdq fix`: every change (rule, node, tensor, old → new), the numerical check, what is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qdq.engine.fix import FixResult
from qdq.reports.text import finding_line
from qdq.rewrite.rule import FixSafety, Severity
from qdq.verification.verify import VerifyResult, render_text as render_verification


def to_dict(
    model: Path, output: Path | None, fixed: FixResult, verification: VerifyResult | None, skipped: str | None,
    written: bool, fail_on: Severity, passed: bool,
) -> dict[str, Any]:
    """`skipped` is why verification could not run (None if it ran or had nothing to compare);
    `written` whether this run wrote the output file."""
    return {
        "model": str(model),
        "output": str(output) if output is not None else None,
        "written": written,
        "rule_set": fixed.result.ruleset.name,
        "fail_on": str(fail_on),
        "notes": list(fixed.result.notes),
        **fixed.to_dict(),
        "verification": verification.to_dict() if verification is not None else None,
        "verification_skipped": skipped,
        "passed": passed,
    }


def render_text(
    model: Path, output: Path | None, fixed: FixResult, verification: VerifyResult | None, skipped: str | None,
    fail_on: Severity, verdict: str,
) -> str:
    # Notes first, as lint prints them: what reading repaired is in the written file too.
    lines = [f"note: {note}" for note in fixed.result.notes] + [change_line(c) for c in fixed.changes]
    if fixed.changes:
        lines.append("By rule: " + ", ".join(f"{code} x{n}" for code, n in fixed.by_rule().items()))
    if not fixed.converged:
        lines.append(
            f"error: the fixes did not settle within {fixed.max_rounds} rounds; the last round still changed "
            f"{', '.join(fixed.still_changing)} (rules that undo each other: raise --max-rounds or disable one)"
        )
    if verification is not None:
        lines.append(render_verification(verification).rstrip("\n"))
    if skipped is not None:
        lines.append(f"note: verification skipped: {skipped}")
    remaining = fixed.result.failing(fail_on)
    for finding in remaining:
        why = _why_not_fixed(finding, fixed)
        lines.append(finding_line(str(output or model), finding) + f" [not fixed: {why}]")
    where = f"{model} → {output}" if output is not None else f"{model} (dry run, nothing written)"
    rounds = f"{fixed.rounds} round{'s' if fixed.rounds != 1 else ''}"
    lines.append(f"{where}: {len(fixed.changes)} change(s) in {rounds} with rule set '{fixed.result.ruleset.name}'; {verdict}")
    return "\n".join(lines) + "\n"


def _why_not_fixed(finding, fixed: FixResult) -> str:
    if finding.fix is None:
        return "no automatic fix for this case"
    if not fixed.converged:
        return "the round limit was hit first"
    if fixed.exact_only and finding.fix == FixSafety.APPROXIMATE:
        return "its fix is approximate and --exact-only was given"
    return "the fix could not resolve it"


def change_line(change) -> str:
    """`QDQ401 /Concat [t]: old → new: what was done`; also the HTML fix report's list items."""
    where = " ".join(part for part in (change.node, f"[{change.tensor}]" if change.tensor else "") if part)
    return f"{change.code} {where}: {change.old} → {change.new}: {change.description}"
