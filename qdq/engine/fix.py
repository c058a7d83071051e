"""The fix driver every target shares: apply the rule set's fixes in its order until nothing changes.

Fixes interact: aligning a Concat moves its producers' output scales, which can break those
layers' NPU shift limits, whose repair moves a weight, which moves an int32 bias. So the driver
runs the whole sequence (the rule set's `fix-order`, the NPU catalogue's pass order for `npu`)
in rounds until a round changes nothing, counting every change (unlike the reference tool,
which stops after five rounds with a warning, defect D6). It then lints the result with the
same rule set, so what is left is reported, never assumed fixed.

Fixes change the graph through an `EditLog`; what a rule's log holds decides what follows it: a
structural edit, a tidy and a new index; only constants swapped, nothing until the end of the
round (the Q/DQ nodes whose parameters moved are re-read as the fixes swap them).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from qdq.checks.coverage import describe, unread_ops
from qdq.engine.lint import LintResult, lint
from qdq.engine.ruleset import RuleSet
from qdq.graph.model import Model, gc_paused
from qdq.graph.names import Names
from qdq.graph.tidy import tidy
from qdq.quant.index import QuantIndex
from qdq.rewrite.edits import EditLog, EditRecord
from qdq.rewrite.rule import Change, CheckContext, Finding, FixContext, FixSafety, Rule, ScaleCeilings
from qdq.support import progress
from qdq.support.errors import InvalidOutputError, QdqError

log = logging.getLogger("qdq")

DEFAULT_MAX_ROUNDS = 10


@dataclass
class FixResult:
    """What `fix` did: every change, how many rounds it took, and the lint of the result."""

    changes: list[Change]
    rounds: int
    converged: bool
    max_rounds: int
    result: LintResult
    # Codes that still changed something in the last round when the round limit was hit.
    still_changing: list[str] = field(default_factory=list)
    exact_only: bool = False
    # The model the fixes edited, ready for `save_model`.
    model: Model | None = field(default=None, repr=False)
    # Every graph edit, in the order the fixes made them, round after round.
    edits: list[EditRecord] = field(default_factory=list, repr=False)

    def by_rule(self) -> dict[str, int]:
        """How many changes each rule made (a tensor moved twice counts twice)."""
        return dict(sorted(Counter(c.code for c in self.changes).items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "converged": self.converged,
            "max_rounds": self.max_rounds,
            "exact_only": self.exact_only,
            "still_changing": self.still_changing,
            "changes_by_rule": self.by_rule(),
            "changes": [c.to_dict() for c in self.changes],
            "remaining": [f.to_dict() for f in self.result.findings],
            "edits_by_kind": dict(sorted(Counter(e.kind for e in self.edits).items())),
        }


def _fix_one(rule: Rule, finding: Finding, ctx: FixContext) -> list[Change]:
    """The changes one fix made; a fix that edits the graph without reporting a change is a bug in qdq.

    The driver would count such a round as converged and the report would not show the edit: qdq
    never changes a model silently, so it stops instead, and nothing is written.
    """
    edits_before = len(ctx.edits.records)
    changes = rule.fix(ctx, finding)
    if len(ctx.edits.records) > edits_before and not changes:
        raise InvalidOutputError(f"{ctx.model.path}: not fixed: {rule.code} changed the graph at {finding.node} without "
                                 "reporting a change; this is a bug in qdq, please report it")
    return changes


def fix(
    model: Model,
    ruleset: RuleSet,
    exact_only: bool = False,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    ranges: dict[str, tuple[float, float]] | None = None,
) -> FixResult:
    """Rewrite `model.graph` in place until the rule set's fixes change nothing (or `max_rounds`).

    `ranges` are measured (min, max) per float tensor (`qdq.quant.calibrate.tensor_ranges`), for fixes
    that need a scale the graph does not have. A model that quantizes with ops qdq does not read
    (QDQ006's quantizers) is refused: qdq would write a model whose quantization it never checked.
    """
    _refuse_unread(model, ruleset)
    with gc_paused():  # see lint(): the collector's passes over a large graph cost more than the fixes
        return _fix(model, ruleset, exact_only, max_rounds, ranges)


def _refuse_unread(model: Model, ruleset: RuleSet) -> None:
    quantizers, _ = unread_ops(model.graph.nodes, ruleset.params_of("QDQ006"))
    if quantizers:
        raise QdqError(f"{model.path}: quantized with ops qdq does not read ({describe(quantizers)}); nothing written: export "
                       "QuantizeLinear/DequantizeLinear (QCDQ) instead, e.g. Brevitas export_onnx_qcdq or QONNX's "
                       "QuantToQCDQ transformation (`qdq explain QDQ006`)")


def _fix(
    model: Model,
    ruleset: RuleSet,
    exact_only: bool,
    max_rounds: int,
    ranges: dict[str, tuple[float, float]] | None,
) -> FixResult:
    sequence = [
        (rule, cfg) for rule, cfg in ruleset.fix_sequence() if not exact_only or rule.fix_safety == FixSafety.EXACT
    ]
    names, ceilings = Names(model.graph), ScaleCeilings()
    codes = ruleset.enabled_codes()  # as the final lint has them
    changes: list[Change] = []
    edits: list[EditRecord] = []
    converged, rounds, last_round = False, 0, []
    found: dict[str, list[Finding]] = {}
    index: QuantIndex | None = None
    while rounds < max_rounds:
        rounds += 1
        last_round, found = [], {}
        # A fresh index on a tidy graph each round, and checks with lint's context: a round that
        # changes nothing has checked exactly what the final lint would, which then reuses it.
        index = None
        untidy = False  # edits since the last tidy (a constant swapped out can leave the nodes that made it unused)
        for number, (rule, cfg) in enumerate(sequence, 1):
            doing = f"fixing, round {rounds}: {rule.code} {rule.name} ({number}/{len(sequence)})"
            progress.step(doing)
            index = index or QuantIndex(model)
            if not index.has_qdq:
                break
            # Q/DQ nodes whose parameters a fix swaps are re-read at once: later fixes read them.
            journal = EditLog(model.graph, on_params=index.refresh)
            check_ctx = CheckContext(model=model, index=index, params=cfg.params, severity=cfg.severity, ranges=ranges,
                                     enabled=codes)
            fix_ctx = FixContext(model=model, index=index, params=cfg.params, severity=cfg.severity, ranges=ranges,
                                 enabled=codes, edits=journal, names=names, ceilings=ceilings)
            found[rule.code] = list(rule.check(check_ctx))
            made: list[Change] = []
            for finding in progress.each(found[rule.code], doing, every=200):
                if finding.fix is not None:
                    made += _fix_one(rule, finding, fix_ctx)
            if made:
                log.info("round %d: %s changed %d value(s)", rounds, rule.code, len(made))
            if journal.structural:
                tidy(model.graph)
                index, untidy = None, False
            elif journal.records:
                untidy = True
            edits += journal.records
            last_round += made
        changes += last_round
        if not last_round:
            converged = True
            break
        if untidy:
            tidy(model.graph)  # drop the nodes the fixes left unused
    still = sorted({c.code for c in last_round}) if not converged else []
    # A round that changed nothing checked exactly this graph: the final lint reuses its findings and index.
    result = lint(model, ruleset, ranges, checked=found if converged else None, index=index if converged else None)
    return FixResult(changes, rounds, converged, max_rounds, result, still, exact_only, model, edits)
