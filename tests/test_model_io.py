"""Loading and saving: atomic writes, external weights kept external and never read or touched."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import run_ort
from onnx import TensorProto

import cli
from qdq.graph.model import load_model, save_model
from qdq.support.errors import OutputError
from qdq.support.files import atomic_write_text

WEIGHT_SHAPE = (8, 4, 3, 3)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def temp_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def build(folder: Path, external: bool = True, name: str = "model.onnx") -> Path:
    """x → Q/DQ → Conv(Q/DQ float weight, float bias) → Q/DQ → y; a [1]-shaped scale gives QDQ201.

    With `external`, the weight (1152 bytes) goes to `weights.data`; the small qparams stay inline.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 8, 8]), 0.05)
    w = b.qdq(b.init("w", rng.standard_normal(WEIGHT_SHAPE).astype(np.float32) * 0.3), 0.01)
    bias = b.init("bias", rng.standard_normal(8).astype(np.float32))
    y = b.node("Conv", [x, w, bias], name="conv")
    b.node("Identity", [b.qdq(y, [0.1], [0])], ["y"], name="out")
    b.output("y", [1, 8, 6, 6])
    path = folder / name
    if external:
        onnx.save(b.model(), str(path), save_as_external_data=True, location="weights.data", size_threshold=1024)
    else:
        onnx.save(b.model(), str(path))
    return path


def external_locations(path: Path) -> dict[str, str]:
    proto = onnx.load(str(path), load_external_data=False)
    return {
        t.name: {e.key: e.value for e in t.external_data}["location"]
        for t in proto.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }


@pytest.fixture
def feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)}


def test_fixture_model_really_has_external_weights(tmp_path):
    path = build(tmp_path / "m")
    assert external_locations(path) == {"w": "weights.data"}
    assert load_model(path).uses_external_data


# --- atomic writes ------------------------------------------------------------------------------


def test_save_is_atomic_when_the_rename_fails(tmp_path, monkeypatch):
    model = load_model(build(tmp_path, external=False))
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous output")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OutputError, match="No space left"):
        save_model(model, out)
    assert out.read_bytes() == b"previous output"
    assert temp_leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "out.onnx"]


def test_failed_save_to_another_folder_removes_the_copied_data(tmp_path, monkeypatch):
    model = load_model(build(tmp_path / "src"))
    dest = tmp_path / "dest"
    dest.mkdir()
    real_replace = os.replace

    def replace(src, dst):  # the data file copy succeeds, the model's rename fails
        if str(dst).endswith(".onnx"):
            raise OSError(5, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputError):
        save_model(model, dest / "out.onnx")
    assert list(dest.iterdir()) == []


def test_atomic_write_interrupted_mid_write(tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    out.write_text("old")

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(out, "new")
    assert out.read_text() == "old"
    assert temp_leftovers(tmp_path) == []


def test_atomic_write_keeps_permissions(tmp_path):
    fresh = tmp_path / "fresh.txt"
    atomic_write_text(fresh, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    existing = tmp_path / "existing.txt"
    existing.write_text("old")
    existing.chmod(0o640)
    atomic_write_text(existing, "new")
    assert existing.read_text() == "new"
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640


# --- what save_model allows and refuses -----------------------------------------------------------


def test_save_allows_new_paths_and_replacing_an_earlier_output(tmp_path, feeds, monkeypatch):
    src = build(tmp_path, external=False)
    model = load_model(src)
    save_model(model, tmp_path / "a.onnx")
    save_model(model, tmp_path / "a.onnx")  # replacing its own earlier output is fine
    monkeypatch.chdir(tmp_path)
    save_model(model, "b.onnx")  # a bare file name: the folder is the cwd
    for name in ("a.onnx", "b.onnx"):
        onnx.checker.check_model(str(tmp_path / name), full_check=True)
        assert [np.array_equal(a, b) for a, b in zip(run_ort(src, feeds), run_ort(tmp_path / name, feeds))] == [True]


def test_save_refuses_to_overwrite_the_input(tmp_path):
    src = build(tmp_path)
    before = sha(src), sha(tmp_path / "weights.data")
    model = load_model(src)
    for target in (src, tmp_path / "." / "model.onnx", tmp_path / "weights.data"):
        with pytest.raises(OutputError, match="overwrite the input"):
            save_model(model, target)
    assert (sha(src), sha(tmp_path / "weights.data")) == before
    assert temp_leftovers(tmp_path) == []


# --- external data ------------------------------------------------------------------------------


def test_save_to_same_folder_gives_the_output_its_own_data_file(tmp_path, feeds):
    """The output never depends on the input's data file, which holds weights a fix may supersede."""
    src = build(tmp_path)
    data_before = sha(tmp_path / "weights.data")
    out = tmp_path / "out.onnx"
    save_model(load_model(src), out)
    assert external_locations(out) == {"w": "out.data"}
    assert out.stat().st_size < 1024  # the 1152-byte weight is not inline
    assert (tmp_path / "out.data").read_bytes() == (tmp_path / "weights.data").read_bytes()
    assert sha(tmp_path / "weights.data") == data_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "out.data", "out.onnx", "weights.data"]
    for a, b in zip(run_ort(src, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_save_to_another_folder_copies_the_referenced_bytes(tmp_path, feeds):
    src = build(tmp_path / "src")
    data = tmp_path / "src" / "weights.data"
    data_before = sha(data)
    dest = tmp_path / "dest"
    dest.mkdir()
    out = dest / "out.onnx"
    save_model(load_model(src), out)
    assert external_locations(out) == {"w": "out.data"}
    copy = dest / "out.data"
    assert sha(copy) == data_before
    assert not os.path.samefile(copy, data), "a hard link would let a later in-place edit change the input"
    assert sha(data) == data_before
    assert sorted(p.name for p in dest.iterdir()) == ["out.data", "out.onnx"]
    for a, b in zip(run_ort(src, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_output_data_file_does_not_clobber_an_existing_one(tmp_path, feeds):
    src = build(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out.data").write_bytes(b"someone else's weights")
    out = dest / "out.onnx"
    save_model(load_model(src), out)
    assert (dest / "out.data").read_bytes() == b"someone else's weights"
    new_name = external_locations(out)["w"]
    assert new_name != "out.data"
    assert sha(dest / new_name) == sha(tmp_path / "src" / "weights.data")
    for a, b in zip(run_ort(src, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_output_data_file_holds_only_referenced_bytes(tmp_path, feeds):
    """A data file with bytes no tensor references (superseded weights) is not carried along."""
    src = build(tmp_path)
    referenced = (tmp_path / "weights.data").read_bytes()
    proto = onnx.load(str(src), load_external_data=False)
    with open(tmp_path / "weights.data", "ab") as handle:
        handle.write(b"\x7f" * 4096)  # an old weight nothing points at any more
    onnx.save(proto, str(src))
    out = tmp_path / "out.onnx"
    save_model(load_model(src), out)
    assert (tmp_path / external_locations(out)["w"]).read_bytes() == referenced
    for a, b in zip(run_ort(src, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_saved_model_stays_valid_after_a_fix(tmp_path, feeds):
    """A real edit (QDQ201's fix reshapes a scale) still saves with the weight external."""
    from conftest import apply_fix

    src = build(tmp_path)
    model = load_model(src)
    assert apply_fix(model, "QDQ201")
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    assert external_locations(out) == {"w": "fixed.data"}
    assert [f for f in cli_json(out)["findings"] if f["code"] == "QDQ201"] == []
    for a, b in zip(run_ort(src, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def cli_json(path: Path) -> dict:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert cli.main(["lint", str(path), "--format", "json", "--exit-zero"]) == 0
    return json.loads(buffer.getvalue())


def test_lint_never_reads_the_external_weights(tmp_path, monkeypatch):
    """Garbage in the data file (and a to_array that refuses external tensors) changes nothing."""
    src = build(tmp_path)
    before = cli_json(src)
    # The output pair's [1]-shaped scale and zero-point: one finding on its Q, one on its DQ.
    assert [f["code"] for f in before["findings"]] == ["QDQ201"] * 2

    data = tmp_path / "weights.data"
    data.write_bytes(b"\xff" * data.stat().st_size)  # NaN everywhere if anyone decoded it
    real_to_array = onnx.numpy_helper.to_array

    def to_array(tensor, *args, **kwargs):
        if tensor.data_location == TensorProto.EXTERNAL:
            raise AssertionError(f"lint read the external tensor {tensor.name}")
        return real_to_array(tensor, *args, **kwargs)

    monkeypatch.setattr(onnx.numpy_helper, "to_array", to_array)
    assert cli_json(src) == before
