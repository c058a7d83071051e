"""Machine-readable JSON report: a stable, versioned document for scripts and dashboards."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any

from qdq.lint import LintResult
from qdq.rule import Severity

SCHEMA_VERSION = 1


def render(result: LintResult, *, fail_on: Severity) -> str:
    document = {
        "version": SCHEMA_VERSION,
        "tool": "qdq",
        "model": str(result.model_path),
        "ruleset": result.ruleset.name,
        "rules_checked": list(result.rules_run),
        "summary": {
            "error": result.count(Severity.ERROR),
            "warning": result.count(Severity.WARNING),
            "info": result.count(Severity.INFO),
            "failing": len(result.failing(fail_on)),
        },
        "notes": list(result.notes),
        "findings": [f.to_dict() for f in result.findings],
    }
    return dumps(document)


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
