"""`qdq verify`: the metrics against numpy, the tolerance gates, inputs (random and .npz), bad input."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from onnx import TensorProto, numpy_helper

import cli
from qdq.support.errors import QdqError
from qdq.verification.verify import UnfeedableInput, compare, compare_arrays, load_inputs, make_inputs, render_text

SHAPE = [2, 8]


def scaled(path: Path, factor: float, output: str = "y", shape=SHAPE, bias=None) -> Path:
    """y = x * factor (+ bias), float32."""
    b = GraphBuilder()
    x = b.input("x", shape)
    y = b.node("Mul", [x, b.init("factor", np.float32(factor))], name="mul")
    if bias is not None:
        y = b.node("Add", [y, b.init("bias", np.asarray(bias, dtype=np.float32))], name="add")
    b.node("Identity", [y], [output], name="out")
    b.output(output, shape)
    return b.save(path)


def quantized_input(path: Path, scale: float, zero_point, dtype, opset: int = 21) -> Path:
    """x -> Q -> DQ -> y, the Q's zero-point of `dtype` (None: no zero-point, uint8 by default)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", [4, 256])
    params = b.qparams("x", scale, zero_point, dtype, zero_point_used=zero_point is not None)
    xq = b.node("QuantizeLinear", [x, *params], name="q")
    b.node("DequantizeLinear", [xq, *params], ["y"], name="dq")
    b.output("y", [4, 256])
    return b.save(path)


def verify(capsys, *argv: object) -> tuple[int, str, str]:
    code = cli.main(["verify", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(capsys, *argv: object, expect: str = "") -> str:
    code, out, err = verify(capsys, *argv)
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("qdq"), err
    assert "Traceback" not in err and "unexpected" not in err, err
    assert expect in lines[0], (expect, lines[0])
    assert out == ""
    return lines[0]


@pytest.fixture
def ref(tmp_path: Path) -> Path:
    return scaled(tmp_path / "ref.onnx", 1.0)


@pytest.fixture
def off(tmp_path: Path) -> Path:
    return scaled(tmp_path / "off.onnx", 1.01)


def expected_metrics(a: np.ndarray, b: np.ndarray) -> dict:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    d = b - a
    return {
        "max_abs_error": np.max(np.abs(d)),
        "relative_l2": np.linalg.norm(d) / np.linalg.norm(a),
        "cosine": a @ b / (np.linalg.norm(a) * np.linalg.norm(b)),
        "sqnr_db": 10 * np.log10(np.sum(a**2) / np.sum(d**2)),
    }


# --- the comparison ----------------------------------------------------------------------------------


def test_identical_models(capsys, ref, tmp_path):
    same = scaled(tmp_path / "same.onnx", 1.0)
    code, out, err = verify(capsys, ref, same)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "no float twin" in lines[0] and lines[1] == "inputs: random (seed 0, 4 sample(s))"
    assert lines[2] == "criterion: SQNR against the input >= 10 dB"  # a float pair: no twin, said so
    assert lines[4].split()[0] == "y" and lines[4].endswith("identical")
    assert lines[-1].startswith("identical")
    result = compare(ref, same, make_inputs(ref))
    assert result.identical and result.passed
    (o,) = result.outputs
    assert (o.max_abs_error, o.relative_l2, o.cosine, o.sqnr_db, o.mismatched) == (0, 0, 1.0, math.inf, 0)


def test_scaled_output_metrics_match_numpy(ref, off):
    feeds = make_inputs(ref, seed=1)
    x = feeds["x"]
    result = compare(ref, off, feeds, atol=1e-4, rtol=1e-3)
    (o,) = result.outputs
    a, b = x * np.float32(1.0), x * np.float32(1.01)
    want = expected_metrics(a, b)
    assert o.name == "y" and o.shape == (2, 8)
    for key, value in want.items():
        assert getattr(o, key) == pytest.approx(value, rel=1e-9), key
    assert o.sqnr_db == pytest.approx(40.0, abs=0.01)
    assert o.mismatched == int(np.count_nonzero(np.abs(b - a) > 1e-4 + 1e-3 * np.abs(a)))
    assert not o.identical and not o.passed and not result.passed

    loose = compare(ref, off, feeds, atol=1.0, rtol=0.0)
    assert loose.passed and not loose.identical and loose.outputs[0].mismatched == 0


def test_tolerance_exit_codes(capsys, ref, off):
    """--atol/--rtol are gates a user adds to the verdict (1 % off everywhere is 40 dB: the verdict alone passes)."""
    assert verify(capsys, ref, off)[0] == 0
    code, out, _ = verify(capsys, ref, off, "--atol", "1e-6", "--rtol", "0")
    assert code == 1
    assert "FAIL" in out.splitlines()[4] and out.splitlines()[-1].startswith("FAIL: 1 of 1")
    code, out, _ = verify(capsys, ref, off, "--atol", "0", "--rtol", "0.02")
    assert code == 0
    assert out.splitlines()[4].endswith("PASS") and out.splitlines()[-1].startswith("PASS")


def test_min_sqnr(capsys, ref, off):
    # 1 % error everywhere: SQNR = 40 dB.
    assert verify(capsys, ref, off, "--min-sqnr", "39")[0] == 0
    code, out, _ = verify(capsys, ref, off, "--min-sqnr", "41")
    assert code == 1 and "SQNR too low" in out and "SQNR >= 41 dB" in out


def test_nan_in_candidate_fails(capsys, ref, tmp_path):
    bias = np.zeros(SHAPE, dtype=np.float32)
    bias[0, 3] = np.nan
    nan = scaled(tmp_path / "nan.onnx", 1.0, bias=bias)
    code, out, _ = verify(capsys, ref, nan, "--atol", "1e9")
    assert code == 1 and "NaN/inf" in out
    code, out, _ = verify(capsys, ref, nan, "--atol", "1e9", "--format", "json")
    (o,) = json.loads(out)["outputs"]
    # one NaN per sample, four samples
    assert o["nonfinite"] == 4 and o["mismatched"] == 4 and o["max_abs_error"] == "nan" and not o["passed"]


def test_compare_arrays_edge_cases():
    a = np.array([1.0, np.nan, np.inf, 2.0], dtype=np.float32)
    same = compare_arrays("o", a, a.copy())
    assert same.identical and same.passed and same.sqnr_db == math.inf and same.max_abs_error == 0
    inf = compare_arrays("o", a, np.array([1.0, np.nan, np.inf, np.inf], dtype=np.float32), atol=1e9)
    assert inf.nonfinite == 1 and not inf.passed
    zeros = np.zeros(3, dtype=np.float32)
    both = compare_arrays("o", zeros, zeros)
    assert (both.relative_l2, both.cosine, both.sqnr_db) == (0.0, 1.0, math.inf)
    only_b = compare_arrays("o", zeros, np.ones(3, dtype=np.float32))
    assert (only_b.relative_l2, only_b.cosine, only_b.sqnr_db) == (math.inf, 0.0, -math.inf)
    signed_zero = compare_arrays("o", zeros, -zeros)
    assert not signed_zero.identical and signed_zero.passed


def test_json_report_and_output_file(capsys, ref, off, tmp_path):
    report = tmp_path / "report.json"
    code, out, err = verify(capsys, ref, off, "--format", "json", "-o", report, "--atol", "1e-6")
    assert code == 1 and out == "" and err == ""
    document = json.loads(report.read_text())
    assert set(document) >= {"reference", "candidate", "inputs", "atol", "rtol", "min_sqnr", "outputs", "passed", "identical"}
    assert document["passed"] is False and document["inputs"] == "random (seed 0, 4 sample(s))"
    assert document["criterion"] == "SQNR against the input >= 10 dB; atol 1e-06, rtol 0"
    (o,) = document["outputs"]
    assert set(o) >= {"name", "shape", "max_abs_error", "relative_l2", "cosine", "sqnr_db", "mismatched", "identical",
                      "passed", "input_to_twin", "candidate_to_twin", "allowed", "evidence"}
    assert o["shape"] == [4 * SHAPE[0], SHAPE[1]]  # four samples, concatenated


def test_render_text_aligns_rows(ref, off):
    text = render_text(compare(ref, off, make_inputs(ref)))
    header, columns, row, summary = text.splitlines()
    assert columns.index("result") == row.index("FAIL")
    assert columns.index("SQNR dB") + len("SQNR dB") == row.index("40.0") + len("40.0")


# --- models that cannot be compared ------------------------------------------------------------------


def test_different_output_names(capsys, ref, tmp_path):
    other = scaled(tmp_path / "other.onnx", 1.0, output="z")
    line = assert_usage_error(capsys, ref, other, expect="different outputs")
    assert "only in" in line and "z" in line


def test_different_output_shapes(ref, tmp_path):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    b.node("Reshape", [x, b.init("shape", np.array([16], dtype=np.int64))], ["y"], name="reshape")
    b.output("y", [16])
    flat = b.save(tmp_path / "flat.onnx")
    with pytest.raises(QdqError, match="shape 2x8 .* but 16"):
        compare(ref, flat, make_inputs(ref))


def test_onnxruntime_failure_is_one_line(capsys, ref, tmp_path):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    b.node("Reshape", [x, b.init("shape", np.array([3, -1], dtype=np.int64))], ["y"], name="reshape")
    b.output("y", SHAPE)
    broken = b.save(tmp_path / "broken.onnx")
    assert_usage_error(capsys, ref, broken, expect=str(broken))


def test_bad_options(capsys, ref, off, tmp_path):
    assert_usage_error(capsys, ref, off, "--inputs", tmp_path / "i.npz", "--seed", "1", expect="not allowed with")
    assert_usage_error(capsys, ref, off, "--input-shape", "x:2xa", expect="--input-shape")
    assert_usage_error(capsys, ref, off, "--input-shape", "nope:2x8", expect="'nope'")
    assert_usage_error(capsys, ref, off, "--atol", "-1", expect="--atol")
    assert_usage_error(capsys, ref, tmp_path / "missing.onnx", expect="no such file")


# --- inputs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scale, zero_point, dtype, low, high",
    [
        (0.05, 128, np.uint8, -6.4, 6.35),
        (0.1, 0, np.int8, -12.8, 12.7),
        (0.001, 0, np.int16, -32.768, 32.767),
        (0.02, None, None, 0.0, 5.1),  # no zero-point: uint8
    ],
)
def test_make_inputs_samples_the_q_range(tmp_path, scale, zero_point, dtype, low, high):
    model = quantized_input(tmp_path / "q.onnx", scale, zero_point, dtype)
    x = make_inputs(model, seed=0)["x"]
    assert x.dtype == np.float32 and x.shape == (4, 256)
    assert x.min() >= low - 1e-6 and x.max() <= high + 1e-6
    assert x.min() < low + 0.1 * (high - low) and x.max() > high - 0.1 * (high - low)  # spread over the range


def test_make_inputs_takes_the_q_range_from_the_quantized_candidate(tmp_path):
    b = GraphBuilder()
    b.node("Identity", [b.input("x", [4, 256])], ["y"], name="out")
    b.output("y", [4, 256])
    float_model = b.save(tmp_path / "float.onnx")
    quantized = quantized_input(tmp_path / "q.onnx", 0.05, 128, np.uint8)
    x = make_inputs(float_model, range_from=quantized)["x"]
    assert x.min() >= -6.4 and x.max() <= 6.35 + 1e-6 and x.max() - x.min() > 10


def test_make_inputs_narrows_the_range_to_a_clip_on_the_integers():
    """PyTorch's x86 QAT input quantizer: Q(uint8, s, zp 39) → Clip(max=127) → DQ, so the model sees
    [(0 - 39)·s, (127 - 39)·s], not uint8's whole range (up to 5.26 here, where the model clips at 2.14)."""
    path = Path(__file__).parent / "corpus" / "torch" / "yolo_fx_qat_x86.onnx"
    graph = onnx.load(str(path)).graph
    (q,) = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "input"]
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    constants.update({t.name: numpy_helper.to_array(t) for t in graph.initializer})
    scale, zero_point = float(constants[q.input[1]].ravel()[0]), float(constants[q.input[2]].ravel()[0])
    x = make_inputs(path, seed=0)["input"]
    low, high = (0 - zero_point) * scale, (127 - zero_point) * scale
    assert low - 1e-6 <= x.min() < low + 0.05 and high - 0.05 < x.max() <= high + 1e-6


# The input quantizer of the issue: int8, step 2. Standard normal values would all round to 0 or ±2.
STEP_LOW, STEP_HIGH = -256.0, 254.0


def step2_model(path: Path, params, domain: str = "", another_reader: bool = False, **q_attrs) -> Path:
    """x -> Q -> DQ -> y, the scale (2) and zero-point (int8 0) made by `params(builder)`; with
    `another_reader`, a Relu reads x before the Q does."""
    b = GraphBuilder(opset=21)
    x = b.input("x", [4, 256])
    if another_reader:
        b.node("Relu", [x], ["r"], name="relu")
        b.output("r", [4, 256])
    scale, zero_point = params(b)
    xq = b.node("QuantizeLinear", [x, scale, zero_point], name="q", domain=domain, **q_attrs)
    b.node("DequantizeLinear", [xq, scale, zero_point], ["y"], name="dq", domain=domain)
    b.output("y", [4, 256])
    proto = b.model()
    if domain:
        proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


def initializers(b):
    return b.init("s", np.float32(2.0)), b.init("z", np.int8(0))


def constant_tensors(b):  # Vitis AI / Ryzen AI exports
    return (b.node("Constant", [], ["s"], value=numpy_helper.from_array(np.float32(2.0))),
            b.node("Constant", [], ["z"], value=numpy_helper.from_array(np.int8(0))))


def constant_scalars_and_cast(b):  # value_float; an int64 value_int cast to the int8 zero-point
    zero = b.node("Constant", [], ["z64"], value_int=0)
    return b.node("Constant", [], ["s"], value_float=2.0), b.node("Cast", [zero], ["z"], to=TensorProto.INT8)


def identity_chains(b):  # torch exports read qparams through Identity
    scale = b.node("Identity", [b.node("Identity", [b.init("s0", np.float32(2.0))])])
    return scale, b.node("Identity", [b.init("z0", np.int8(0))])


def float16_scale_cast(b):
    return b.node("Cast", [b.init("s16", np.float16(2.0))], to=TensorProto.FLOAT), b.init("z", np.int8(0))


@pytest.mark.parametrize("params, domain, another_reader", [
    (constant_tensors, "", False),
    (constant_scalars_and_cast, "", False),
    (identity_chains, "", False),
    (float16_scale_cast, "", False),
    (initializers, "com.microsoft", False),
    (initializers, "", True),  # the Q is not the first reader of x
], ids=["Constant", "Constant value_float + Cast", "Identity", "Cast", "com.microsoft", "second reader"])
def test_make_inputs_finds_the_q_range_wherever_the_scale_lives(tmp_path, params, domain, another_reader):
    model = step2_model(tmp_path / "m.onnx", params, domain, another_reader)
    x = make_inputs(model)["x"]
    assert STEP_LOW <= x.min() < STEP_LOW + 5 and STEP_HIGH - 5 < x.max() <= STEP_HIGH, (x.min(), x.max())


def test_make_inputs_per_axis_range_from_constants(tmp_path):
    scales = np.array([0.5, 1.0, 2.0, 4.0], np.float32)

    def per_axis(b):
        zero = b.node("Constant", [], ["z"], value=numpy_helper.from_array(np.zeros(4, np.int8)))
        return b.node("Constant", [], ["s"], value_floats=scales.tolist()), zero

    x = make_inputs(step2_model(tmp_path / "m.onnx", per_axis, axis=0))["x"]
    for row, scale in zip(x, scales):
        assert -128 * scale <= row.min() < -120 * scale and 119 * scale < row.max() <= 127 * scale, (scale, row)


def test_make_inputs_int4_range(tmp_path):
    def int4(b):
        b.initializers.append(onnx.helper.make_tensor("z", TensorProto.INT4, [], [0]))
        return b.init("s", np.float32(2.0)), "z"

    x = make_inputs(step2_model(tmp_path / "m.onnx", int4))["x"]
    assert -16 <= x.min() < -15 and 13 < x.max() <= 14


def test_make_inputs_blocked_q_falls_back_to_normal(tmp_path):
    def blocked(b):
        return b.init("s", np.full((4, 2), 2.0, np.float32)), b.init("z", np.zeros((4, 2), np.int8))

    x = make_inputs(step2_model(tmp_path / "m.onnx", blocked, axis=1, block_size=128))["x"]
    assert np.abs(x).max() < 10  # standard normal, not the +-256 of the blocks' range


def test_make_inputs_is_reproducible(ref):
    assert np.array_equal(make_inputs(ref, seed=7)["x"], make_inputs(ref, seed=7)["x"])
    assert not np.array_equal(make_inputs(ref, seed=7)["x"], make_inputs(ref, seed=8)["x"])


@pytest.mark.parametrize("axis, rows", [(0, 10), (1, 4), (-1, 4)])
def test_token_ids_cover_the_table_they_index(tmp_path, axis, rows):
    """Token ids of a transformer are spread over the embedding table, not all 0 (one token repeated
    says little about a model), and never out of range (the run would fail)."""
    b = GraphBuilder()
    ids = b.input("ids", [4, 16], TensorProto.INT64)
    table = b.init("table", np.arange(40, dtype=np.float32).reshape(10, 4))
    b.node("Gather", [table, ids], ["y"], axis=axis)
    b.output("y", [4, 16, 4] if axis == 0 else [10, 4, 16])
    model = b.save(tmp_path / "m.onnx")
    feeds = make_inputs(model)
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < rows and len(np.unique(feeds["ids"])) == rows
    assert np.array_equal(make_inputs(model)["ids"], feeds["ids"])  # reproducible
    assert compare(model, model, feeds).identical


def test_make_inputs_types_and_dynamic_shapes(tmp_path):
    b = GraphBuilder()
    b.input("x", ["N", 8])
    b.input("ids", [3], TensorProto.INT64)
    b.input("mask", [3], TensorProto.BOOL)
    b.node("Identity", ["x"], ["y"], name="out")
    b.node("Identity", ["ids"], ["ids_out"], name="ids_identity")
    b.node("Identity", ["mask"], ["mask_out"], name="mask_identity")
    b.output("y", ["N", 8])
    b.output("ids_out", [3], TensorProto.INT64)
    b.output("mask_out", [3], TensorProto.BOOL)
    model = b.save(tmp_path / "m.onnx")
    feeds = make_inputs(model)
    assert feeds["x"].shape == (1, 8)
    assert feeds["ids"].dtype == np.int64 and not feeds["ids"].any()
    assert feeds["mask"].dtype == np.bool_ and not feeds["mask"].any()
    assert make_inputs(model, shapes={"x": (5, 8)})["x"].shape == (5, 8)
    with pytest.raises(QdqError, match="axis 1"):
        make_inputs(model, shapes={"x": (5, 9)})
    assert compare(model, model, feeds).identical


def test_input_shape_option(capsys, tmp_path):
    dynamic = scaled(tmp_path / "dyn.onnx", 1.0, shape=["N", 8])
    code, out, _ = verify(capsys, dynamic, dynamic, "--input-shape", "x:3x8", "--format", "json")
    assert code == 0 and json.loads(out)["outputs"][0]["shape"] == [4 * 3, 8]  # four samples of 3x8


def test_string_input_needs_an_npz(capsys, tmp_path):
    b = GraphBuilder()
    b.input("s", [2], TensorProto.STRING)
    b.node("Shape", ["s"], ["n"], name="shape")
    b.output("n", [1], TensorProto.INT64)
    model = b.save(tmp_path / "s.onnx")
    with pytest.raises(UnfeedableInput, match="'s' is string, which random inputs cannot feed; give --inputs"):
        make_inputs(model)
    assert_usage_error(capsys, model, model, expect="'s' is string, which random inputs cannot feed")
    npz = tmp_path / "s.npz"
    np.savez(npz, s=np.array(["a", "bc"]))
    assert compare(model, model, load_inputs(npz, model)).identical
    np.savez(npz, s=np.zeros(2, np.float32))
    assert_usage_error(capsys, model, model, "--inputs", npz, expect="'s' is float32, the model expects strings")


def low_precision_input(path: Path, elem_type: int, params_shape: tuple[int, ...] = ()) -> Path:
    """x (int4 or float8, say) -> DequantizeLinear -> y: a graph input no numpy dtype holds."""
    b = GraphBuilder(opset=21)
    x = b.input("x", [4], elem_type)
    b.initializers.append(onnx.helper.make_tensor("zp", elem_type, params_shape, [0]))
    b.node("DequantizeLinear", [x, b.init("scale", np.full(params_shape, 0.5, np.float32)), "zp"], ["y"], name="dq")
    b.output("y", [4])
    return b.save(path)


@pytest.mark.parametrize("elem_type, label", [(TensorProto.INT4, "int4"), (TensorProto.FLOAT8E4M3FN, "float8e4m3fn")])
def test_low_precision_input_cannot_be_fed(capsys, tmp_path, elem_type, label):
    model = low_precision_input(tmp_path / "m.onnx", elem_type)
    reason = f"input 'x' is {label}, which neither random inputs nor an .npz file can feed"
    with pytest.raises(UnfeedableInput, match=reason) as raised:
        make_inputs(model)
    assert raised.value.reason == reason
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.zeros(4, np.uint8))
    with pytest.raises(UnfeedableInput, match=reason):
        load_inputs(npz, model)
    for argv in ([], ["--inputs", npz]):  # verify was asked to compare and cannot
        code, _, err = verify(capsys, model, model, *argv)
        assert code == 2 and len(err.splitlines()) == 1 and reason in err, (code, err)


def test_input_without_a_shape_is_unfeedable_until_given_one(tmp_path):
    b = GraphBuilder()
    b.inputs.append(onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    b.node("Identity", ["x"], ["y"], name="out")
    b.output("y", None)
    model = b.save(tmp_path / "m.onnx", check=False)  # the checker wants shapes; make_inputs may meet such a file
    with pytest.raises(UnfeedableInput, match="'x' has no declared shape; give --input-shape x:DIMS"):
        make_inputs(model)
    assert make_inputs(model, shapes={"x": (2, 3)})["x"].shape == (2, 3)


def test_npz_round_trip(capsys, ref, off, tmp_path):
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(SHAPE)
    npz = tmp_path / "inputs.npz"
    np.savez(npz, x=x)
    assert np.array_equal(load_inputs(npz, ref)["x"], x)
    code, out, _ = verify(capsys, ref, off, "--inputs", npz, "--atol", "0", "--rtol", "0.02", "--format", "json")
    document = json.loads(out)
    assert code == 0 and document["inputs"] == str(npz)
    assert document["outputs"][0]["max_abs_error"] == pytest.approx(expected_metrics(x, x * np.float32(1.01))["max_abs_error"])


@pytest.mark.parametrize(
    "arrays, expect",
    [
        ({}, "no array for the model input(s) 'x'"),
        ({"x": np.zeros(SHAPE, np.float32), "w": np.zeros(1, np.float32)}, "'w' match no input"),
        ({"x": np.zeros(SHAPE, np.float64)}, "'x' is float64, the model expects float32"),
        ({"x": np.zeros(16, np.float32)}, "'x' has rank 1"),
        ({"x": np.zeros([2, 9], np.float32)}, "'x' has shape 2x9"),
    ],
)
def test_npz_errors(capsys, ref, off, tmp_path, arrays, expect):
    npz = tmp_path / "inputs.npz"
    np.savez(npz, **arrays)
    assert_usage_error(capsys, ref, off, "--inputs", npz, expect=expect)


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"PK\x03\x04 truncated zip", "cannot read as .npz"),
        (b"garbage", "not an .npz archive"),
        (None, "no such file"),
    ],
)
def test_corrupt_or_missing_npz(capsys, ref, off, tmp_path, content, expect):
    npz = tmp_path / "inputs.npz"
    if content is not None:
        npz.write_bytes(content)
    assert_usage_error(capsys, ref, off, "--inputs", npz, expect=expect)


def test_npy_instead_of_npz(capsys, ref, off, tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros(SHAPE, np.float32))
    assert_usage_error(capsys, ref, off, "--inputs", npy, expect="numpy.savez")


def test_both_sessions_are_built_side_by_side_and_the_references_refusal_comes_first(ref, off, tmp_path, capsys):
    """runtime.sessions builds the two models' sessions in threads: each model gets its own outcome,
    a refused reference is the input's fault (QdqError) before a refused candidate is qdq's
    (CandidateFailed), and stdout is the same object afterwards (one redirect, not one per thread)."""
    from qdq.support.runtime import sessions
    from qdq.verification.verify import CandidateFailed

    unloadable = tmp_path / "unloadable.onnx"
    unloadable.write_bytes(b"not a model")
    stdout = sys.stdout
    built = sessions(ref, unloadable, off)
    assert [isinstance(s, Exception) for s in built] == [False, True, False]
    assert sys.stdout is stdout
    feeds = {"x": np.ones(SHAPE, dtype=np.float32)}
    with pytest.raises(CandidateFailed, match="unloadable.onnx: onnxruntime cannot load the model"):
        compare(ref, unloadable, feeds)
    with pytest.raises(QdqError, match="unloadable.onnx: onnxruntime cannot load the model") as refused:
        compare(unloadable, unloadable.with_name("missing.onnx"), feeds)
    assert not isinstance(refused.value, CandidateFailed)
    assert compare(ref, off, feeds).outputs  # two good models still compare
