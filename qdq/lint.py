"""Run a rule set over a model and collect the findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qdq.model import Model
from qdq.quant_index import QuantIndex
from qdq.rule import CheckContext, Finding, Severity
from qdq.ruleset import RuleSet


@dataclass
class LintResult:
    """Everything a report needs: the model, the rule set, the findings and plain-language notes."""

    model_path: Path
    ruleset: RuleSet
    findings: list[Finding]
    rules_run: list[str]
    notes: list[str] = field(default_factory=list)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def failing(self, threshold: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity >= threshold]


def lint(model: Model, ruleset: RuleSet) -> LintResult:
    """Check a model against every enabled rule of the set; findings sorted by severity, then code."""
    index = QuantIndex(model)
    findings: list[Finding] = []
    rules_run: list[str] = []
    notes: list[str] = []
    if not index.has_qdq:
        notes.append("the model has no QuantizeLinear or DequantizeLinear nodes: nothing to check")
    else:
        for rule, cfg in ruleset.enabled():
            rules_run.append(rule.code)
            ctx = CheckContext(model=model, index=index, params=cfg.params, severity=cfg.severity)
            findings.extend(rule.check(ctx))
    # Stable sort: a rule's findings on one node stay in the order the rule reported them.
    findings.sort(key=lambda f: (-f.severity, f.code, f.node or ""))
    return LintResult(model.path, ruleset, findings, rules_run, notes)
