"""No data lost: qdq never modifies its input, never leaves a half-written output, and never
rewrites an external-data file in place.

The interrupted-write tests run `qdq fix` in a child process that blocks in the middle of the
atomic write (after half the bytes, or just before the rename), SIGKILL it there, and look at
what is left: the previous output or none, plus at most the hidden `.<name>.*.tmp` file of the
write that was cut short, which a kill cannot clean up and no reader mistakes for the output.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder

import cli

REPO = Path(cli.__file__).resolve().parent


def digest(path: Path) -> tuple[str, int]:
    """Content hash and inode: a file rewritten in place keeps its inode but not its hash."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_ino


def files_of(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: digest(p) for p in sorted(folder.iterdir()) if p.is_file()}


def external_int8_model(folder: Path) -> Path:
    """A model `qdq fix --target npu` must re-quantize: non-power-of-two scales on an int8 weight
    (2304 bytes) that lives in `weights.data`; the re-quantized copy is large enough to go to a new
    data file too."""
    folder.mkdir(parents=True, exist_ok=True)
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 16, 8, 8]), 0.05)
    w = b.weight("w", np.random.default_rng(1).standard_normal((16, 16, 3, 3)).astype(np.float32), 0.03)
    b.node("Identity", [b.qdq(b.node("Conv", [x, w], name="conv"), 0.1)], ["y"], name="out")
    b.output("y", [1, 16, 6, 6])
    path = folder / "model.onnx"
    onnx.save(b.model(), str(path), save_as_external_data=True, location="weights.data", size_threshold=256)
    return path


def qdq(*argv: object) -> int:
    return cli.main([str(a) for a in argv])


# --- the input is never modified ------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["lint", "--target", "npu"],
    ["lint", "--target", "npu", "--format", "sarif", "-o", "{out}/report.sarif"],
    ["inspect", "--target", "trt"],
    ["fix", "--target", "npu", "-o", "{out}/fixed.onnx", "--report", "{out}/report.json"],
    ["fix", "--target", "npu", "--dry-run"],
    ["fix", "--target", "npu", "--exact-only", "-o", "{out}/fixed.onnx"],
    ["fix", "--target", "npu", "-o", "{src}/fixed.onnx"],
])
def test_input_model_and_its_data_are_untouched(capsys, tmp_path, argv):
    source = external_int8_model(tmp_path / "src")
    (tmp_path / "out").mkdir()
    before = files_of(source.parent)
    code = qdq(argv[0], source, *[a.format(out=tmp_path / "out", src=tmp_path / "src") for a in argv[1:]])
    capsys.readouterr()
    assert code in (0, 1)
    after = files_of(source.parent)
    assert {name: after[name] for name in before} == before


@pytest.mark.parametrize("output", ["{src}/model.onnx", "{src}/./model.onnx", "{src}/weights.data", "{link}"])
def test_fix_refuses_to_write_over_its_input(capsys, tmp_path, output):
    source = external_int8_model(tmp_path / "src")
    (tmp_path / "link.onnx").symlink_to(source)
    before = files_of(source.parent)
    code = qdq("fix", source, "--target", "npu", "-o", output.format(src=source.parent, link=tmp_path / "link.onnx"))
    err = capsys.readouterr().err
    assert code == 2 and "overwrite the input" in err, err
    assert files_of(source.parent) == before


def test_in_place_replaces_the_model_and_never_its_data_file(capsys, tmp_path):
    """--in-place rewrites the model file (a new inode: renamed over, not truncated); the weights
    it re-quantized go to a new data file, and the original data file keeps its bytes and inode."""
    source = external_int8_model(tmp_path / "src")
    data_before = digest(source.parent / "weights.data")
    model_before = digest(source)
    assert qdq("fix", source, "--target", "npu", "--in-place") in (0, 1)
    capsys.readouterr()
    assert digest(source.parent / "weights.data") == data_before
    assert digest(source)[0] != model_before[0] and digest(source)[1] != model_before[1]
    onnx.checker.check_model(str(source), full_check=True)


@pytest.mark.parametrize("where", ["same folder", "other folder"])
def test_external_data_is_never_rewritten_in_place(capsys, tmp_path, where):
    source = external_int8_model(tmp_path / "src")
    out = (tmp_path / "src" if where == "same folder" else tmp_path / "out") / "fixed.onnx"
    out.parent.mkdir(exist_ok=True)
    data_before = digest(source.parent / "weights.data")
    for _ in range(2):  # the second run finds the first one's files in place and must not reuse them
        assert qdq("fix", source, "--target", "npu", "-o", out) in (0, 1)
        capsys.readouterr()
        assert digest(source.parent / "weights.data") == data_before
        onnx.checker.check_model(str(out), full_check=True)
    # The re-quantized weight went to a data file of the output's own, never into weights.data.
    referenced = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer
                  for e in t.external_data if e.key == "location"}
    assert referenced and "weights.data" not in referenced


# --- an interrupted write -------------------------------------------------------------------------

# The child blocks inside qdq.support.files.atomic_write_bytes on the way to `target`, after touching
# `ready`, so the parent can kill it at exactly that point.
_CHILD = r"""
import os, sys, time
from pathlib import Path
import qdq.support.files as files

target, ready, where = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), sys.argv[3]

def block():
    ready.touch()
    time.sleep(600)

real_replace, real_fdopen = os.replace, os.fdopen

def slow_replace(src, dst, *args, **kwargs):
    if Path(dst).resolve() == target and where == "before-rename":
        block()
    return real_replace(src, dst, *args, **kwargs)

class HalfWriter:
    def __init__(self, handle):
        self.handle = handle
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)
    def write(self, data):
        self.handle.write(data[: len(data) // 2])
        self.handle.flush()
        block()
    def __getattr__(self, name):
        return getattr(self.handle, name)

def half_fdopen(fd, *args, **kwargs):
    handle = real_fdopen(fd, *args, **kwargs)
    name = os.readlink(f"/proc/self/fd/{fd}")
    if where == "half-written" and Path(name).name.startswith("." + target.name + "."):
        return HalfWriter(handle)
    return handle

files.os.replace = slow_replace
files.os.fdopen = half_fdopen
import cli
sys.exit(cli.main(sys.argv[4:]))
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="the child finds its temporary file through /proc")
@pytest.mark.parametrize("where", ["half-written", "before-rename"])
@pytest.mark.parametrize("previous", [b"OLD OUTPUT", None])
def test_killed_write_leaves_the_old_output_or_none(tmp_path, where, previous):
    source = external_int8_model(tmp_path / "src")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "fixed.onnx"
    if previous is not None:
        out.write_bytes(previous)
    ready = tmp_path / "ready"
    scratch = tmp_path / "scratch"  # a killed process cannot remove its scratch folder: keep it in tmp_path
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(scratch)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(out), str(ready), where, "fix", str(source), "--target", "npu", "-o", str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "the child never reached the write"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
    if previous is None:
        assert not out.exists()
    else:
        assert out.read_bytes() == previous
    leftovers = {p.name for p in out_dir.iterdir()} - {"fixed.onnx"}
    # The only files besides: the killed write's own hidden temporary file, and the new weights'
    # data file, complete because it is renamed into place before the model write begins (it is
    # orphaned when no model ever points at it, which costs disk space, not data).
    temporary = {name for name in leftovers if name.startswith(".fixed.onnx.") and name.endswith(".tmp")}
    assert len(temporary) <= 1
    data_files = leftovers - temporary
    assert all(name.endswith(".data") and not name.startswith(".") for name in data_files), leftovers
    assert all((out_dir / name).stat().st_size > 0 for name in data_files)
