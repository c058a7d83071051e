"""Cross-layer equalization (QDQ510) and bias correction (QDQ511) on the NPU rule set.

The model is a depthwise → Relu → 1×1 chain whose depthwise channels span a 100× range, as
after BatchNorm folding, with per-channel int8 weights: the case one per-tensor power-of-two
grid serves worst. Equalization must be exact in float, lower the error of the per-tensor
grids, and bring the fixed model's outputs closer to the input's than the fix without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_run import qdq
from qdq.quant import equalize
from qdq.rewrite import bias_correction

CHANNELS, OUTPUTS, SIZE = 8, 6, 10
# The npu rule set ships QDQ510 and QDQ511 off (docs/benchmarks.md); a user turns them on with this file.
OPT_IN = Path(__file__).resolve().parent.parent / "examples" / "rules" / "npu_accuracy.toml"
OPTED_IN = ["--rules", str(OPT_IN)]
MEAN = 1.5  # of the inputs in the bias correction tests


def _weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Depthwise weights whose channel ranges span 100×, and a 1×1 conv reading them (large where they are small)."""
    rng = np.random.default_rng(seed)
    spread = np.geomspace(0.02, 2.0, CHANNELS)
    dw = rng.normal(size=(CHANNELS, 1, 3, 3)) * spread[:, None, None, None]
    pw = rng.normal(size=(OUTPUTS, CHANNELS, 1, 1)) * (0.5 / np.sqrt(spread))[None, :, None, None]
    return (dw.astype(np.float32), (rng.normal(size=CHANNELS) * spread).astype(np.float32),
            pw.astype(np.float32), (rng.normal(size=OUTPUTS) * 0.1).astype(np.float32))


def _between(between: str, bound: float | None) -> tuple[str, list, list]:
    """What the depthwise conv writes, and the nodes and constants from there to `r`, the 1×1 conv's input."""
    if between == "none":
        return "r", [], []
    if between == "Clip":
        bounds = [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(bound), "hi")]
        return "a", [helper.make_node("Clip", ["a", "lo", "hi"], ["r"])], bounds
    return "a", [helper.make_node("Relu", ["a"], ["r"])], []


def _float_chain(dw, b_dw, pw, b_pw, between: str = "Relu", bound: float | None = None) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(v, n) for v, n in ((dw, "dw"), (b_dw, "b_dw"), (pw, "pw"), (b_pw, "b_pw"))]
    written, activation, bounds = _between(between, bound)
    nodes = [helper.make_node("Conv", ["x", "dw", "b_dw"], [written], group=CHANNELS, pads=[1, 1, 1, 1]), *activation]
    inits += bounds
    nodes.append(helper.make_node("Conv", ["r", "pw", "b_pw"], ["y"]))
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _run(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    source = model if isinstance(model, str) else model.SerializeToString()
    session = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _inputs(count: int = 4, seed: int = 1, mean: float = 0.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(count, 1, CHANNELS, SIZE, SIZE)) + mean).astype(np.float32)


def _per_channel(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.abs(weight).reshape(weight.shape[0], -1).max(axis=1) / 127
    return np.rint(weight / scale[:, None, None, None]).astype(np.int8), scale.astype(np.float32)


def _qdq_chain(tmp_path, between: str = "Relu", bound: float | None = None, mean: float = 0.0) -> str:
    """The chain as onnxruntime's quantize_static writes it (per-channel int8 weights, uint8 activations, int8
    between two convs with nothing between them), with float biases."""
    dw, b_dw, pw, b_pw = _weights()
    float_model = _float_chain(dw, b_dw, pw, b_pw, between, bound)
    inits, nodes = [], []

    def qdq_activation(name: str, scale: float, zero_point: np.integer) -> str:
        inits.extend([numpy_helper.from_array(np.float32(scale), f"{name}_s"),
                      numpy_helper.from_array(zero_point, f"{name}_z")])
        nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"]))
        return f"{name}_dq"

    def weight(name: str, values: np.ndarray) -> str:
        q, s = _per_channel(values)
        inits.extend([numpy_helper.from_array(q, f"{name}_q"), numpy_helper.from_array(s, f"{name}_s"),
                      numpy_helper.from_array(np.zeros(s.size, np.int8), f"{name}_z")])
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                                      axis=0))
        return f"{name}_dq"

    # Activation scales from the float model's ranges on the test inputs, as a calibrator would set them.
    probe = float_model
    probe.graph.output.extend([helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [session.run(None, {"x": x}) for x in _inputs(mean=mean)]
    r_max = max(float(np.abs(o[1]).max()) for o in outs)
    y_max = max(float(np.abs(o[0]).max()) for o in outs)
    x_in = qdq_activation("x", 8 / 127, np.uint8(128))
    written, activation, bounds = _between(between, bound)
    nodes.append(helper.make_node("Conv", [x_in, weight("dw", dw), "b_dw"], [written], group=CHANNELS,
                                  pads=[1, 1, 1, 1]))
    nodes += activation
    inits += [numpy_helper.from_array(b_dw, "b_dw"), *bounds]
    r_in = qdq_activation("r", r_max / 127, np.int8(0)) if between == "none" else qdq_activation("r", r_max / 255,
                                                                                                  np.uint8(0))
    nodes.append(helper.make_node("Conv", [r_in, weight("pw", pw), "b_pw"], ["y"]))
    inits.append(numpy_helper.from_array(b_pw, "b_pw"))
    nodes.append(helper.make_node("QuantizeLinear", ["y", "y_s", "y_z"], ["y_q"]))
    nodes.append(helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["out"]))
    inits += [numpy_helper.from_array(np.float32(y_max / 127), "y_s"), numpy_helper.from_array(np.int8(0), "y_z")]
    graph = helper.make_graph(nodes, "qdq_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    path = tmp_path / f"chain_{between}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return str(path)


def _fixed(model: str, out: str, *extra: str) -> str:
    run = qdq("fix", model, *OPTED_IN, "-o", out, "--no-verify", "--isolated", *extra)
    assert run.code in (0, 1), run.err
    return out


def _distance(a: str, b: str) -> float:
    """Relative L2 distance of two models' outputs over the test inputs."""
    ya = np.stack([_run(a, x) for x in _inputs()])
    yb = np.stack([_run(b, x) for x in _inputs()])
    return float(np.linalg.norm(ya - yb) / np.linalg.norm(yb))


def test_equalization_is_exact_in_float():
    dw, b_dw, pw, b_pw = _weights()
    factors = equalize.factors([dw, pw], [CHANNELS, 1], iterations=20, max_factor=256.0)
    assert np.ptp(np.log(factors[0])) > 1  # the channels do move, by different factors
    new_dw, new_pw = equalize.scaled([dw, pw], [CHANNELS, 1], factors)
    before = _float_chain(dw, b_dw, pw, b_pw)
    after = _float_chain(new_dw.astype(np.float32), (b_dw / factors[0]).astype(np.float32),
                         new_pw.astype(np.float32), b_pw)
    for x in _inputs():
        expected = _run(before, x)
        assert np.max(np.abs(_run(after, x) - expected)) <= 1e-5 * max(1.0, np.abs(expected).max())
    # Both layers end with the same per-channel ranges: what one per-tensor grid needs.
    assert np.allclose(equalize.output_ranges(new_dw), equalize.input_ranges(new_pw, 1))


def test_equalization_lowers_the_per_tensor_error():
    dw, b_dw, pw, _ = _weights()
    link = equalize.Link(equalize.amplitudes(dw, b_dw, 4.0), 4.0 / 255)
    factors = equalize.factors([dw, pw], [CHANNELS, 1], iterations=20, max_factor=256.0)
    ones = [np.ones(CHANNELS)]
    assert equalize.objective([dw, pw], [CHANNELS, 1], [link], factors) < 0.5 * equalize.objective(
        [dw, pw], [CHANNELS, 1], [link], ones)
    # The depthwise weights' own per-tensor error, in the input's units: the small channels are kept.
    q, step = equalize.pow2_grid(dw)
    q_eq, step_eq = equalize.pow2_grid(equalize.scaled([dw, pw], [CHANNELS, 1], factors)[0])
    small = slice(0, 3)
    error_plain = np.linalg.norm(q[small] * step - dw[small])
    error_eq = np.linalg.norm(equalize.scale_outputs(q_eq * step_eq, factors[0])[small] - dw[small])
    assert error_eq < 0.5 * error_plain


def test_fix_equalizes_the_chain_and_comes_closer_to_the_input(tmp_path):
    model = _qdq_chain(tmp_path)
    plain = _fixed(model, str(tmp_path / "plain.onnx"), "--ignore", "QDQ510")
    equalized = _fixed(model, str(tmp_path / "equalized.onnx"))
    report = qdq("fix", model, *OPTED_IN, "--dry-run", "--format", "json", "--isolated",
                 "--no-verify").json()
    made = [c for c in report["changes"] if c["code"] == "QDQ510"]
    # Two weights, the depthwise bias, and the activation grid between them; each with its cost.
    assert {c["tensor"] for c in made} >= {"dw_q", "pw_q", "b_dw", "r"}
    assert all("sqnr_db" in c["values"] for c in made if c["tensor"] in ("dw_q", "pw_q"))
    assert _distance(equalized, model) < 0.7 * _distance(plain, model)
    # A second fix finds nothing more to equalize: the weights are on their grids.
    again = qdq("fix", equalized, *OPTED_IN, "--dry-run", "--format", "json", "--isolated",
                "--no-verify").json()
    assert not [c for c in again["changes"] if c["code"] == "QDQ510"]


@pytest.mark.parametrize("bound, passed", [(None, True), (6.0, False)])
def test_clip_is_passed_only_without_an_upper_bound(tmp_path, bound, passed):
    between = "Relu" if bound is None else "Clip"
    model = _qdq_chain(tmp_path, between, bound)
    report = qdq("lint", model, *OPTED_IN, "--format", "json", "--isolated").json()
    found = [f for f in report["findings"] if f["code"] == "QDQ510"]
    assert bool(found) == passed


# --- bias correction (QDQ511, and QDQ510 on the convs it equalizes) --------------------------------


def test_shift_is_the_mean_output_change_of_the_rounding():
    dw, _, pw, _ = _weights()
    rounded = np.round(pw * 4) / 4
    means = np.abs(np.random.default_rng(2).normal(size=CHANNELS)) + 0.5
    x = np.broadcast_to(means[None, :, None, None], (1, CHANNELS, SIZE, SIZE)).astype(np.float32)

    def conv(weight: np.ndarray) -> np.ndarray:
        model = _float_chain(np.zeros_like(dw), np.zeros(CHANNELS, np.float32), weight.astype(np.float32),
                             np.zeros(OUTPUTS, np.float32))
        model.graph.node[0].input[0] = "r"  # read x straight into the 1×1 conv
        del model.graph.node[:2]
        model.graph.input[0].name = "r"
        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"r": x})[0]

    expected = (conv(rounded) - conv(pw)).mean(axis=(0, 2, 3))
    assert np.abs(expected).max() > 1e-3
    assert np.allclose(bias_correction.shift(pw.astype(np.float64), rounded, 1, means), expected, atol=1e-5)


def _mean_shift(model: str, reference: str, mean: float) -> float:
    """The norm over output channels of the mean difference of the two models' outputs on the test inputs."""
    difference = np.stack([_run(model, x) - _run(reference, x) for x in _inputs(mean=mean)])
    return float(np.linalg.norm(difference.mean(axis=(0, 1, 3, 4))))


@pytest.mark.parametrize("equalized", [False, True])
def test_bias_correction_lowers_the_mean_output_shift(tmp_path, equalized):
    # Inputs with a mean: the depthwise conv's rounding then shifts its mean output, which its bias can take back.
    model = _qdq_chain(tmp_path, mean=MEAN)
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=_inputs(mean=MEAN)[:, 0])
    ignored = "" if equalized else "QDQ510"
    plain = _fixed(model, str(tmp_path / "plain.onnx"), "--calibrate", str(calibration),
                   "--ignore", ",".join(filter(None, [ignored, "QDQ511"])))
    corrected = _fixed(model, str(tmp_path / "corrected.onnx"), "--calibrate", str(calibration),
                       *(["--ignore", ignored] if ignored else []))
    assert _mean_shift(corrected, model, MEAN) < 0.5 * _mean_shift(plain, model, MEAN)


def test_a_linear_link_is_equalized_only_on_measured_ranges(tmp_path):
    """Without data the amplitude model is a Relu output's; between two linear convs only measured peaks serve."""
    model = _qdq_chain(tmp_path, "none")
    calibration = tmp_path / "calib.npz"
    np.savez(calibration, x=_inputs()[:, 0])
    for data, expected in (([], False), (["--calibrate", str(calibration)], True)):
        report = qdq("fix", model, *OPTED_IN, "--dry-run", "--format", "json", "--isolated",
                     "--no-verify", *data).json()
        assert bool([c for c in report["changes"] if c["code"] == "QDQ510"]) == expected
