"""Only qdq speaks: nothing a library prints lands on stdout among the JSON reports, or anywhere from the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A model of types numpy lacks: onnx-graphsurgeon, which qdq used before, printed warnings on reading it.
FP8 = ROOT / "tests" / "corpus" / "modelopt" / "transformer_fp8.onnx"


def _python(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter with a clean environment: only what it needs to find Python and qdq."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", ""), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_json_report_on_an_fp8_model_is_all_stdout_holds(tmp_path: Path) -> None:
    proc = _python("-m", "qdq", "lint", str(FP8), "--target", "trt", "--format", "json", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)  # all of stdout is the report
    assert [line for line in proc.stderr.splitlines() if not line.startswith("qdq")] == []


def test_the_library_prints_nothing(tmp_path: Path) -> None:
    script = (
        "import onnx, qdq\n"
        f"result = qdq.lint(onnx.load({str(FP8)!r}), target='trt')\n"
        "assert result.findings is not None\n"
    )
    proc = _python("-c", script, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
