"""`qdq lint PATH...`: files, folders and globs in one run, one report, the worst exit code."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_bad_input import assert_bad_input, snapshot
from test_cli import build, run
from test_reports import validate_sarif


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """models/{a_warned, b/clean, b/c/mixed}.onnx, a hidden folder's model, and a file that is not a model."""
    monkeypatch.chdir(tmp_path)
    models = tmp_path / "models"
    (models / "b" / "c").mkdir(parents=True)
    (models / ".venv").mkdir()
    build(models / "a_warned.onnx", warning=True)
    build(models / "b" / "clean.onnx")
    build(models / "b" / "c" / "mixed.onnx", warning=True, info=True, error=True)
    build(models / ".venv" / "hidden.onnx", error=True)
    (models / "b" / "notes.txt").write_text("not a model")
    return tmp_path


def linted(report: dict) -> list[str]:
    return [m["path"] for m in report["models"]]


def lint_json(capsys, *argv: object) -> tuple[int, dict, str]:
    code, out, err = run(capsys, "lint", *argv, "--format", "json")
    return code, json.loads(out), err


def test_folder_is_searched_recursively_and_sorted(capsys, tree):
    code, report, err = lint_json(capsys, "models")
    assert (code, err) == (1, "")
    assert linted(report) == ["models/a_warned.onnx", "models/b/c/mixed.onnx", "models/b/clean.onnx"]
    assert {f["model"] for f in report["findings"]} == {"models/a_warned.onnx", "models/b/c/mixed.onnx"}
    assert report["summary"]["models"] == 3


def test_globs_are_expanded_by_qdq(capsys, tree):
    code, report, _ = lint_json(capsys, "models/**/*ed.onnx")
    assert linted(report) == ["models/a_warned.onnx", "models/b/c/mixed.onnx"]
    _, report, _ = lint_json(capsys, "models/b/*")  # a folder a glob matches is searched too
    assert linted(report) == ["models/b/c/mixed.onnx", "models/b/clean.onnx"]


def test_paths_keep_their_order_and_a_model_is_linted_once(capsys, tree):
    _, report, _ = lint_json(capsys, "models/b/clean.onnx", "models", "./models/a_warned.onnx")
    assert linted(report) == ["models/b/clean.onnx", "models/a_warned.onnx", "models/b/c/mixed.onnx"]


def test_a_named_file_is_linted_whatever_its_name(capsys, tree):
    named = tree / "model.bin"
    named.write_bytes((tree / "models" / "a_warned.onnx").read_bytes())
    code, report, _ = lint_json(capsys, named)
    assert code == 1 and linted(report) == [str(named)]


@pytest.mark.parametrize("argv, problem", [
    (["empty"], "empty: no .onnx model in this directory"),
    (["models", "nothing/*.onnx"], "nothing/*.onnx: no .onnx model matches this pattern"),
])
def test_no_model_found_is_a_usage_error(capsys, tree, argv, problem):
    (tree / "empty" / "sub").mkdir(parents=True)
    (tree / "out").mkdir()
    assert_bad_input(capsys, tree, ["lint", *argv, "-o", tree / "out" / "r.txt"], problem)


def test_exit_code_is_the_worst_over_the_models(capsys, tree):
    clean = "models/b/clean.onnx"
    assert run(capsys, "lint", clean, clean)[0] == 0
    assert run(capsys, "lint", clean, "models/a_warned.onnx")[0] == 1
    assert run(capsys, "lint", clean, "models/a_warned.onnx", "--fail-on", "error")[0] == 0
    assert run(capsys, "lint", "models/b/c/mixed.onnx", clean, "--fail-on", "error")[0] == 1


def test_an_unreadable_model_fails_the_run_but_the_others_are_reported(capsys, tree):
    junk = tree / "models" / "b" / "junk.onnx"
    junk.write_bytes(b"\x00\xff" * 99)
    report_file = tree / "report.json"
    code, out, err = run(capsys, "lint", "models", "--format", "json", "-o", report_file)
    assert code == 2 and out == ""
    line, wrote = err.splitlines()
    assert line.startswith("qdq: error: models/b/junk.onnx: not a valid ONNX model")
    assert wrote.startswith(f"qdq: wrote {report_file}: Found ") and wrote.endswith("; 1 model could not be read")
    report = json.loads(report_file.read_text())
    assert linted(report)[2:] == ["models/b/clean.onnx", "models/b/junk.onnx"]
    assert report["models"][3]["error"].startswith("models/b/junk.onnx: not a valid ONNX model")
    assert {f["model"] for f in report["findings"]} == {"models/a_warned.onnx", "models/b/c/mixed.onnx"}
    # --exit-zero forgives findings, never an unreadable model.
    assert run(capsys, "lint", "models", "--exit-zero")[0] == 2


def test_when_no_model_can_be_read_nothing_is_written(capsys, tree):
    for name in ("x.onnx", "y.onnx"):
        (tree / name).write_bytes(b"")
    before = snapshot(tree)
    code, out, err = run(capsys, "lint", "x.onnx", "y.onnx", "-o", "report.txt")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["qdq: error: x.onnx: file is empty", "qdq: error: y.onnx: file is empty"]
    assert snapshot(tree) == before


def test_text_report_over_several_models(capsys, tree):
    code, out, _ = run(capsys, "lint", "models")
    lines = out.splitlines()
    assert code == 1
    assert [line.split(":")[0] for line in lines if " QDQ" in line and "[" in line] == ["models/a_warned.onnx"] * 2 + [
        "models/b/c/mixed.onnx"
    ] * 5
    assert lines[-1].startswith("Found 7 findings (1 error, 4 warnings, 2 info) in 2 of 3 models with rule set 'common'")


def test_sarif_over_several_models_is_valid(capsys, tree):
    code, out, _ = run(capsys, "lint", "models", "--format", "sarif")
    document = json.loads(out)
    validate_sarif(document)
    (sarif_run,) = document["runs"]
    uris = [a["location"]["uri"] for a in sarif_run["artifacts"]]
    assert uris == ["models/a_warned.onnx", "models/b/c/mixed.onnx", "models/b/clean.onnx"]
    places = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in sarif_run["results"]]
    assert all(uris[place["index"]] == place["uri"] for place in places)
    assert sorted(place["uri"] for place in places) == ["models/a_warned.onnx"] * 2 + ["models/b/c/mixed.onnx"] * 5


def test_junit_over_several_models(capsys, tree):
    _, out, _ = run(capsys, "lint", "models", "--format", "junit")
    suites = ET.fromstring(out).findall("testsuite")
    assert [s.get("name") for s in suites] == [f"qdq lint {p}" for p in
                                               ("models/a_warned.onnx", "models/b/c/mixed.onnx", "models/b/clean.onnx")]
    # One failing case per warning or error, each naming its node.
    failing = [c.get("name") for c in suites[1].iter("testcase") if c.find("failure") is not None]
    assert len(failing) == 3 and len(set(failing)) == 3
    assert suites[2].get("failures") == "0" and int(suites[2].get("tests")) > 0


def test_output_must_not_replace_one_of_the_models(capsys, tree):
    assert_bad_input(capsys, tree, ["lint", "models", "-o", "models/b/clean.onnx"], "overwrite the input")
