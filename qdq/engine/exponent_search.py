"""Choose power-of-two positions on data: a greedy search that moves one value's position at a time.

The rule-driven fix picks each position from its own tensor (QDQ504 rounds the old scale), but
the position that is best for the model's outputs depends on everything downstream of it. With
`qdq fix --calibrate` and a rule set whose `[search] exponents = "greedy"`, the converged model is
refined: each activation's and weight's position is tried one step finer and one coarser; the fix
driver then restores every constraint the move broke (an int32 bias follows its weight, a Concat
re-aligns, a shift limit pulls a neighbour along), and the move is kept when the result is still
lint-clean, its outputs on the calibration samples are closer to the objective's, and the gain is
one most samples share (a paired test over the samples): a move that helps only one or two
samples fits them and, measured on samples held out, does not carry over.

The objective is the input's float twin (`qdq.verification.twin`), which the verdict and the user
judge the fix by: aiming at the input model's own outputs copies its quantization error (on the
corpus's FX QAT exports the twin objective ends 1-23 % closer to the twin on the samples). It fits
those samples: held out, or judged on random inputs, it does not always carry over
(docs/benchmarks.md). Where the twin cannot be built the input model stands in, and the log and
every chosen move say which. Every candidate costs a fix and, if it stays lint-clean, one
onnxruntime run per sample; `budget` bounds how many candidates are tried.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import onnx

from qdq.engine.fix import FixResult, fix
from qdq.engine.ruleset import RuleSet
from qdq.graph.model import Model, to_proto
from qdq.graph.names import Names
from qdq.quant.index import QuantIndex
from qdq.quant.operands import ACTIVATION, WEIGHT, pos_of, role
from qdq.rewrite.edits import EditLog
from qdq.rewrite.requantize import set_params
from qdq.rewrite.rule import Change, CheckContext, FixContext, Severity
from qdq.support import progress
from qdq.support.errors import RuleSetError

log = logging.getLogger("qdq")

DEFAULT_BUDGET = 200
# Moves are attributed to the rule that chooses power-of-two positions.
CODE = "QDQ504"


@dataclasses.dataclass(frozen=True)
class Objective:
    """The model whose outputs on the calibration samples the search moves towards, and what it is."""

    model: onnx.ModelProto
    what: str  # "the float twin" or "the input model", as the log and the changes say it
    reason: str = ""  # why the input model stands in: the twin could not be built


def search_settings(ruleset: RuleSet) -> tuple[bool, int]:
    """(search on?, budget in evaluations) from the rule set's [search] table."""
    unknown = set(ruleset.search) - {"exponents", "budget"}
    if unknown:
        raise RuleSetError(f"[search] has unknown key(s) {', '.join(sorted(unknown))}")
    method = ruleset.search.get("exponents", "none")
    budget = ruleset.search.get("budget", DEFAULT_BUDGET)
    if method not in ("none", "greedy"):
        raise RuleSetError(f"[search] exponents must be \"none\" or \"greedy\", got {method!r}")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise RuleSetError(f"[search] budget must be a whole number >= 0, got {budget!r}")
    return method == "greedy", budget


def search_exponents(
    model: Model,
    objective: Objective,
    samples: list[dict[str, np.ndarray]],
    ruleset: RuleSet,
    fixed: FixResult,
    ranges: dict[str, tuple[float, float]] | None = None,
    budget: int = DEFAULT_BUDGET,
) -> FixResult:
    """Refine `model` (the converged result `fixed` of `fix`) in place; its changes and lint extended.

    Moves are kept when they bring the outputs on `samples` (feeds) closer to `objective`'s.
    """
    if model.uses_external_data:  # candidates are run from memory, where external data cannot be found
        log.warning("exponent search skipped: the model keeps its weights in external data files")
        return fixed
    wanted = _outputs(objective.model.SerializeToString(), samples)
    allowed, result = _finding_keys(fixed), fixed.result
    best, best_each = _error(model, samples, wanted)
    log.info("exponent search: aiming at %s%s; output rel L2 from it %.4g before", objective.what,
             f" ({objective.reason})" if objective.reason else "", best)
    changes, edits, evaluations, improved = list(fixed.changes), list(fixed.edits), 0, True
    while improved and evaluations < budget:
        improved = False
        for name in _movable(model):
            for step in (1, -1):  # one position finer, then one coarser
                if evaluations >= budget:
                    break
                progress.step(f"choosing positions on data: {evaluations + 1}/{budget} (rel L2 {best:.4g})")
                candidate = dataclasses.replace(model, graph=model.graph.copy())
                journal = EditLog(candidate.graph)
                moved = _move(candidate, name, step, journal)
                if not moved:
                    continue
                evaluations += 1  # every candidate costs a fix; the rejected ones too
                refixed = fix(candidate, ruleset, ranges=ranges)
                if not refixed.converged or not _finding_keys(refixed) <= allowed:
                    continue
                error, each = _error(candidate, samples, wanted)
                if error < best and _shared(best_each - each):
                    moved[0].description += (f"; chosen on data: output rel L2 from {objective.what} "
                                             f"{best:.4g} → {error:.4g}")
                    moved[0].values["gain"] = best - error
                    changes += moved + refixed.changes
                    edits += journal.records + refixed.edits
                    best, best_each, model.graph, result = error, each, candidate.graph, refixed.result
                    improved = True
                    break
    log.info("exponent search: %d evaluation(s), output rel L2 from %s %.4g after", evaluations, objective.what, best)
    return dataclasses.replace(fixed, changes=changes, result=result, edits=edits)


def _movable(model: Model) -> list[str]:
    """Names of the per-tensor power-of-two activations and weights, in graph order."""
    index = QuantIndex(model)
    ctx = CheckContext(model=model, index=index, params={}, severity=Severity.ERROR)
    return [ctx.value_name(qt) for qt in index.qtensors
            if qt.nodes and pos_of(index, qt) is not None and role(index, qt) in (ACTIVATION, WEIGHT)]


def _move(model: Model, name: str, step: int, edits: EditLog) -> list[Change]:
    """Move value `name` by `step` positions (finer when positive), through `edits`; no change when it is gone."""
    index = QuantIndex(model)
    ctx = FixContext(model=model, index=index, params={}, severity=Severity.ERROR, edits=edits,
                     names=Names(model.graph))
    for qt in index.qtensors:
        if qt.nodes and ctx.value_name(qt) == name:
            pos = pos_of(index, qt)
            if pos is None:
                return []
            return set_params(ctx, qt, 2.0 ** -(pos + step), CODE, f"position {pos} → {pos + step}")
    return []


def _finding_keys(fixed: FixResult) -> set[tuple]:
    """What is left to report at warning or above: a move may not add to it."""
    return {(f.code, f.node, f.tensors) for f in fixed.result.failing(Severity.WARNING)}


def _shared(gains: np.ndarray) -> bool:
    """Whether a gain (per sample, in squared error) is one the samples share: its mean at least twice
    its standard error. Fewer than 4 samples cannot tell, and any gain counts."""
    if len(gains) < 4:
        return True
    return float(gains.mean()) > 2 * float(gains.std(ddof=1)) / np.sqrt(len(gains))


def _error(model: Model, samples: list[dict[str, np.ndarray]], wanted: list[list[np.ndarray]]) -> tuple[float, np.ndarray]:
    """Relative L2 distance of the model's outputs from `wanted` over every output and sample, and each
    sample's squared error."""
    got = _outputs(to_proto(model).SerializeToString(), samples)
    each = np.concatenate([_squared_errors(feeds, gs, ws) for feeds, gs, ws in zip(samples, got, wanted)])
    norm = sum(float(np.sum(w.astype(np.float64) ** 2)) for ws in wanted for w in ws)
    return float(np.sqrt(each.sum() / norm)) if norm else float(np.sqrt(each.sum())), each


def _squared_errors(feeds: dict[str, np.ndarray], got: list[np.ndarray], wanted: list[np.ndarray]) -> np.ndarray:
    """Squared error per sample of one run: per row of axis 0 when the feed holds N samples there (a
    dynamic batch, `load_samples`) and every output has N rows, else one figure for the run."""
    sizes = {value.shape[0] if value.ndim else 1 for value in feeds.values()}
    rows = sizes.pop() if len(sizes) == 1 else 1
    squares = [(g.astype(np.float64) - w.astype(np.float64)) ** 2 for g, w in zip(got, wanted)]
    if rows > 1 and all(s.ndim and s.shape[0] == rows for s in squares):
        return sum(s.reshape(rows, -1).sum(axis=1) for s in squares)
    return np.array([sum(float(s.sum()) for s in squares)])


def _outputs(model: bytes, samples: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of the serialised `model` on each sample, in onnxruntime without graph optimisations."""
    from qdq.support.runtime import session as new_session  # imported here: linting never needs onnxruntime

    session = new_session(model)
    names = [i.name for i in session.get_inputs()]
    return [[np.asarray(v) for v in session.run(None, {n: feeds[n] for n in names})] for feeds in samples]
