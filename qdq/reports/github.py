"""GitHub Actions workflow commands: each finding becomes an annotation on its model file.

`::error file=models/m.onnx,title=QDQ503 asymmetric-zero-point::message`, one line per finding,
escaped as the Actions toolkit does, so a node name with `,`, `:` or a newline cannot end a
property or the command early. Run it as a plain step (no upload needed); the annotations show
on the run and in the pull request's diff.
"""

from __future__ import annotations

from pathlib import Path

from qdq.engine.lint import LintReport, LintResult, Unreadable
from qdq.engine.registry import all_rules
from qdq.reports.text import describe
from qdq.rewrite.rule import Severity

_COMMANDS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    registry = all_rules()
    lines = []
    for model in report.models:
        if isinstance(model, Unreadable):
            lines.append(_command("error", model.model_path, "qdq: cannot read the model", model.error))
            continue
        for finding in model.findings:
            rule = registry.get(finding.code)
            title = f"{finding.code} {rule.name}" if rule else finding.code
            lines.append(_command(_COMMANDS[finding.severity], model.model_path, title, describe(finding)))
        lines += [_command("notice", model.model_path, "qdq note", note) for note in model.notes]
    return "".join(line + "\n" for line in lines)


def _command(kind: str, path: Path, title: str, message: str) -> str:
    return f"::{kind} file={_property(path.as_posix())},title={_property(title)}::{_data(message)}"


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")
