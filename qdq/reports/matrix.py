"""`qdq lint MODEL --target all`: one model against every shipped target, as one table (or one JSON document).

A row per rule that reports anything on some target, a column per target: how many findings and
their severity there (E, W, I), so what each target needs sits side by side; then each target's
verdict at --fail-on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qdq.engine.lint import LintResult
from qdq.engine.registry import all_rules
from qdq.reports.json import dumps
from qdq.rewrite.rule import Severity

_LETTER = {Severity.ERROR: "E", Severity.WARNING: "W", Severity.INFO: "I"}


def verdict(result: LintResult, fail_on: Severity) -> str:
    """clean (no finding), passes (findings below --fail-on only) or fails."""
    if not result.findings:
        return "clean"
    return "fails" if result.failing(fail_on) else "passes"


def render_text(path: Path, results: dict[str, LintResult], fail_on: Severity) -> str:
    targets = list(results)
    codes = sorted({f.code for result in results.values() for f in result.findings})
    registry = all_rules()
    labels = [f"{code} {registry[code].name}" for code in codes]
    width = max([len(label) for label in labels] + [len(str(path)), len("findings (fixable)")])
    cells = {target: max(len(target), 7) for target in targets}

    def row(label: str, values: list[str]) -> str:
        return f"  {label:<{width}}" + "".join(f"  {v:>{cells[t]}}" for t, v in zip(targets, values))

    lines = [f"{str(path):<{width + 2}}" + "".join(f"  {t:>{cells[t]}}" for t in targets)]
    for code, label in zip(codes, labels):
        lines.append(row(label, [_cell(results[t], code) for t in targets]))
    lines.append(row("findings (fixable)", [f"{len(r.findings)} ({sum(1 for f in r.findings if f.fix)})"
                                             for r in results.values()]))
    lines.append(row(f"at --fail-on {fail_on}", [verdict(r, fail_on) for r in results.values()]))
    notes = dict.fromkeys(note for result in results.values() for note in result.notes)
    lines += [f"note: {note}" for note in notes]
    lines.append(verdict_line(path, results, fail_on) + " (E error, W warning, I info; -: checked, none; "
                 ".: not in that target's rules; `qdq lint MODEL --target NAME` lists one target's findings)")
    return "\n".join(lines) + "\n"


def verdict_line(path: Path, results: dict[str, LintResult], fail_on: Severity) -> str:
    """`model.onnx: clean for common; fails for npu, ort`: the targets grouped by verdict."""
    by_verdict: dict[str, list[str]] = {}
    for target, result in results.items():
        by_verdict.setdefault(verdict(result, fail_on), []).append(target)
    return f"{path}: " + "; ".join(f"{word} for {', '.join(names)}" for word, names in by_verdict.items())


def _cell(result: LintResult, code: str) -> str:
    found = [f for f in result.findings if f.code == code]
    if not found:
        return "-" if code in result.rules_run else "."
    return f"{len(found)}{_LETTER[found[0].severity]}"


def document(models: list[tuple[Path, dict[str, LintResult] | str]], fail_on: Severity) -> str:
    """The JSON report: per model, each target's verdict, counts and findings (or why the model could not be read)."""
    out: list[dict[str, Any]] = []
    for path, results in models:
        if isinstance(results, str):
            out.append({"path": path, "error": results})
            continue
        out.append({"path": path, "targets": {target: {
            "verdict": verdict(result, fail_on),
            "failing": len(result.failing(fail_on)),
            **{str(severity): result.count(severity) for severity in Severity},
            "fixable": sum(1 for f in result.findings if f.fix),
            "rules": {code: sum(1 for f in result.findings if f.code == code)
                      for code in sorted({f.code for f in result.findings})},
            "notes": list(result.notes),
            "findings": [f.to_dict() for f in result.findings],
        } for target, result in results.items()}})
    return dumps({"version": 1, "tool": "qdq", "command": "lint --target all", "fail_on": str(fail_on), "models": out})
