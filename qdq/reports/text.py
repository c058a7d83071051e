"""Human-readable terminal report: one line per finding, each led by its model's path, then a one-line summary."""

from __future__ import annotations

from qdq.engine.lint import LintReport, LintResult
from qdq.rewrite.rule import Finding, FixSafety, Severity


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    several = len(report.models) > 1
    lines = []
    for result in report.results:
        model = str(result.model_path)
        # Most severe first, then by rule, so findings of one rule sit together.
        for finding in sorted(result.findings, key=lambda f: (-f.severity, f.code, f.node or "")):
            lines.append(finding_line(model, finding))
            if finding.effect:
                lines.append(f"    -> {finding.effect}")
        lines += [f"note: {model}: {note}" if several else f"note: {note}" for note in result.notes]
    lines += _by_rule(report.findings)
    predicts_engine = any(result.predicts_engine for result in report.results)
    if predicts_engine and report.findings:
        reformats = sum(result.predicted_reformats() for result in report.results)
        lines.append(f"Predicted: {_plural(reformats, 'conversion layer')} caused by Q/DQ placement "
                     f"(standalone Q/DQ, requantize or reformat layers; rule set '{report.ruleset.name}')")
    lines.append(summary_line(report, fail_on))
    return "\n".join(lines) + "\n"


def finding_line(model: str, finding: Finding) -> str:
    """`model.onnx: QDQ011 [warning] node: message (fix: exact)`; also used by the JUnit writer."""
    return f"{model}: {finding.code} [{finding.severity}] {describe(finding)}"


def describe(finding: Finding) -> str:
    """`node: message (fix: exact)`: the node only where the message does not already name it."""
    where = f"{finding.node}: " if finding.node and finding.node not in finding.message else ""
    fix = f" (fix: {finding.fix})" if finding.fix else ""
    return f"{where}{finding.message}{fix}"


def summary_line(report: LintReport, fail_on: Severity) -> str:
    """`Found 3 findings (2 errors, 1 warning) in model.onnx with rule set 'trt'` and what fails; also the HTML title."""
    results, findings = report.results, report.findings
    ruleset = report.ruleset.name
    single = str(results[0].model_path) if len(report.models) == 1 and results else None
    if not findings:
        who = f"{single}: clean" if single else f"{_plural(len(results), 'model')} clean"
        line = f"{who} ({_plural(len(report.rules_run), 'rule')} checked, rule set '{ruleset}')"
    else:
        counts = ", ".join(
            _plural(report.count(sev), str(sev)) for sev in sorted(Severity, reverse=True) if report.count(sev)
        )
        flagged = sum(1 for result in results if result.findings)
        where = single or f"{flagged} of {_plural(len(results), 'model')}"
        line = f"Found {_plural(len(findings), 'finding')} ({counts}) in {where} with rule set '{ruleset}'"
        fixable = [f for f in findings if f.fix]
        if fixable:
            approximate = sum(1 for f in fixable if f.fix == FixSafety.APPROXIMATE)
            line += f"; {len(fixable)} with an automatic fix"
            if approximate:
                line += f" ({approximate} approximate)"
        # Say why the exit code is 0 when every finding is below the threshold.
        if not report.failing(fail_on):
            line += f"; none at or above --fail-on {fail_on}"
    if report.baselined:
        line += f"; {_plural(report.baselined, 'finding')} suppressed by the baseline"
    if report.unreadable:
        line += f"; {_plural(len(report.unreadable), 'model')} could not be read"
    return line


def _by_rule(findings: list[Finding]) -> list[str]:
    """A count per rule, so a long report still shows at a glance what kind of problem it is."""
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    if len(findings) < 2:
        return []
    return ["By rule: " + ", ".join(f"{code} x{n}" for code, n in sorted(counts.items()))]


def _plural(n: int, noun: str) -> str:
    # "info" is a mass noun: 2 info, not 2 infos.
    return f"{n} {noun}" if n == 1 or noun == "info" else f"{n} {noun}s"
