"""`lint`, `fix` and `verify` as library calls: the model in whatever form the caller holds, the rules by
target name or as a set.

The engine's `lint` (qdq/engine/lint.py) and `fix` (qdq/engine/fix.py) work on a loaded `Model` and a `RuleSet`, as
the command line has them; these accept a path or an `onnx.ModelProto` too, and a `target=` name.
`verify` gives the verdict `qdq fix` and `qdq verify` give (qdq/verification/verdict.py), on two model files.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

import onnx

from qdq.engine.fix import FixResult
from qdq.engine.fix import fix as fix_model
from qdq.engine.lint import LintResult
from qdq.engine.lint import lint as lint_model
from qdq.engine.ruleset import RuleSet, load_target
from qdq.graph.model import Model, load_model
from qdq.verification.verdict import Criterion, judge
from qdq.verification.verify import VerifyResult

ModelSource = str | os.PathLike | onnx.ModelProto | Model


def lint(model: ModelSource, ruleset: RuleSet | None = None, *, target: str | None = None, **options: Any) -> LintResult:
    """Check `model` against a rule set, given as `ruleset` or by `target` name ("npu", "trt", …).

    Further keyword arguments go to the engine's `lint` (qdq/engine/lint.py).
    """
    return lint_model(as_model(model), _rules(ruleset, target), **options)


def fix(model: ModelSource, ruleset: RuleSet | None = None, *, target: str | None = None, **options: Any) -> FixResult:
    """Rewrite `model` until the rule set's fixes change nothing; the result holds the fixed `model`.

    A loaded `Model` is edited in place (its graph), as the command line does. A path or a
    ModelProto is loaded into a new `Model` first and stays as it was. Further keyword arguments
    (`exact_only`, `max_rounds`, `ranges`) go to the engine's `fix` (qdq/engine/fix.py).
    """
    return fix_model(as_model(model), _rules(ruleset, target), **options)


def verify(reference: str | os.PathLike, candidate: str | os.PathLike, ruleset: RuleSet | None = None, *,
           target: str | None = None, inputs: list[dict] | None = None, seed: int = 0, **gates: Any) -> VerifyResult:
    """Judge `candidate` against `reference` (files) as `qdq verify` does: `result.passed`, and per output
    the distances from the reference's float twin. `inputs`: samples (dicts of arrays by input name),
    else random inputs the model is meant to see from `seed`; `gates`: atol, rtol, min_sqnr."""
    ruleset = _rules(ruleset, target)
    return judge(Path(reference), Path(candidate), ruleset, Criterion.of(ruleset, **gates), inputs,
                 "given" if inputs is not None else "", seed)


def as_model(model: ModelSource) -> Model:
    """A loaded `Model` as it is; a path loaded; a ModelProto loaded through a temporary file.

    qdq reads and checks a model from a file, so a ModelProto is written to a temporary folder that
    lives as long as the `Model` (its path names that file). The ModelProto must hold its weights,
    as `onnx.load` leaves it by default; a model with external data is best passed as its path.
    """
    if isinstance(model, Model):
        return model
    if not isinstance(model, onnx.ModelProto):
        return load_model(model)
    folder = tempfile.TemporaryDirectory(prefix="qdq-")
    path = Path(folder.name) / "model.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_model(path)
    weakref.finalize(loaded, folder.cleanup)
    return loaded


def _rules(ruleset: RuleSet | None, target: str | None) -> RuleSet:
    if (ruleset is None) == (target is None):
        raise TypeError("give a rule set or a target name (such as target='npu'), not both")
    return ruleset if ruleset is not None else load_target(target)
