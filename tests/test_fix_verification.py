"""`qdq fix`'s numerical check: the inputs `qdq verify` would feed, a skipped check when no inputs
can be made, and a model whose outputs moved past tolerance written only with --keep-failed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from onnx import TensorProto
from test_verify import low_precision_input

import cli

RNG = np.random.default_rng(0)


def qdq(capsys, *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "unexpected" not in err, err
    return code, out, err


def float_input_conv(path: Path) -> Path:
    """x (float, no Q) -> Conv with an int8 weight -> Relu -> y: TensorRT's QDQ801 quantizes x."""
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 6, 6])
    w = b.weight("w", (RNG.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), 0.02)
    conv = b.node("Conv", [x, w, b.init("bias", np.zeros(4, np.float32))], name="conv", pads=[1, 1, 1, 1])
    b.node("Relu", [conv], ["y"], name="relu")
    b.output("y", ["N", 4, 6, 6])
    return b.save(path)


def non_pow2_qdq(path: Path) -> Path:
    """x -> Q/DQ (scale 0.03) -> Conv (weight scale 0.02) -> Q/DQ (0.05) -> y: the NPU fix rounds
    every scale to a power of two, which moves the outputs a little."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 6, 6]), 0.03)
    w = b.weight("w", (RNG.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), 0.02)
    conv = b.node("Conv", [x, w], name="conv", pads=[1, 1, 1, 1])
    b.node("Identity", [b.qdq(conv, 0.05)], ["y"], name="out")
    b.output("y", [1, 4, 6, 6])
    return b.save(path)


# --- the same inputs as qdq verify ------------------------------------------------------------------


def test_fix_and_verify_feed_the_same_inputs(capsys, tmp_path):
    """The input has no Q, the fixed model has one: both commands sample x over that Q's range."""
    model = float_input_conv(tmp_path / "m.onnx")
    out = tmp_path / "fixed.onnx"
    np.savez(tmp_path / "cal.npz", x=RNG.standard_normal((8, 4, 6, 6)).astype(np.float32) * 3)
    tolerance = ["--atol", "1", "--rtol", "0", "--min-sqnr", "10", "--seed", "3"]
    code, stdout, _ = qdq(capsys, "fix", model, "--target", "trt", "-o", out, "--calibrate", tmp_path / "cal.npz",
                          "--format", "json", "--isolated", *tolerance)
    fixed = json.loads(stdout)
    assert code == 0 and [c["code"] for c in fixed["changes"]] == ["QDQ801"] and fixed["written"], fixed
    assert any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in onnx.load(str(out)).graph.node)
    code, stdout, _ = qdq(capsys, "verify", model, out, "--target", "trt", "--format", "json", *tolerance)
    verified = json.loads(stdout)
    assert verified["inputs"] == fixed["verification"]["inputs"] == "random (seed 3, 4 sample(s))"
    assert verified["outputs"] == fixed["verification"]["outputs"]
    assert verified["criterion"] == fixed["verification"]["criterion"]
    assert 0 < verified["outputs"][0]["max_abs_error"]


# --- inputs that cannot be made --------------------------------------------------------------------


@pytest.mark.parametrize("elem_type, label", [(TensorProto.INT4, "int4"), (TensorProto.FLOAT8E4M3FN, "float8e4m3fn")])
def test_unfeedable_input_skips_verification(capsys, tmp_path, elem_type, label):
    model = low_precision_input(tmp_path / "m.onnx", elem_type, params_shape=(1,))  # QDQ201 makes them scalars
    note = f"note: verification skipped: input 'x' is {label}, which neither random inputs nor an .npz file can feed"
    np.savez(tmp_path / "x.npz", x=np.zeros(4, np.uint8))
    for inputs in ([], ["--inputs", tmp_path / "x.npz"]):
        out, report = tmp_path / "fixed.onnx", tmp_path / "report.json"
        code, stdout, err = qdq(capsys, "fix", model, "--target", "common", "-o", out, "--report", report,
                                "--isolated", *inputs)
        assert code == 0 and err == "", (code, err)  # lint-clean: the exit code says so alone
        assert note in stdout.splitlines()
        assert stdout.rstrip().endswith("lint-clean at --fail-on warning; outputs not verified")
        document = json.loads(report.read_text())
        assert document["verification"] is None and document["written"] and document["passed"]
        assert document["verification_skipped"] == note.removeprefix("note: verification skipped: ")
        assert [c["code"] for c in document["changes"]] == ["QDQ201", "QDQ201"]
        onnx.checker.check_model(str(out))
        out.unlink()
    code, _, err = qdq(capsys, "verify", model, model)
    assert code == 2 and len(err.splitlines()) == 1 and f"'x' is {label}" in err


# --- a failed verification -------------------------------------------------------------------------


def test_failed_verification_writes_nothing(capsys, tmp_path):
    model = non_pow2_qdq(tmp_path / "m.onnx")
    out = tmp_path / "fixed.onnx"
    code, stdout, _ = qdq(capsys, "fix", model, "--target", "npu", "-o", out, "--min-sqnr", "200", "--isolated")
    assert code == 1 and not out.exists()
    assert stdout.rstrip().endswith(
        "not written: outputs moved past tolerance (use --keep-failed to write it anyway)"
    ), stdout
    code, stdout, _ = qdq(capsys, "fix", model, "--target", "npu", "-o", out, "--min-sqnr", "200", "--isolated",
                          "--format", "json")
    document = json.loads(stdout)
    assert code == 1 and not out.exists() and document["written"] is False
    assert document["verification"]["passed"] is False and document["passed"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_keep_failed_writes_it_anyway(capsys, tmp_path):
    model = non_pow2_qdq(tmp_path / "m.onnx")
    out = tmp_path / "fixed.onnx"
    code, stdout, _ = qdq(capsys, "fix", model, "--target", "npu", "-o", out, "--min-sqnr", "200", "--isolated",
                          "--keep-failed", "--report", tmp_path / "report.json")
    assert code == 1 and out.exists()
    assert stdout.rstrip().endswith("outputs moved past tolerance; written although verification failed"), stdout
    assert json.loads((tmp_path / "report.json").read_text())["written"] is True
    onnx.checker.check_model(str(out))
    # Within tolerance, the model is written without the option, and says so.
    out.unlink()
    code, stdout, _ = qdq(capsys, "fix", model, "--target", "npu", "-o", out, "--isolated", "--format", "json")
    assert code == 0 and out.exists() and json.loads(stdout)["written"] is True


@pytest.mark.parametrize("where", [["--in-place"], ["--dry-run"]])
def test_keep_failed_needs_an_output_file(capsys, tmp_path, where):
    model = non_pow2_qdq(tmp_path / "m.onnx")
    before = model.read_bytes()
    code, stdout, err = qdq(capsys, "fix", model, "--target", "npu", "--keep-failed", *where, "--isolated")
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and "--keep-failed" in err
    assert model.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("shape, expect", [("nope:1x4x6x6", "no graph input named 'nope'"), ("x:1x4", "rank 2")])
def test_bad_input_shape_stops_fix_before_anything_is_written(capsys, tmp_path, shape, expect):
    """Random inputs are drawn after fixing, but --input-shape is checked first, even when nothing changes."""
    model = non_pow2_qdq(tmp_path / "m.onnx")
    for target in ("npu", "common"):  # changes to verify, and none
        code, stdout, err = qdq(capsys, "fix", model, "--target", target, "-o", tmp_path / "fixed.onnx",
                                "--input-shape", shape, "--isolated")
        assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and expect in err, (code, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


# --- verification runs on the very file that is written ----------------------------------------------


def test_verification_checks_the_file_that_is_written(capsys, tmp_path, monkeypatch):
    """The candidate compared is the complete temporary file next to OUT, renamed only afterwards."""
    import qdq.commands.fix as fix_command

    model = non_pow2_qdq(tmp_path / "m.onnx")
    out = tmp_path / "fixed.onnx"
    compared = []
    real_compare = fix_command.judge

    def spy(reference, candidate, *args, **kwargs):
        compared.append((Path(candidate).parent, out.exists()))
        return real_compare(reference, candidate, *args, **kwargs)

    monkeypatch.setattr(fix_command, "judge", spy)
    code, _, _ = qdq(capsys, "fix", model, "--target", "npu", "-o", out)
    assert code == 0 and out.exists()
    assert compared == [(tmp_path, False)]  # in OUT's folder, before OUT existed


def test_a_fixed_model_onnxruntime_cannot_run_is_a_bug_not_bad_input(capsys, tmp_path, monkeypatch):
    """When the input runs and the candidate does not, the one line names the output, not a temporary file."""
    import qdq.commands.fix as fix_command
    from qdq.verification.verify import CandidateFailed

    def broken(reference, candidate, *args, **kwargs):
        raise CandidateFailed(f"{candidate}: onnxruntime failed to run the model: no kernel")

    monkeypatch.setattr(fix_command, "judge", broken)
    model = non_pow2_qdq(tmp_path / "m.onnx")
    out = tmp_path / "fixed.onnx"
    code, _, err = qdq(capsys, "fix", model, "--target", "npu", "-o", out)
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{out}: not written: {out}: onnxruntime failed to run the model" in err and "bug in qdq" in err
    assert ".tmp" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
