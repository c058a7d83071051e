"""Report writers for `qdq lint`: one module per output format, chosen with `--format`."""

from __future__ import annotations

from qdq.lint import LintResult
from qdq.reports import json, junit, sarif, text
from qdq.rule import Severity

FORMATS = ("text", "json", "sarif", "junit")

_WRITERS = {"text": text.render, "json": json.render, "sarif": sarif.render, "junit": junit.render}


def render(result: LintResult, fmt: str, *, fail_on: Severity) -> str:
    """The report of `result` in format `fmt`, newline-terminated, ready to write as is."""
    if fmt not in _WRITERS:
        raise ValueError(f"unknown report format {fmt!r} (use {', '.join(FORMATS)})")
    return _WRITERS[fmt](result, fail_on=fail_on)
