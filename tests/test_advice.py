"""The advice lint gives is what fix does, on real exports (onnxruntime PTQ, PyTorch FX/PT2E, the demo).

- Every finding lint reports with a fix is gone once `fix` has run.
- What still needs calibration data after `fix` without data, lint said needed it (a fix can
  expose a float edge: QDQ805 quantizing a SiLU's Sigmoid leaves the Mul's output to QDQ804).
- A finding that says its fix needs calibration data is still there after `fix` without data:
  if another rule's fix resolves it, that rule reports the problem, once (QDQ204 folding an FX
  ConvBn, QDQ805 quantizing a Sigmoid; before, QDQ801/QDQ804 asked for `--calibrate` there).
- No two findings sit on the same node and tensors where one rule's exact fix resolves the
  other: one root cause, one finding (TensorRT: a uint8 activation was QDQ501 and QDQ505).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qdq.engine.fix import fix
from qdq.engine.lint import identity, lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model
from qdq.rewrite.rule import FixSafety

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted((ROOT / "tests" / "corpus" / "ort").glob("*.onnx")) + sorted(
    (ROOT / "tests" / "corpus" / "torch").glob("*.onnx")
) + [ROOT / "examples" / "models" / "demo_fx_qat.onnx"]
TARGETS = ("ort", "trt", "npu")
CASES = [pytest.param(path, target, id=f"{path.stem}-{target}") for path in MODELS for target in TARGETS]


def test_the_models_are_there():
    assert len(MODELS) > 30 and all(path.is_file() for path in MODELS)


@pytest.mark.parametrize(("path", "target"), CASES)
def test_fix_does_what_lint_says(path, target):
    ruleset = load_target(target)
    before = lint(load_model(path), ruleset).findings
    left = fix(load_model(path), ruleset).result.findings
    after = {identity(f) for f in left}

    announced = {identity(f) for f in before}
    surprises = [f.message for f in left if "--calibrate" in f.message and identity(f) not in announced]
    assert not surprises, f"needs data after fix, but lint did not say so: {surprises[:3]}"
    unresolved = [f.message for f in before if f.fix is not None and identity(f) in after]
    assert not unresolved, f"reported with a fix, still there after fix: {unresolved[:3]}"
    resolved = [f.message for f in before if f.fix is None and "--calibrate" in f.message and identity(f) not in after]
    assert not resolved, f"said to need data, resolved by fix without any: {resolved[:3]}"


@pytest.mark.parametrize(("path", "target"), CASES)
def test_one_finding_per_root_cause(path, target):
    ruleset = load_target(target)
    before = lint(load_model(path), ruleset).findings
    sites: dict[tuple, list] = {}
    for finding in before:
        sites.setdefault((finding.node, finding.tensors), []).append(finding)
    exact = {f.code for group in sites.values() if len({g.code for g in group}) > 1
             for f in group if f.fix == FixSafety.EXACT}
    for code in sorted(exact):
        result = fix(load_model(path), ruleset.narrowed(select=[code]), max_rounds=1)
        # A fix that rewrites stored integers reads them from a new constant: same place, new name.
        replaced = {edit.new: edit.old for edit in result.edits if edit.old and edit.new}
        left = {(f.code, f.node, tuple(replaced.get(t, t) for t in f.tensors))
                for f in lint(result.model, ruleset).findings}
        for group in sites.values():
            if any(f.code == code and f.fix == FixSafety.EXACT for f in group):
                resolved = [f.message for f in group if f.code != code and identity(f) not in left]
                assert not resolved, f"{code}'s exact fix resolves findings at the same place: {resolved[:3]}"


def test_demo_advice_for_ort_is_what_fix_does():
    """The README's demo: lint for onnxruntime lists only what fix then does, rule by rule."""
    path = ROOT / "examples" / "models" / "demo_fx_qat.onnx"
    ruleset = load_target("ort")
    findings = lint(load_model(path), ruleset).findings
    result = fix(load_model(path), ruleset)

    assert all(f.fix is not None for f in findings)
    assert not any("--calibrate" in f.message for f in findings)
    assert {f.code for f in findings} == set(result.by_rule()) == {"QDQ204", "QDQ505", "QDQ507", "QDQ508"}
    assert result.result.findings == []


def test_trt_reports_a_uint8_activation_once_with_its_exact_fix():
    path = ROOT / "tests" / "corpus" / "ort" / "resnet_u8_per_tensor.onnx"
    findings = lint(load_model(path), load_target("trt")).findings
    activations = [f for f in findings if f.code in ("QDQ501", "QDQ505")]

    assert activations and {f.code for f in activations} == {"QDQ505"}
    assert all(f.fix == FixSafety.EXACT and str(f.severity) == "error" for f in activations)
    assert fix(load_model(path), load_target("trt")).result.findings == []
