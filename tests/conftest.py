"""Shared fixtures: build a model, lint it, apply a rule's fix, run it in onnxruntime."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).parent))
# QDQ508 (ort) judges weights for the CPU it runs on ("auto"); the tests expect x86 without VNNI on
# every machine, this process's and the qdq processes it starts alike (tests of the detection unset it).
os.environ["QDQ_CPU"] = "x86-avx2"

from builders import GraphBuilder  # noqa: E402

from qdq.engine.fix import fix  # noqa: E402
from qdq.engine.lint import lint  # noqa: E402
from qdq.engine.ruleset import RuleSet, load_target  # noqa: E402
from qdq.graph.model import Model, load_model, save_model  # noqa: E402
from qdq.quant.cpu import this_cpu  # noqa: E402


@pytest.fixture
def builder() -> GraphBuilder:
    return GraphBuilder()


@pytest.fixture(autouse=True)
def _draws_independent_of_test_order(request):
    """A test module's shared generator (`RNG`) starts afresh for every test, so what a test draws
    does not depend on which tests ran before it on the same xdist worker."""
    if isinstance(getattr(request.module, "RNG", None), np.random.Generator):
        request.module.RNG = np.random.default_rng(0)


@pytest.fixture(params=["checker in process", "checker in a second process"])
def checker_placements(request, monkeypatch) -> str:
    """Run a test twice: with the ONNX checker in process, and in a child beside the import as on large models."""
    if request.param == "checker in a second process":
        from qdq.graph import checker_process
        monkeypatch.setattr(checker_process, "MIN_NODES", 0)
    return request.param


def lint_codes(model: Model, target: str = "common") -> list[str]:
    """The codes of all findings, in report order."""
    return [f.code for f in lint(model, load_target(target)).findings]


def findings_of(model: Model, code: str, target: str = "common"):
    return [f for f in lint(model, load_target(target).narrowed(select=[code])).findings]


def apply_fix(model: Model, code: str, target: str | RuleSet = "common") -> list:
    """Apply one rule's fix to every fixable finding once, through the `qdq fix` driver."""
    ruleset = load_target(target) if isinstance(target, str) else target
    return fix(model, ruleset.narrowed(select=[code]), max_rounds=1).changes


def ort_session(path: Path, optimized: bool = False) -> ort.InferenceSession:
    """onnxruntime's session of a file: with graph optimisations off, so what runs is exactly what the file
    says, or with every one on, as users run it (fused integer kernels). Build it once for many runs."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else \
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized:
        options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run with graph optimisations off, so what runs is exactly what the file says."""
    return ort_session(path).run(None, feeds)


def run_optimized(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run as users do, with every graph optimisation on (fused integer kernels)."""
    return ort_session(path, optimized=True).run(None, feeds)


def saturation_not_shown() -> str | None:
    """Why onnxruntime's u8×s8 kernels would not saturate on this CPU, or None where they do (x86 AVX2, no VNNI)."""
    machine = this_cpu()
    if not machine.saturates:
        return f"{machine.why}: onnxruntime sums u8×s8 products without 16-bit saturation"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86: its u8×s8 kernels do not use pmaddubsw"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "no /proc/cpuinfo to read the CPU flags from"
    if "avx2" not in flags:
        return "no AVX2: onnxruntime takes another u8×s8 kernel"
    return None


def fix_roundtrip(path: Path, code: str, tmp_path: Path, feeds: dict[str, np.ndarray]):
    """Fix one rule on the model at `path`; return (changes, fixed model, outputs before, outputs after)."""
    before = run_ort(path, feeds)
    model = load_model(path)
    changes = apply_fix(model, code)
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    after = run_ort(out, feeds)
    return changes, load_model(out), before, after


# --- the conformance matrix (tests/test_conformance.py) ----------------------------------------------

_CONFORMANCE: dict[str, dict[str, str]] = {}


@pytest.fixture
def conformance_cell(request) -> dict[str, str]:
    """One matrix cell ({"model", "target", "outcome"}), which the test fills in; it reaches the
    summary through the test's report, so it arrives from pytest-xdist's workers too."""
    cell = {"outcome": "FAIL"}  # a run that breaks an invariant stays "FAIL"
    yield cell
    request.node.user_properties.append(("conformance", dict(cell)))


def pytest_runtest_logreport(report) -> None:
    if report.when != "teardown":
        return
    for key, cell in report.user_properties:
        if key == "conformance":
            _CONFORMANCE.setdefault(cell["model"], {})[cell["target"]] = cell["outcome"]


def pytest_terminal_summary(terminalreporter) -> None:
    if not _CONFORMANCE:
        return
    targets = sorted({t for row in _CONFORMANCE.values() for t in row})
    width = max(len(name) for name in _CONFORMANCE)
    write = terminalreporter.write_line
    write("")
    write(f"conformance matrix ({len(_CONFORMANCE)} models)")
    write(f"{'model':<{width}}  " + "  ".join(f"{t:<26}" for t in targets))
    for name in sorted(_CONFORMANCE):
        write(f"{name:<{width}}  " + "  ".join(f"{_CONFORMANCE[name].get(t, '-'):<26}" for t in targets))
    cells = [v for row in _CONFORMANCE.values() for v in row.values()]
    counts = {outcome: cells.count(outcome) for outcome in sorted(set(cells))}
    held = len(cells) - counts.get("FAIL", 0)
    write(f"invariants held in {held}/{len(cells)} runs; " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
