"""The shipped pre-commit hook, run by pre-commit itself on the models a commit changes.

Tests have no network, so the hook is declared `repo: local` with `language: system`, and its
entry and file filter are read from the repository's .pre-commit-hooks.yaml: what runs is the
shipped definition, with `qdq` on PATH being this checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import REPO, build

pytest.importorskip("pre_commit")
yaml = pytest.importorskip("yaml")  # pre-commit's own dependency


def shipped_hook() -> dict:
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    return hook


def test_shipped_hook_definition():
    hook = shipped_hook()
    assert hook["id"] == "qdq-lint" and hook["entry"] == "qdq lint" and hook["language"] == "python"
    assert hook["files"] == r"\.onnx$" and hook["types"] == ["file"]


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A git repository whose .pre-commit-config.yaml runs the shipped hook for --target common."""
    hook = shipped_hook()
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    local = {key: hook[key] for key in ("id", "name", "entry", "files", "types")}
    config = {"repos": [{"repo": "local", "hooks": [{**local, "language": "system", "args": ["--target", "common"]}]}]}
    (work / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    qdq = bin_dir / "qdq"
    qdq.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m qdq "$@"\n')
    qdq.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PRE_COMMIT_HOME": str(tmp_path / "cache"), "PRE_COMMIT_COLOR": "never"}
    env.pop("PYTHONPATH", None)
    git(work, env, "init", "-q")
    return work, env


def git(work: Path, env: dict[str, str], *argv: str) -> None:
    subprocess.run(["git", *argv], cwd=work, env=env, check=True, capture_output=True, timeout=60)


def pre_commit(work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pre_commit", "run"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)


def test_hook_lints_the_changed_models(repo):
    work, env = repo
    build(work / "models" / "clean.onnx")
    (work / "notes.txt").write_text("not a model")
    git(work, env, "add", ".")
    proc = pre_commit(work, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "qdq lint" in proc.stdout and "Passed" in proc.stdout

    build(work / "models" / "warned.onnx", warning=True)
    git(work, env, "add", ".")
    proc = pre_commit(work, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Failed" in proc.stdout
    findings = [line for line in proc.stdout.splitlines() if " QDQ201 [warning] " in line]
    assert [line.split(":")[0] for line in findings] == ["models/warned.onnx"] * 2
    # Both staged models went to one qdq run, and the text file to none.
    assert "in 1 of 2 models with rule set 'common'" in proc.stdout
    assert "notes.txt" not in proc.stdout
