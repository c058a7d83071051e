"""The command line as a CI job uses it: exit codes, report formats, rule selection, config, subcommands.

Every command goes through `run`, which also checks that the model file is byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import re
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from builders import GraphBuilder

import cli
from qdq import __version__
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import load_target
from qdq.reports import FORMATS

REPO = Path(cli.__file__).resolve().parent
COMMON_CODES = sorted(load_target("common").rules)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(capsys: pytest.CaptureFixture, *argv: object, model: Path | None = None) -> tuple[int, str, str]:
    """`qdq argv`, returning (exit code, stdout, stderr); the model must not change."""
    before = sha(model) if model else None
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    if model:
        assert sha(model) == before, "qdq modified its input model"
    return code, out, err


def lint_json(capsys, model: Path, *options: object) -> tuple[int, dict]:
    code, out, err = run(capsys, "lint", model, "--format", "json", *options, model=model)
    assert err == ""
    return code, json.loads(out)


def codes(report: dict) -> list[str]:
    return sorted({f["code"] for f in report["findings"]})


def build(path: Path, warning: bool = False, info: bool = False, error: bool = False) -> Path:
    """A clean Conv QDQ model, plus a chosen mix of findings.

    warning: the output pair has [1]-shaped qparams (QDQ201, warning, 2 findings: one per Q and DQ);
    info: the input pair reads its zero-point through an Identity (QDQ202, info, 2 findings);
    error: the weight's DQ has a zero scale (QDQ001, error, 1 finding).
    """
    b = GraphBuilder(opset=13)
    x = b.input("x", [1, 4, 8, 8])
    scale = b.init("x_scale", np.float32(0.05))
    zp = b.init("x_zp", np.int8(0))
    if info:
        zp = b.node("Identity", [zp], name="zp_identity")
    xq = b.node("QuantizeLinear", [x, scale, zp], name="x_q")
    x = b.node("DequantizeLinear", [xq, scale, zp], name="x_dq")
    w_q = b.init("w_q", np.random.default_rng(0).integers(-127, 128, (4, 4, 3, 3)).astype(np.int8))
    w = b.dq(w_q, 0.0 if error else 0.02, name="w_dq")
    y = b.node("Conv", [x, w], name="conv")
    y = b.qdq(y, [0.1], [0]) if warning else b.qdq(y, 0.1)
    b.node("Identity", [y], ["y"], name="out")
    b.output("y", [1, 4, 6, 6])
    return b.save(path)


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    return build(tmp_path / "clean.onnx")


@pytest.fixture
def warned(tmp_path: Path) -> Path:
    return build(tmp_path / "warned.onnx", warning=True)


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    return build(tmp_path / "mixed.onnx", warning=True, info=True, error=True)


def test_builder_findings_are_as_documented(capsys, tmp_path):
    for kwargs, expected in [({}, []), ({"warning": True}, ["QDQ201"] * 2), ({"info": True}, ["QDQ202"] * 2),
                             ({"error": True}, ["QDQ001"])]:
        _, report = lint_json(capsys, build(tmp_path / "m.onnx", **kwargs), "--exit-zero")
        assert [f["code"] for f in report["findings"]] == expected, kwargs


# --- exit codes ---------------------------------------------------------------------------------


def test_clean_model_exits_0(capsys, clean):
    code, out, err = run(capsys, "lint", clean, model=clean)
    assert (code, err) == (0, "")
    assert "clean" in out and str(clean) in out


def test_findings_exit_1(capsys, warned):
    code, out, err = run(capsys, "lint", warned, model=warned)
    assert (code, err) == (1, "")
    assert out.count("QDQ201 [warning]") == 2


def test_exit_zero(capsys, mixed):
    code, out, _ = run(capsys, "lint", mixed, "--exit-zero", model=mixed)
    assert code == 0 and "QDQ001 [error]" in out


@pytest.mark.parametrize(
    "kwargs, fail_on, expected",
    [
        ({"warning": True}, "error", 0),
        ({"warning": True}, "warning", 1),
        ({"warning": True}, "info", 1),
        ({"info": True}, "warning", 0),
        ({"info": True}, "info", 1),
        ({"error": True}, "error", 1),
        ({"error": True}, "ERROR", 1),
        ({}, "info", 0),
    ],
)
def test_fail_on(capsys, tmp_path, kwargs, fail_on, expected):
    model = build(tmp_path / "m.onnx", **kwargs)
    code, out, _ = run(capsys, "lint", model, "--fail-on", fail_on, model=model)
    assert code == expected, out
    if kwargs and expected == 0:
        assert f"none at or above --fail-on {fail_on}" in out  # the summary says why it passes


# --- formats and output files -------------------------------------------------------------------


def parse(fmt: str, text: str) -> list[str]:
    """The rule codes of the findings in a report of format `fmt`."""
    if fmt == "json":
        return [f["code"] for f in json.loads(text)["findings"]]
    if fmt == "sarif":
        sarif = json.loads(text)
        assert sarif["version"] == "2.1.0"
        return [r["ruleId"] for r in sarif["runs"][0]["results"]]
    if fmt == "junit":  # failures at or above --fail-on; the rest as text lines in <system-out>
        root = ET.fromstring(text)
        passing = "\n".join(out.text or "" for out in root.iter("system-out"))
        return [f.get("type") for f in root.iter("failure")] + parse("text", passing)
    if fmt == "github":  # ::warning file=m.onnx,title=QDQ201 name::message
        return [line.split(",title=", 1)[1].split()[0] for line in text.splitlines()]
    if fmt == "gitlab":
        return [issue["check_name"] for issue in json.loads(text)]
    if fmt == "html":  # one card per finding: <div class='finding error' id='finding-1'><h3>1. <a href='#rule-QDQ201'>
        return re.findall(r"id='finding-\d+'><h3>\d+\. <a href='#rule-(QDQ\d+)'>", text)
    return [line.split()[1] for line in text.splitlines() if " QDQ" in line and "[" in line]


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_to_stdout(capsys, mixed, fmt):
    code, out, err = run(capsys, "lint", mixed, "--format", fmt, model=mixed)
    assert (code, err) == (1, "")
    assert sorted(parse(fmt, out)) == ["QDQ001"] + ["QDQ201"] * 2 + ["QDQ202"] * 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_to_file(capsys, tmp_path, mixed, fmt):
    report = tmp_path / "reports" / f"report.{fmt}"
    report.parent.mkdir()
    code, out, err = run(capsys, "lint", mixed, "--format", fmt, "-o", report, model=mixed)
    assert (code, out) == (1, "")
    assert err == f"qdq: wrote {report}: Found 5 findings (1 error, 2 warnings, 2 info) in {mixed} with rule set 'common'; 4 with an automatic fix\n"
    assert sorted(parse(fmt, report.read_text())) == ["QDQ001"] + ["QDQ201"] * 2 + ["QDQ202"] * 2
    assert [p.name for p in report.parent.iterdir()] == [report.name]  # no temporary file left


def test_output_file_is_replaced_atomically(capsys, tmp_path, clean, warned):
    report = tmp_path / "report.json"
    report.write_text("stale")
    assert run(capsys, "lint", warned, "--format", "json", "-o", report, model=warned)[0] == 1
    assert len(json.loads(report.read_text())["findings"]) == 2
    assert run(capsys, "lint", clean, "--format", "json", "-o", report, model=clean)[0] == 0
    assert json.loads(report.read_text())["findings"] == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# --- rule selection and project config ----------------------------------------------------------


def test_select(capsys, mixed):
    code, report = lint_json(capsys, mixed, "--select", "QDQ202")
    assert codes(report) == ["QDQ202"] and report["rules_checked"] == ["QDQ202"]
    assert code == 0  # QDQ202 is info, below the default --fail-on warning
    _, report = lint_json(capsys, mixed, "--select", "qdq2")  # prefixes, any case
    assert codes(report) == ["QDQ201", "QDQ202"]


def test_ignore(capsys, mixed):
    code, report = lint_json(capsys, mixed, "--ignore", "QDQ0,QDQ201")
    assert codes(report) == ["QDQ202"] and code == 0
    assert "QDQ001" not in report["rules_checked"]


def test_select_and_ignore_together(capsys, mixed):
    _, report = lint_json(capsys, mixed, "--select", "QDQ2", "--ignore", "QDQ202")
    assert codes(report) == ["QDQ201"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write `[tool.qdq]` into a pyproject.toml in a fresh cwd."""

    def write(body: str) -> Path:
        (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.qdq]\n{body}\n")
        return tmp_path

    monkeypatch.chdir(tmp_path)
    return write


def test_pyproject_select_ignore_fail_on(capsys, project, mixed):
    project('select = ["QDQ2"]\nignore = ["QDQ201"]\nfail-on = "info"')
    code, report = lint_json(capsys, mixed)
    assert codes(report) == ["QDQ202"]
    assert code == 1  # info fails because of fail-on = "info"


def test_command_line_overrides_pyproject(capsys, project, mixed):
    project('select = ["QDQ2"]\nfail-on = "info"')
    code, report = lint_json(capsys, mixed, "--select", "QDQ0", "--fail-on", "error")
    assert codes(report) == ["QDQ001"] and code == 1
    code, report = lint_json(capsys, mixed, "--select", "QDQ202", "--fail-on", "warning")
    assert code == 0


def test_pyproject_rules_file(capsys, project, mixed):
    folder = project('rules = "qdq-rules.toml"')
    (folder / "qdq-rules.toml").write_text('extends = "common"\n[rules.QDQ201]\nenabled = false\n')
    _, report = lint_json(capsys, mixed)
    assert codes(report) == ["QDQ001", "QDQ202"]


def test_isolated_ignores_pyproject(capsys, project, mixed):
    project('select = ["QDQ202"]\nfail-on = "error"')
    code, report = lint_json(capsys, mixed, "--isolated")
    assert codes(report) == ["QDQ001", "QDQ201", "QDQ202"]
    assert code == 1


def test_isolated_ignores_a_broken_pyproject(capsys, project, clean):
    project('colour = "blue"')
    assert run(capsys, "lint", clean, model=clean)[0] == 2
    assert run(capsys, "lint", clean, "--isolated", model=clean)[0] == 0


def test_pyproject_without_tool_qdq_is_ignored(capsys, tmp_path, monkeypatch, mixed):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.chdir(tmp_path)
    _, report = lint_json(capsys, mixed)
    assert codes(report) == ["QDQ001", "QDQ201", "QDQ202"]


# --- rules and explain --------------------------------------------------------------------------


def test_rules_lists_every_common_rule(capsys):
    code, out, err = run(capsys, "rules")
    assert (code, err) == (0, "")
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  QDQ")]
    assert listed == COMMON_CODES
    assert f"{len(COMMON_CODES)} rules" in out


def test_rules_json(capsys):
    code, out, _ = run(capsys, "rules", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["ruleset"] == "common"
    assert [r["code"] for r in data["rules"]] == COMMON_CODES
    registry = all_rules()
    for row in data["rules"]:
        assert row["name"] == registry[row["code"]].name
        assert row["severity"] in ("error", "warning", "info") and row["enabled"] is True


def test_rules_respects_select(capsys):
    data = json.loads(run(capsys, "rules", "--format", "json", "--select", "QDQ1")[1])
    assert [r["code"] for r in data["rules"]] == [c for c in COMMON_CODES if c.startswith("QDQ1")]
    data = json.loads(run(capsys, "rules", "--format", "json", "--select", "QDQ1", "--all")[1])
    assert [r["code"] for r in data["rules"]] == sorted(all_rules())  # --all: every rule, on, off or not in the set
    assert [r["code"] for r in data["rules"] if r["in_set"]] == COMMON_CODES


@pytest.mark.parametrize("code", list(all_rules()))
def test_explain_every_rule(capsys, code):
    rule = all_rules()[code]
    exit_code, out, err = run(capsys, "explain", code.lower())
    assert (exit_code, err) == (0, "")
    assert out.splitlines()[0] == f"{code} {rule.name}"
    assert rule.doc() and rule.doc() in out
    assert f"default severity: {rule.severity}" in out


def test_explain_unknown_code(capsys):
    code, out, err = run(capsys, "explain", "QDQ999")
    assert code == 2 and out == ""
    assert err.strip() == err.strip().splitlines()[0] and "QDQ999" in err


# --- inspect ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ort_model(tmp_path_factory) -> Path:
    from test_real_exports import build_ort_qdq_model

    return build_ort_qdq_model(tmp_path_factory.mktemp("ort"))


def test_inspect_text(capsys, ort_model):
    code, out, err = run(capsys, "inspect", ort_model, model=ort_model)
    assert (code, err) == (0, "")
    assert str(ort_model) in out
    assert "10 QuantizeLinear, 18 DequantizeLinear" in out
    for op in ("Conv", "Relu", "MaxPool", "Concat", "Add"):
        assert op in out


def test_inspect_json(capsys, ort_model, tmp_path):
    code, out, err = run(capsys, "inspect", ort_model, "--format", "json", model=ort_model)
    assert (code, err) == (0, "")
    summary = json.loads(out)
    assert summary["model"]["path"] == str(ort_model)
    assert summary["model"]["quantize_nodes"] == 10 and summary["model"]["dequantize_nodes"] == 18
    assert summary["model"]["external_data"] is False
    target = tmp_path / "summary.json"
    assert run(capsys, "inspect", ort_model, "--format", "json", "-o", target, model=ort_model)[:2] == (0, "")
    assert json.loads(target.read_text()) == summary
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_lint_ort_model_never_modifies_it(capsys, ort_model):
    for fmt in FORMATS:
        assert run(capsys, "lint", ort_model, "--format", fmt, model=ort_model)[0] in (0, 1)


# --- the real entry point -----------------------------------------------------------------------


def run_module(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "qdq", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_python_m_qdq_version(tmp_path):
    proc = run_module("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"qdq {__version__}"


def test_python_m_qdq_lint_exit_code(tmp_path):
    model = build(tmp_path / "m.onnx", warning=True)
    before = sha(model)
    proc = run_module("lint", str(model), cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == ""
    assert "QDQ201" in proc.stdout
    assert sha(model) == before
