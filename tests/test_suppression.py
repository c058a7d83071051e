"""Suppressing findings: `[tool.qdq.per-node-ignores]` in pyproject.toml, and baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bad_input import assert_bad_input
from test_cli import build, run

from qdq.engine.registry import all_rules

# build(mixed) reports QDQ001 on w_dq (error), QDQ201 on qdq_3_q and qdq_3_dq (warnings) and
# QDQ202 on x_q and x_dq (info); see tests/test_cli.py.


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    build(tmp_path / "models" / "mixed.onnx", warning=True, info=True, error=True)
    return tmp_path


def pyproject(folder: Path, body: str) -> None:
    (folder / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.qdq]\n{body}\n")


def findings(capsys, *argv: object) -> tuple[int, list[tuple[str, str]]]:
    code, out, err = run(capsys, "lint", *argv, "--format", "json")
    assert err == "", err
    return code, [(f["code"], f["node"]) for f in json.loads(out)["findings"]]


# --- per-node-ignores ---------------------------------------------------------------------------


def test_per_node_ignores_match_node_globs_and_code_prefixes(capsys, folder):
    pyproject(folder, '[tool.qdq.per-node-ignores]\n"qdq_3_*" = ["QDQ2"]\n"x_q" = ["qdq202"]')
    code, found = findings(capsys, "models")
    assert found == [("QDQ001", "w_dq"), ("QDQ202", "x_dq")]
    assert code == 1


def test_per_node_ignores_change_the_exit_code(capsys, folder):
    pyproject(folder, '[tool.qdq.per-node-ignores]\n"w_dq" = ["QDQ001"]\n"qdq_*" = ["ALL"]')
    code, found = findings(capsys, "models")
    assert found == [("QDQ202", "x_dq"), ("QDQ202", "x_q")] and code == 0  # only info is left
    code, found = findings(capsys, "models", "--isolated")
    assert len(found) == 5 and code == 1


def test_a_pattern_is_the_whole_node_name(capsys, folder):
    pyproject(folder, '[tool.qdq.per-node-ignores]\n"qdq_3" = ["QDQ201"]\n"W_DQ" = ["QDQ001"]')
    assert len(findings(capsys, "models")[1]) == 5


def test_fix_reports_what_lint_reports(capsys, folder):
    model = folder / "models" / "mixed.onnx"
    # The zero scale of w_dq has no automatic fix: it is what remains after fixing. (It also makes
    # the output one value everywhere, which no verdict can judge: the findings are the point here.)
    assert run(capsys, "fix", model, "--dry-run", "--no-verify")[0] == 1
    pyproject(folder, '[tool.qdq.per-node-ignores]\n"w_dq" = ["QDQ001"]')
    code, out, _ = run(capsys, "fix", model, "--dry-run", "--format", "json", "--no-verify")
    assert code == 0 and json.loads(out)["remaining"] == []


@pytest.mark.parametrize("body, problem", [
    ('per-node-ignores = ["QDQ001"]', "[tool.qdq.per-node-ignores] must be a table"),
    ('[tool.qdq.per-node-ignores]\n"w_*" = "QDQ001"', "'w_*' must be a list of rule codes"),
    ('[tool.qdq.per-node-ignores]\n"w_*" = [1]', "'w_*' must be a list of rule codes"),
    ('[tool.qdq.per-node-ignores]\n"w_*" = ["QDQ9999"]', "no rule matches 'QDQ9999'"),
    ('[tool.qdq.per-node-ignores]\n"w_*" = [""]', "no rule matches ''"),
    ('per-node-ignore = {}', "unknown key(s) per-node-ignore"),
])
def test_bad_per_node_ignores(capsys, folder, body, problem):
    pyproject(folder, body)
    (folder / "out").mkdir()
    assert_bad_input(capsys, folder, ["lint", "models", "-o", folder / "out" / "r.txt"], "pyproject.toml", problem)


# --- baselines ----------------------------------------------------------------------------------


@pytest.fixture
def baselined(capsys, folder) -> Path:
    """A baseline of today's five findings in ci/, away from the models."""
    (folder / "ci").mkdir()
    baseline = folder / "ci" / "qdq-baseline.json"
    code, out, err = run(capsys, "lint", "models", "--write-baseline", baseline)
    assert code == 0 and "Found 5 findings" in out
    assert err == f"qdq: wrote {baseline}: the baseline records 5 findings\n"
    return baseline


def test_baseline_records_findings_relative_to_its_folder(baselined):
    entries = json.loads(baselined.read_text())["findings"]
    assert {e["model"] for e in entries} == {"../models/mixed.onnx"}
    assert sorted((e["code"], e["node"]) for e in entries) == [
        ("QDQ001", "w_dq"), ("QDQ201", "qdq_3_dq"), ("QDQ201", "qdq_3_q"), ("QDQ202", "x_dq"), ("QDQ202", "x_q"),
    ]
    assert all(set(e) == {"model", "code", "node", "tensors"} for e in entries)  # no message, no values


def test_baseline_suppresses_known_findings_from_any_folder(capsys, folder, baselined, monkeypatch):
    code, out, _ = run(capsys, "lint", "models", "--baseline", baselined)
    assert code == 0
    (line,) = out.splitlines()
    assert line.startswith("models/mixed.onnx: clean (") and line.endswith("; 5 findings suppressed by the baseline")
    monkeypatch.chdir(folder / "ci")
    code, out, _ = run(capsys, "lint", "../models/mixed.onnx", "--baseline", "qdq-baseline.json")
    assert code == 0 and out.endswith("5 findings suppressed by the baseline\n")


def test_baseline_fails_only_on_new_findings(capsys, folder, baselined):
    build(folder / "models" / "new.onnx", warning=True)
    code, found = findings(capsys, "models", "--baseline", baselined)
    assert code == 1 and found == [("QDQ201", "qdq_3_dq"), ("QDQ201", "qdq_3_q")]
    assert run(capsys, "lint", "models", "--baseline", baselined)[1].splitlines()[-1] == (
        "Found 2 findings (2 warnings) in 1 of 2 models with rule set 'common'; 2 with an automatic fix; "
        "5 findings suppressed by the baseline"
    )


def test_each_baseline_entry_suppresses_one_finding(capsys, folder, baselined):
    document = json.loads(baselined.read_text())
    document["findings"] = [e for e in document["findings"] if e["node"] != "qdq_3_q"]
    baselined.write_text(json.dumps(document))
    code, found = findings(capsys, "models", "--baseline", baselined)
    assert code == 1 and found == [("QDQ201", "qdq_3_q")]


def test_baseline_survives_reworded_messages(capsys, folder, baselined, monkeypatch):
    rule = all_rules()["QDQ201"]
    monkeypatch.setattr(rule, "message", "reworded: {node} has scalar trouble")
    code, out, _ = run(capsys, "lint", "models", "--baseline", baselined)
    assert code == 0 and "5 findings suppressed" in out
    assert "reworded" in run(capsys, "lint", "models")[1]  # the new wording is really in effect


def test_write_baseline_refuses_when_a_model_cannot_be_read(capsys, folder):
    (folder / "models" / "junk.onnx").write_bytes(b"junk")
    code, _, err = run(capsys, "lint", "models", "--write-baseline", "b.json")
    assert code == 2 and "junk.onnx" in err
    assert not (folder / "b.json").exists()


@pytest.mark.parametrize("content, problem", [
    (None, "baseline file not found"),
    ("{not json", "not valid JSON"),
    ('{"version": 7, "findings": []}', "not a qdq baseline"),
    ('{"version": 1, "findings": [{"model": "m.onnx", "code": "QDQ001"}]}', "`findings` must be a list"),
])
def test_bad_baseline(capsys, folder, content, problem):
    baseline = folder / "baseline.json"
    if content is not None:
        baseline.write_text(content)
    (folder / "out").mkdir()
    assert_bad_input(capsys, folder, ["lint", "models", "--baseline", baseline, "-o", folder / "out" / "r.txt"],
                     "baseline.json", problem)


def test_baseline_options_exclude_each_other(capsys, folder):
    assert_bad_input(capsys, folder, ["lint", "models", "--baseline", "a.json", "--write-baseline", "b.json"],
                     "not allowed with argument")
