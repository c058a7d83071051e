"""examples/end_to_end.py at a reduced size: the pipeline runs, every fix is lint-clean, scale feedback closes the loop.

A few training batches on a subset of the data: enough for BatchNorm statistics and learned
thresholds, not for accuracy (the README's table is a full default run).
"""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import pytest
from optional import torch_or_skip

torch = torch_or_skip()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import end_to_end  # noqa: E402

from qdq import lint, load_model, load_target  # noqa: E402
from qdq.quant.index import QuantIndex  # noqa: E402
from qdq.rewrite.rule import Severity  # noqa: E402

ROWS = ["float", "QAT export", "npu fix", "trt fix", "ort fix", "feedback + npu fix"]
SMALL = end_to_end.Settings(epochs=1, qat_steps=12, finetune_steps=6, train_limit=256, test_limit=64, latency_runs=3)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The pipeline's report and folder; what it said on stderr is in STAGES."""
    out = tmp_path_factory.mktemp("e2e")
    said = io.StringIO()
    with redirect_stderr(said):
        report = end_to_end.run(SMALL, out)
    STAGES[:] = said.getvalue().splitlines()
    return report, out


STAGES: list[str] = []


def test_the_run_says_which_stage_it_is_in(pipeline):
    """A default run takes minutes: each stage is announced with the time so far, not a silent wait."""
    assert len(STAGES) == 7 and all(line.startswith("[") and " s] " in line for line in STAGES)
    assert "training the float network" in STAGES[0] and "latency" in STAGES[-1]


def test_table_has_one_row_per_stage_and_every_column(pipeline):
    report, _ = pipeline
    assert [row.name for row in report.rows] == ROWS
    lines = end_to_end.table(report).splitlines()
    assert len(lines) == 2 + len(ROWS)
    assert all(line.count("|") == 9 for line in lines)
    for row in report.rows:
        assert 0.0 <= row.accuracy <= 1.0 and 0.0 <= row.accuracy_as_written <= 1.0 and row.latency_ms > 0
    assert set(report.row("QAT export").findings) == {"npu", "trt", "ort"}
    for row in report.rows[2:]:
        assert row.findings_before > 0 and row.changes > 0 and row.verified


@pytest.mark.parametrize("target", end_to_end.TARGETS)
def test_every_fixed_model_is_lint_clean_for_its_target(pipeline, target):
    report, out = pipeline
    assert report.row(f"{target} fix").clean and report.row("feedback + npu fix").clean
    for path in [out / f"qat_{target}.onnx"] + ([out / "finetuned_npu.onnx"] if target == "npu" else []):
        assert lint(load_model(path), load_target(target)).failing(Severity.WARNING) == []


def test_load_scales_matched_every_fake_quant(pipeline):
    report, _ = pipeline
    assert report.scales_loaded == report.fake_quants > 0
    assert report.unmatched == [] and report.load_problems == []


def test_reexport_after_feedback_carries_the_npu_fixed_scales(pipeline):
    """Fine-tuning with the loaded (frozen) scales moves weights only: the second npu fix moves no scale.

    Its only approximate changes are the FX export's float biases, which QDQ610 stores as int32."""
    report, out = pipeline
    fixed, again = _q_scales(out / "qat_npu.onnx"), _q_scales(out / "finetuned.onnx")
    assert again and set(again) <= set(fixed)
    assert {name: fixed[name] for name in again} == again
    float_biases = lint(load_model(out / "finetuned.onnx"), load_target("npu").narrowed(select=["QDQ610"])).findings
    assert report.row("feedback + npu fix").approximate_changes == len(float_biases) > 0


def _q_scales(path: Path) -> dict[str, float]:
    index = QuantIndex(load_model(path))
    scales = {}
    for node in index.quantizes:
        scale = index.params(node).scale
        if scale is not None:
            scales[node.name] = float(np.asarray(scale).ravel()[0])
    return scales
