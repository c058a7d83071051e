"""Bad input and bad options: exit code 2, one line on stderr naming the problem, no traceback, nothing written.

Every model test also passes `-o OUT/report.txt`, so "nothing written" covers the report file and
any temporary file of an atomic write: the whole tmp folder is compared before and after.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from onnx import TensorProto

import cli

REPO = Path(cli.__file__).resolve().parent
LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 132\n"
)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with a hash of its content."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
        for p in sorted(folder.rglob("*"))
    }


def assert_bad_input(capsys: pytest.CaptureFixture, tmp_path: Path, argv: list[str], *expected: str) -> str:
    """Run `qdq argv`; require exit 2, one stderr line containing every `expected`, nothing written."""
    before = snapshot(tmp_path)
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"stderr must be one non-empty line, got {err!r}"
    assert "Traceback" not in err and "unexpected" not in err, err
    for text in expected:
        assert str(text) in lines[0], (text, lines[0])
    assert out == ""
    assert snapshot(tmp_path) == before, "a failing command wrote or changed files"
    return lines[0]


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def qdq_model(opset: int = 13) -> GraphBuilder:
    """x → Q/DQ → Conv(DQ int8 weight) → Q/DQ → y: a clean QDQ model."""
    b = GraphBuilder(opset=opset)
    x = b.qdq(b.input("x", [1, 4, 8, 8]), 0.05)
    w = b.weight("w", np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32))
    y = b.node("Conv", [x, w], name="conv")
    b.node("Identity", [b.qdq(y, 0.1)], ["y"], name="out")
    b.output("y", [1, 4, 6, 6])
    return b


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return qdq_model().save(tmp_path / "model.onnx")


def external_model(folder: Path) -> Path:
    """A QDQ model whose float weight (576 bytes) lives in `weights.data`."""
    folder.mkdir(parents=True, exist_ok=True)
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 8, 8]), 0.05)
    w = b.qdq(b.init("w", np.random.default_rng(1).standard_normal((4, 4, 3, 3)).astype(np.float32)), 0.02)
    y = b.node("Conv", [x, w], name="conv")
    b.node("Identity", [b.qdq(y, 0.1)], ["y"], name="out")
    b.output("y", [1, 4, 6, 6])
    path = folder / "model.onnx"
    onnx.save(b.model(), str(path), save_as_external_data=True, location="weights.data", size_threshold=256)
    return path


def edit_external(path: Path, **changes: str) -> None:
    """Rewrite the external-data entries (location, offset, length) of every external tensor."""
    proto = onnx.load(str(path), load_external_data=False)
    for tensor in proto.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key in changes:
                    entry.value = changes[entry.key]
    onnx.save(proto, str(path))


# --- the model path itself ---------------------------------------------------------------------


def test_missing_path(capsys, tmp_path, out_dir):
    missing = tmp_path / "nope.onnx"
    assert_bad_input(capsys, tmp_path, ["lint", missing, "-o", out_dir / "r.txt"], missing, "no such file")


def test_directory(capsys, tmp_path, out_dir):
    assert_bad_input(capsys, tmp_path, ["lint", out_dir, "-o", tmp_path / "r.txt"], out_dir, "directory")


def test_empty_file(capsys, tmp_path, out_dir):
    empty = tmp_path / "empty.onnx"
    empty.touch()
    assert_bad_input(capsys, tmp_path, ["lint", empty, "-o", out_dir / "r.txt"], empty, "empty")


def test_random_bytes(capsys, tmp_path, out_dir):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(np.random.default_rng(7).bytes(4096))
    assert_bad_input(capsys, tmp_path, ["lint", junk, "-o", out_dir / "r.txt"], junk, "not a valid ONNX model")


@pytest.mark.usefixtures("checker_placements")
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.9, 0.99, -1])
def test_truncated_model(capsys, tmp_path, out_dir, model, fraction):
    data = model.read_bytes()
    cut = len(data) - 3 if fraction == -1 else max(1, int(len(data) * fraction))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[:cut])
    line = assert_bad_input(capsys, tmp_path, ["lint", truncated, "-o", out_dir / "r.txt"], truncated)
    # The cut at len - 3 loses the opset import at the end of the file; the others break the protobuf.
    assert "not a valid ONNX model" in line or "opset" in line


@pytest.mark.usefixtures("checker_placements")
def test_every_cut_point_is_refused(tmp_path, model):
    """No prefix of a valid model loads: every cut ends in a ModelLoadError (library level, fast)."""
    from qdq.graph.model import load_model
    from qdq.support.errors import ModelLoadError

    data = model.read_bytes()
    truncated = tmp_path / "t.onnx"
    for cut in range(1, len(data), 7):
        truncated.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError):
            load_model(truncated)


def test_git_lfs_pointer(capsys, tmp_path, out_dir):
    pointer = tmp_path / "model.onnx"
    pointer.write_text(LFS_POINTER)
    assert_bad_input(
        capsys, tmp_path, ["lint", pointer, "-o", out_dir / "r.txt"], pointer, "Git LFS pointer", "git lfs pull"
    )


def test_opset_9(capsys, tmp_path, out_dir):
    b = GraphBuilder(opset=9)
    b.node("Relu", [b.input("x", [1, 4])], ["y"])
    b.output("y", [1, 4])
    old = b.save(tmp_path / "old.onnx")
    assert_bad_input(capsys, tmp_path, ["lint", old, "-o", out_dir / "r.txt"], old, "opset 9")


@pytest.mark.usefixtures("checker_placements")
def test_float_model_is_a_note_not_an_error(capsys, tmp_path):
    b = GraphBuilder(opset=13)
    b.node("Relu", [b.input("x", [1, 4])], ["y"])
    b.output("y", [1, 4])
    path = b.save(tmp_path / "float.onnx")
    assert cli.main(["lint", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "no QuantizeLinear or DequantizeLinear" in out
    assert "error" not in out.lower()


# --- external data ------------------------------------------------------------------------------


def test_external_data_missing(capsys, tmp_path, out_dir):
    path = external_model(tmp_path / "m")
    (tmp_path / "m" / "weights.data").unlink()
    assert_bad_input(capsys, tmp_path, ["lint", path, "-o", out_dir / "r.txt"], path, "weights.data", "missing")


def test_external_data_outside_model_folder(capsys, tmp_path, out_dir):
    path = external_model(tmp_path / "m")
    os.replace(tmp_path / "m" / "weights.data", tmp_path / "x.data")  # present, but outside
    edit_external(path, location="../x.data")
    assert_bad_input(
        capsys, tmp_path, ["lint", path, "-o", out_dir / "r.txt"], path, "../x.data", "outside the model folder"
    )


def test_external_data_absolute_location(capsys, tmp_path, out_dir):
    path = external_model(tmp_path / "m")
    absolute = str((tmp_path / "m" / "weights.data").resolve())
    edit_external(path, location=absolute)
    assert_bad_input(capsys, tmp_path, ["lint", path, "-o", out_dir / "r.txt"], path, absolute, "absolute")


@pytest.mark.parametrize("location, problem", [("", "no location"), ("..", "outside"), ("a\x00b", "not a valid path")])
def test_external_data_malformed_location(capsys, tmp_path, out_dir, location, problem):
    path = external_model(tmp_path / "m")
    edit_external(path, location=location)
    assert_bad_input(capsys, tmp_path, ["lint", path, "-o", out_dir / "r.txt"], path, problem)


@pytest.mark.parametrize("changes", [{"length": "100000"}, {"offset": "100000"}, {"offset": "500", "length": "576"}])
def test_external_data_beyond_end_of_file(capsys, tmp_path, out_dir, changes):
    path = external_model(tmp_path / "m")
    edit_external(path, **changes)
    assert_bad_input(
        capsys, tmp_path, ["lint", path, "-o", out_dir / "r.txt"], path, "beyond the end of 'weights.data'"
    )


# --- output paths -------------------------------------------------------------------------------


def test_output_into_missing_folder(capsys, tmp_path, model):
    target = tmp_path / "no" / "such" / "report.txt"
    assert_bad_input(capsys, tmp_path, ["lint", model, "-o", target], target, "does not exist")


def test_inspect_output_into_missing_folder(capsys, tmp_path, model):
    target = tmp_path / "missing" / "summary.json"
    assert_bad_input(capsys, tmp_path, ["inspect", model, "--format", "json", "-o", target], target, "does not exist")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores folder permissions")
def test_output_into_read_only_folder(capsys, tmp_path, model):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert_bad_input(capsys, tmp_path, ["lint", model, "-o", locked / "r.txt"], locked, "not writable")
    finally:
        locked.chmod(0o755)


def test_output_into_unwritable_folder_as_seen_by_access(capsys, tmp_path, model, monkeypatch):
    """The same check for any user (root included): the folder is refused when access() says no."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == locked else real_access(p, mode, **kw))
    assert_bad_input(capsys, tmp_path, ["lint", model, "-o", locked / "r.txt"], locked, "not writable")


def test_output_is_a_directory(capsys, tmp_path, model, out_dir):
    assert_bad_input(capsys, tmp_path, ["lint", model, "-o", out_dir], out_dir, "is a directory")


def test_output_under_a_file(capsys, tmp_path, model):
    assert_bad_input(capsys, tmp_path, ["lint", model, "-o", model / "r.txt"], model, "not a folder")


@pytest.mark.parametrize("command", ["lint", "inspect"])
def test_output_would_overwrite_the_model(capsys, tmp_path, model, command):
    same = tmp_path / "." / model.name
    assert_bad_input(capsys, tmp_path, [command, model, "-o", same], "overwrite the input")


def test_output_would_overwrite_external_data(capsys, tmp_path):
    path = external_model(tmp_path / "m")
    data = tmp_path / "m" / "weights.data"
    assert_bad_input(capsys, tmp_path, ["lint", path, "-o", data], data, "overwrite the input")


def test_output_would_overwrite_the_rules_file(capsys, tmp_path, model):
    rules = tmp_path / "rules.toml"
    rules.write_text('extends = "common"\n')
    assert_bad_input(capsys, tmp_path, ["lint", model, "--rules", rules, "-o", rules], rules, "overwrite the input")


# --- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, problem",
    [
        ("this is = = not toml", "invalid TOML"),
        ('extends = "nonexistent"\n', "neither a shipped target nor a file"),
        ("[rules.QDQ999]\n", "unknown rule code 'QDQ999'"),
        ('[rules.QDQ001]\nseverity = "fatal"\n', "unknown severity 'fatal'"),
        ("colour = 1\n", "unknown key(s) colour"),
    ],
)
def test_bad_rules_file(capsys, tmp_path, model, out_dir, content, problem):
    rules = tmp_path / "rules.toml"
    rules.write_text(content)
    assert_bad_input(capsys, tmp_path, ["lint", model, "--rules", rules, "-o", out_dir / "r.txt"], rules, problem)


def test_missing_rules_file(capsys, tmp_path, model, out_dir):
    rules = tmp_path / "nope.toml"
    assert_bad_input(capsys, tmp_path, ["lint", model, "--rules", rules, "-o", out_dir / "r.txt"], rules, "not found")


def test_unknown_target(capsys, tmp_path, model, out_dir):
    assert_bad_input(
        capsys, tmp_path, ["lint", model, "--target", "gpu9000", "-o", out_dir / "r.txt"], "unknown target 'gpu9000'"
    )


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_unknown_rule_code(capsys, tmp_path, model, out_dir, option):
    assert_bad_input(capsys, tmp_path, ["lint", model, option, "QDQ1,XYZ9", "-o", out_dir / "r.txt"], "'XYZ9'")


def test_target_and_rules_together(capsys, tmp_path, model, out_dir):
    rules = tmp_path / "rules.toml"
    rules.write_text('extends = "common"\n')
    line = assert_bad_input(
        capsys, tmp_path, ["lint", model, "--target", "common", "--rules", rules, "-o", out_dir / "r.txt"], "--rules"
    )
    assert "--target" in line


def test_bad_fail_on(capsys, tmp_path, model, out_dir):
    assert_bad_input(
        capsys, tmp_path, ["lint", model, "--fail-on", "fatal", "-o", out_dir / "r.txt"], "--fail-on", "'fatal'"
    )


def test_bad_fail_on_in_pyproject_names_the_file(capsys, tmp_path, model, out_dir, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.qdq]\nfail-on = "sometimes"\n')
    monkeypatch.chdir(tmp_path)
    assert_bad_input(capsys, tmp_path, ["lint", model, "-o", out_dir / "r.txt"], "pyproject.toml", "'sometimes'")


def test_bad_format(capsys, tmp_path, model, out_dir):
    assert_bad_input(
        capsys, tmp_path, ["lint", model, "--format", "yaml", "-o", out_dir / "r.txt"], "--format", "'yaml'"
    )


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["lint", "--frobnicate", "m.onnx"], "unrecognized arguments: --frobnicate"),
        (["lint"], "required: model"),
        ([], "no command given"),
        (["explain", "QDQ999"], "unknown rule 'QDQ999'"),
    ],
)
def test_usage_errors(capsys, tmp_path, argv, problem):
    assert_bad_input(capsys, tmp_path, argv, problem)


def test_help_and_version_are_not_errors(capsys):
    assert cli.main(["--help"]) == 0
    assert "lint" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("qdq ")


# --- the real entry point -----------------------------------------------------------------------


def run_qdq(*argv: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "qdq", *map(str, argv)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, *expected: str) -> None:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and all(text in lines[0] for text in expected), proc.stderr
    assert proc.stdout == ""


def test_entry_point_random_bytes(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xff" * 999)
    before = snapshot(tmp_path)
    assert_one_line_exit_2(
        run_qdq("lint", junk, "-o", tmp_path / "r.json", "--format", "json", cwd=tmp_path), "junk.onnx"
    )
    assert snapshot(tmp_path) == before


def test_entry_point_missing_external_data(tmp_path):
    path = external_model(tmp_path / "m")
    (tmp_path / "m" / "weights.data").unlink()
    before = snapshot(tmp_path)
    assert_one_line_exit_2(run_qdq("inspect", path, cwd=tmp_path), "weights.data")
    assert snapshot(tmp_path) == before


def test_entry_point_usage_error(tmp_path):
    assert_one_line_exit_2(run_qdq("lint", "--target", cwd=tmp_path), "--target")
