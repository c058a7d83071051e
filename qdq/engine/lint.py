"""Run a rule set over a model and collect the findings; gather the results of one run over many models."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from qdq.engine.ruleset import RuleConfig, RuleSet
from qdq.graph.model import Model, gc_paused
from qdq.quant.index import QuantIndex
from qdq.rewrite.rule import CheckContext, Finding, Severity
from qdq.support import progress

log = logging.getLogger("qdq")


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

    @property
    def predicts_engine(self) -> bool:
        """True when the rule set says what the target builds for its findings (`effect` keys)."""
        return any(cfg.effect for cfg in self.ruleset.rules.values() if cfg.enabled)

    def predicted_reformats(self) -> int:
        """Conversion layers the target would build because of these findings (rule set's `reformats`).

        Layers named by several findings (a Q after one residual Add is the residual of the next)
        count once.
        """
        named = {name for f in self.findings for name in f.conversions}
        return len(named) + sum(f.reformats for f in self.findings if not f.conversions)


def predict(finding: Finding, cfg: RuleConfig) -> Finding:
    """Attach what the target builds for this finding, from the rule set's `effect` and `reformats`."""
    if cfg.effect:
        values = _Template(node=finding.node or "", **finding.values)
        finding.effect = cfg.effect.format_map(values)
        count = finding.values.get(cfg.reformats, 0) if isinstance(cfg.reformats, str) else cfg.reformats
        if isinstance(count, (list, tuple)):
            finding.conversions = tuple(count)
            count = len(count)
        finding.reformats = int(count)
    return finding


def identity(finding: Finding) -> tuple[str, str | None, tuple[str, ...]]:
    """What makes a finding the same one from run to run: rule, node and tensors, never its wording or values.

    Fingerprints (SARIF, GitLab) and baselines are built on it, so rewording a message moves nothing.
    """
    return finding.code, finding.node, tuple(finding.tensors)


@dataclass
class Unreadable:
    """A model that could not be read: reported, and the run's exit code is 2, but the others are still linted."""

    model_path: Path
    error: str


@dataclass
class LintReport:
    """One `qdq lint` run: the result of every model (or why it could not be read), for one report and one exit code."""

    ruleset: RuleSet
    models: list[LintResult | Unreadable] = field(default_factory=list)
    # Findings left out because the baseline already records them.
    baselined: int = 0

    @classmethod
    def of(cls, run: LintResult | LintReport) -> LintReport:
        """What a report writer renders: a whole run, or one model's result as a run of one."""
        return run if isinstance(run, LintReport) else cls(run.ruleset, [run])

    @property
    def results(self) -> list[LintResult]:
        return [m for m in self.models if isinstance(m, LintResult)]

    @property
    def unreadable(self) -> list[Unreadable]:
        return [m for m in self.models if isinstance(m, Unreadable)]

    @property
    def findings(self) -> list[Finding]:
        return [f for result in self.results for f in result.findings]

    @property
    def rules_run(self) -> list[str]:
        """Every rule that ran on at least one model, in order (a model without Q/DQ runs none)."""
        return list(dict.fromkeys(code for result in self.results for code in result.rules_run))

    def count(self, severity: Severity) -> int:
        return sum(result.count(severity) for result in self.results)

    def failing(self, threshold: Severity) -> list[Finding]:
        return [f for result in self.results for f in result.failing(threshold)]


class _Template(dict):
    """Format values that leave a placeholder the finding does not have as it is."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def lint(
    model: Model,
    ruleset: RuleSet,
    ranges: dict[str, tuple[float, float]] | None = None,
    checked: dict[str, list[Finding]] | None = None,
    index: QuantIndex | None = None,
) -> LintResult:
    """Check a model against every enabled rule of the set; findings sorted by severity, then code.

    With measured `ranges` (calibration), findings whose fix needs data are reported as fixable.
    `checked` holds findings of rules already run on this very graph (by code), which are not run again;
    `index` is this very graph's quantization index when the caller has one (building it costs seconds at 100k nodes).
    """
    findings: list[Finding] = []
    rules_run: list[str] = []
    notes = list(model.notes)  # what reading the file repaired or tolerated
    # The rules allocate many small objects next to a graph of millions; with the cyclic
    # collector on, its full passes over the graph took a quarter of lint time at 100k nodes.
    with gc_paused():
        if index is None:
            progress.step("indexing the Q/DQ nodes")
            index = QuantIndex(model)
        notes += _shared_name_notes(model)
        enabled = [(rule, cfg) for rule, cfg in ruleset.enabled() if index.has_qdq or rule.runs_without_qdq]
        codes = ruleset.enabled_codes()
        for number, (rule, cfg) in enumerate(enabled, 1):
            progress.step(f"checking {rule.code} {rule.name} ({number}/{len(enabled)})")
            rules_run.append(rule.code)
            ctx = CheckContext(model=model, index=index, params=cfg.params, severity=cfg.severity, ranges=ranges,
                               enabled=codes)
            known = checked.get(rule.code) if checked else None
            start, before = time.perf_counter(), len(findings)
            findings.extend(predict(finding, cfg) for finding in (rule.check(ctx) if known is None else known))
            log.debug("%s %s: %d finding(s) in %.1f ms", rule.code, rule.name, len(findings) - before,
                      1000 * (time.perf_counter() - start))
            assumed = rule.assumption(ctx)
            if assumed:
                notes.append(assumed)
        # Stable sort: a rule's findings on one node stay in the order the rule reported them.
        findings.sort(key=lambda f: (-f.severity, f.code, f.node or ""))
    if not index.has_qdq:
        notes.append(_no_qdq_note(findings))
    return LintResult(model.path, ruleset, findings, rules_run, notes)


def _no_qdq_note(findings: list[Finding]) -> str:
    """A model without Q/DQ: nothing to check, unless it quantizes otherwise (QDQ006's finding says how)."""
    if any(f.code == "QDQ006" for f in findings):
        return "the model has no QuantizeLinear or DequantizeLinear nodes"
    return "the model has no QuantizeLinear or DequantizeLinear nodes: nothing to check"


def _shared_name_notes(model: Model) -> list[str]:
    """Node names used twice (graph surgery leaves them): the checker accepts them, onnxruntime does not."""
    counts = Counter(node.name for node in model.graph.nodes if node.name)
    shared = sorted(name for name, count in counts.items() if count > 1)
    if not shared:
        return []
    named = ", ".join(repr(name) for name in shared[:3]) + (", ..." if len(shared) > 3 else "")
    return [f"{len(shared)} node name(s) used more than once ({named}): onnxruntime refuses the model, "
            "and findings on those nodes cannot be told apart"]
