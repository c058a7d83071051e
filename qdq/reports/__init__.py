"""Report writers for `qdq lint`: one module per output format, chosen with `--format`.

May import: support, graph, quant, rewrite, checks, engine, verification, trt.
"""

from __future__ import annotations

from qdq.engine.lint import LintReport, LintResult
from qdq.reports import github, gitlab, html, json, junit, sarif, text
from qdq.rewrite.rule import Severity

_WRITERS = {
    "text": text.render,
    "json": json.render,
    "sarif": sarif.render,
    "junit": junit.render,
    "github": github.render,
    "gitlab": gitlab.render,
    "html": html.render,
}
FORMATS = tuple(_WRITERS)


def render(run: LintResult | LintReport, fmt: str, *, fail_on: Severity) -> str:
    """The report of a run (or of one model's result) in format `fmt`, newline-terminated, ready to write as is."""
    if fmt not in _WRITERS:
        raise ValueError(f"unknown report format {fmt!r} (use {', '.join(FORMATS)})")
    return _WRITERS[fmt](run, fail_on=fail_on)
