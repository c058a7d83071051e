"""Machine-readable JSON report: a stable, versioned document for scripts and dashboards.

One document per run, whatever the number of models: `models` lists each model (its summary, its
notes, or why it could not be read) and `findings` is one flat list, each finding naming its model.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any

from qdq.engine.lint import LintReport, LintResult
from qdq.rewrite.rule import Severity

# 2: several models per document (`models`, and `model` on each finding instead of at the top).
SCHEMA_VERSION = 2


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    several = len(report.models) > 1
    document = {
        "version": SCHEMA_VERSION,
        "tool": "qdq",
        "ruleset": report.ruleset.name,
        "rules_checked": report.rules_run,
        "summary": {
            **_counts(report, fail_on),
            "models": len(report.models),
            "unreadable": len(report.unreadable),
            "baselined": report.baselined,
        },
        "models": [
            _model(m, fail_on) if isinstance(m, LintResult) else {"path": m.model_path, "error": m.error}
            for m in report.models
        ],
        "notes": [f"{r.model_path}: {note}" if several else note for r in report.results for note in r.notes],
        "findings": [{"model": r.model_path, **f.to_dict()} for r in report.results for f in r.findings],
    }
    return dumps(document)


def _model(result: LintResult, fail_on: Severity) -> dict[str, Any]:
    return {
        "path": result.model_path,
        "rules_checked": list(result.rules_run),
        "summary": _counts(result, fail_on),
        "notes": list(result.notes),
    }


def _counts(of: LintReport | LintResult, fail_on: Severity) -> dict[str, int]:
    return {
        "error": of.count(Severity.ERROR),
        "warning": of.count(Severity.WARNING),
        "info": of.count(Severity.INFO),
        "failing": len(of.failing(fail_on)),
    }


def dumps(document: Any) -> str:
    """Indented, strictly valid JSON, whatever numpy values or NaNs rules put in finding values."""
    return json.dumps(_plain(document), indent=2, allow_nan=False) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [_plain(v) for v in sorted(value, key=str)]
    if isinstance(value, Enum):
        return str(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": JSON has no such numbers
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, Path):
        return value.as_posix()
    return str(value)
