"""QDQ204 unfolded-batchnorm: finding and folding Conv → [Div/Mul/Add] → BatchNormalization.

Small graphs: x → Q/DQ → Conv(DQ(W)[, bias]) → chain → y (float, so the fold's arithmetic is
compared directly), fixed through the fix driver and run in onnxruntime with optimisations off.
The expected weights and biases are recomputed here with numpy from the saved file. The last
test exports a real PyTorch FX QAT ConvBn model.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from optional import torch_or_skip
from builders import GraphBuilder
from conftest import apply_fix, findings_of, lint_codes, run_ort
from onnx import numpy_helper

from qdq.engine.fix import fix
from qdq.engine.ruleset import load_rules_file, load_target
from qdq.graph.model import Model, load_model, save_model

C_IN, C_OUT, EPS = 3, 4, 1e-5
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, C_IN, 6, 6)).astype(np.float32)


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def weight_values(shape, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def data_input(b: GraphBuilder, shape=(2, C_IN, 6, 6)) -> str:
    return b.qdq(b.input("x", list(shape)), scale=0.05, name="x")


def batchnorm(b: GraphBuilder, tensor: str, gamma, beta, mean, var, name: str = "bn") -> str:
    stats = zip(("gamma", "beta", "mean", "var"), (gamma, beta, mean, var))
    params = [b.init(f"{name}_{p}", f32(v)) for p, v in stats]
    return b.node("BatchNormalization", [tensor, *params], name=name, epsilon=EPS)


def bn_stats(seed: int = 2):
    """γ, β, running mean and variance of a BatchNormalization over C_OUT channels."""
    rng = np.random.default_rng(seed)
    gamma, beta = rng.uniform(0.5, 1.5, C_OUT), rng.standard_normal(C_OUT) * 0.1
    return gamma, beta, rng.standard_normal(C_OUT) * 0.2, rng.uniform(0.5, 2, C_OUT)


def save(b: GraphBuilder, tmp_path: Path, name: str = "m.onnx") -> Path:
    proto = b.model()
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path / name
    onnx.save(proto, str(path))
    return path


def fold(path: Path, tmp_path: Path, ruleset=None):
    """Fix QDQ204 once; returns the changes, the saved fixed file, outputs before and after."""
    model = load_model(path)
    changes = apply_fix(model, "QDQ204", ruleset or "common")
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    return changes, out, run_ort(path, {"x": X}), run_ort(out, {"x": X})


def arrays(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def node_of(path: Path, name: str) -> onnx.NodeProto:
    return next(n for n in onnx.load(str(path)).graph.node if n.name == name)


def ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def assert_clean_and_settled(path: Path) -> None:
    model = load_model(path)
    assert "QDQ204" not in lint_codes(model)
    assert apply_fix(model, "QDQ204") == []


def sqnr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((reference - other) ** 2.0)))


# --- the FX QAT pattern: Conv → Div(γ/σ) → BatchNormalization, k ≡ 1 --------------------------------------


def fx_pattern(b: GraphBuilder, bias=None) -> str:
    gamma, beta, mean, var = bn_stats()
    c = f32(f32(gamma) / np.sqrt(f32(var) + f32(EPS)))  # what torch divides by, in float32
    w = b.weight("w", weight_values((C_OUT, C_IN, 3, 3)) * c.reshape(-1, 1, 1, 1), scale=0.01)
    inputs = [data_input(b), w] + ([b.init("b", f32(bias))] if bias is not None else [])
    conv = b.node("Conv", inputs, name="conv", pads=[1, 1, 1, 1])
    div = b.node("Div", [conv, b.init("c", c.reshape(1, -1, 1, 1))], name="div")
    return batchnorm(b, div, gamma, beta, mean, var)


def test_fx_pattern_is_found_with_the_chain_named(builder, tmp_path):
    builder.output(builder.node("Relu", [fx_pattern(builder)], ["y"], name="relu"), [2, C_OUT, 6, 6])
    (finding,) = findings_of(load_model(save(builder, tmp_path)), "QDQ204")
    assert finding.node == "conv" and finding.fix is not None
    assert finding.message == (
        "conv: Div → BatchNormalization after the quantized Conv blocks its fusion with the output Q"
    )
    assert finding.values["max_abs_k_minus_1"] < 1e-6


@pytest.mark.parametrize("bias", [None, [0.1, -0.2, 0.3, 0.05]], ids=["no-bias", "float-bias"])
def test_fx_pattern_folds_exactly_into_the_bias(builder, tmp_path, bias):
    builder.output(builder.node("Relu", [fx_pattern(builder, bias)], ["y"], name="relu"), [2, C_OUT, 6, 6])
    path = save(builder, tmp_path)
    changes, out, before, after = fold(path, tmp_path)
    (change,) = changes
    assert change.old == "Conv + Div + BatchNormalization" and change.new == "Conv"
    assert change.values["exact"] is True and change.values["weight"] == "kept"
    assert sorted(ops(out)) == ["Conv", "DequantizeLinear", "DequantizeLinear", "QuantizeLinear", "Relu"]
    assert node_of(out, "conv").input[1] == "w_dq_out"  # the weight is untouched
    np.testing.assert_allclose(after[0], before[0], rtol=0, atol=1e-6)
    gamma, beta, mean, var = bn_stats()
    expected = beta - gamma * mean / np.sqrt(var + EPS) + (0 if bias is None else np.asarray(bias))
    np.testing.assert_allclose(arrays(out)[node_of(out, "conv").input[2]], expected, rtol=1e-6, atol=1e-7)
    assert_clean_and_settled(out)


def test_batchnorm_output_that_is_a_graph_output_keeps_its_name(builder, tmp_path):
    builder.output(fx_pattern(builder), [2, C_OUT, 6, 6])
    path = save(builder, tmp_path)
    _, out, before, after = fold(path, tmp_path)
    assert list(node_of(out, "conv").output) == ["bn_out"]
    assert [o.name for o in onnx.load(str(out)).graph.output] == ["bn_out"]
    np.testing.assert_allclose(after[0], before[0], rtol=0, atol=1e-6)


def test_batchnorm_output_read_twice_is_still_folded(builder, tmp_path):
    y = fx_pattern(builder)
    builder.output(builder.node("Relu", [y], ["y"], name="relu"), [2, C_OUT, 6, 6])
    builder.output(builder.node("Sigmoid", [y], ["z"], name="sigmoid"), [2, C_OUT, 6, 6])
    changes, _, before, after = fold(save(builder, tmp_path), tmp_path)
    assert len(changes) == 1
    for old, new in zip(before, after):
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-6)


# --- k ≠ 1: scales multiplied, or the weight re-quantized ----------------------------------------------


def test_per_channel_weight_takes_k_in_its_scales(builder, tmp_path):
    gamma, beta, mean, var = bn_stats()
    gamma[2] = -gamma[2]  # a negative factor mirrors that channel's integers
    scales = f32([0.01, 0.02, 0.015, 0.012])
    w = builder.weight("w", weight_values((C_OUT, C_IN, 3, 3)), scale=scales, axis=0)
    conv = builder.node("Conv", [data_input(builder), w], name="conv", pads=[1, 1, 1, 1])
    builder.output(batchnorm(builder, conv, gamma, beta, mean, var), [2, C_OUT, 6, 6])
    path = save(builder, tmp_path)
    changes, out, before, after = fold(path, tmp_path)
    (change,) = changes
    assert change.values["weight"] == "scales multiplied" and change.values["exact"] is True
    assert change.values["saturated"] == 0
    k = gamma / np.sqrt(var + EPS)
    dq = node_of(out, "w_dq")
    old, new = arrays(path)["w_q"].astype(int), arrays(out)[dq.input[0]].astype(int)
    sign = np.sign(k).reshape(-1, 1, 1, 1)
    np.testing.assert_array_equal(new, sign * old)
    np.testing.assert_allclose(arrays(out)[dq.input[1]], scales * np.abs(k), rtol=1e-7)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    assert_clean_and_settled(out)


def test_weight_behind_a_clip_of_stored_integers_is_folded(builder, tmp_path):
    """Issue 39: Brevitas stores 4-bit weights as int8 → Clip(-7, 7) → per-channel DQ and keeps the
    BatchNorm. QDQ204 saw no stored weight behind the Clip, so for onnxruntime (no QDQ509 to fold
    the Clip first) the BatchNorm stayed and QDQ804 asked for calibration data. The fold takes the
    clipped integers, k into the scales: exact, and the DQ reads the integers without the Clip."""
    gamma, beta, mean, var = bn_stats()
    scales = f32([0.01, 0.02, 0.015, 0.012])
    stored = np.random.default_rng(3).integers(-9, 10, size=(C_OUT, C_IN, 3, 3)).astype(np.int8)  # some past ±7
    builder.init("w_int", stored)
    bounds = [builder.init("w_lo", np.int8(-7)), builder.init("w_hi", np.int8(7))]
    clipped = builder.node("Clip", ["w_int", *bounds], name="w_clip")
    w = builder.node("DequantizeLinear", [clipped, *builder.qparams("w", scales)], name="w_dq", axis=0)
    conv = builder.node("Conv", [data_input(builder), w], name="conv", pads=[1, 1, 1, 1])
    builder.output(batchnorm(builder, conv, gamma, beta, mean, var), [2, C_OUT, 6, 6])
    path = save(builder, tmp_path)
    [finding] = findings_of(load_model(path), "QDQ204", "ort")
    assert finding.fix is not None
    (change,), out, before, after = fold(path, tmp_path, "ort")
    assert change.values["weight"] == "scales multiplied" and change.values["exact"] is True
    dq = node_of(out, "w_dq")
    assert "Clip" not in ops(out)
    np.testing.assert_array_equal(arrays(out)[dq.input[0]], np.clip(stored, -7, 7))
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)


def test_per_tensor_weight_is_requantized_and_the_cost_reported(builder, tmp_path):
    gamma, beta, mean, var = bn_stats()
    w = builder.weight("w", weight_values((C_OUT, C_IN, 3, 3)), scale=0.01)
    conv = builder.node("Conv", [data_input(builder), w, builder.init("b", f32([0.1, 0.2, 0.3, 0.4]))], name="conv")
    builder.output(batchnorm(builder, conv, gamma, beta, mean, var), [2, C_OUT, 4, 4])
    path = save(builder, tmp_path)
    (change,), out, before, after = fold(path, tmp_path)
    values = change.values
    assert values["weight"] == "re-quantized" and values["exact"] is False
    assert values["saturated"] == 0 and values["sqnr_db"] > 35
    assert "weight SQNR" in change.description
    # The new per-tensor scale is the smallest that holds every folded weight on [-128, 127].
    k = gamma / np.sqrt(var + EPS)
    ideal = k.reshape(-1, 1, 1, 1) * arrays(path)["w_q"] * np.float32(0.01)
    dq = node_of(out, "w_dq")
    new_scale = float(arrays(out)[dq.input[1]])
    assert new_scale == pytest.approx(max(ideal.max() / 127, -ideal.min() / 128), rel=1e-6)
    assert sqnr_db(before[0], after[0]) > 35
    assert_clean_and_settled(out)


def test_scalar_mul_keeps_a_per_tensor_weight_by_scaling_it(builder, tmp_path):
    w = builder.weight("w", weight_values((C_OUT, C_IN, 3, 3)), scale=0.01)
    conv = builder.node("Conv", [data_input(builder), w], name="conv")
    builder.output(builder.node("Mul", [conv, builder.init("m", f32(0.5))], ["y"], name="mul"), [2, C_OUT, 4, 4])
    path = save(builder, tmp_path)
    (change,), out, before, after = fold(path, tmp_path)
    assert change.old == "Conv + Mul" and change.values["weight"] == "scales multiplied"
    dq = node_of(out, "w_dq")
    np.testing.assert_array_equal(arrays(out)[dq.input[0]], arrays(path)["w_q"])
    assert float(arrays(out)[dq.input[1]]) == np.float32(0.005)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6, atol=1e-6)


def test_int32_bias_is_requantized_at_input_times_new_weight_scale(builder, tmp_path):
    gamma, beta, mean, var = bn_stats()
    s_x, scales = np.float32(0.05), f32([0.01, 0.02, 0.015, 0.012])
    w = builder.weight("w", weight_values((C_OUT, C_IN, 3, 3)), scale=scales, axis=0)
    bias_scale = s_x * scales
    builder.init("b_int", np.asarray([100, -250, 40, 3000], np.int32))
    bias_params = [builder.init("b_scale", bias_scale), builder.init("b_zp", np.zeros(4, np.int32))]
    bias = builder.node("DequantizeLinear", ["b_int", *bias_params], name="b_dq", axis=0)
    conv = builder.node("Conv", [data_input(builder), w, bias], name="conv")
    builder.output(batchnorm(builder, conv, gamma, beta, mean, var), [2, C_OUT, 4, 4])
    path = save(builder, tmp_path)
    (change,), out, before, after = fold(path, tmp_path)
    assert change.values["exact"] is False and change.values["bias_saturated"] == 0
    k = gamma / np.sqrt(var + EPS)
    saved = onnx.load(str(out))
    (bias_dq,) = [n for n in saved.graph.node if n.output[0] == node_of(out, "conv").input[2]]
    new_ints, new_scale = arrays(out)[bias_dq.input[0]], arrays(out)[bias_dq.input[1]]
    assert new_ints.dtype == np.int32
    weight_scale = arrays(out)[node_of(out, "w_dq").input[1]]
    np.testing.assert_allclose(weight_scale, scales * np.abs(k), rtol=1e-7)
    np.testing.assert_array_equal(new_scale, s_x * weight_scale)  # as QDQ606 and the runtimes compute it
    real = k * (np.asarray([100, -250, 40, 3000]) * bias_scale) + beta - k * mean
    np.testing.assert_array_equal(new_ints, np.rint(real / new_scale.astype(np.float64)))
    np.testing.assert_allclose(after[0], before[0], atol=float(new_scale.max()))
    assert_clean_and_settled(out)


# --- ConvTranspose and Gemm ---------------------------------------------------------------------------


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose(builder, tmp_path, group):
    gamma, beta, mean, var = bn_stats()
    if group == 1:  # [C_in, C_out, kh, kw], per-channel on axis 1: scales multiplied
        w = builder.weight("w", weight_values((C_IN, C_OUT, 2, 2)), scale=f32([0.01, 0.02, 0.015, 0.012]), axis=1)
        x = data_input(builder)
    else:  # grouped, per-tensor: re-quantized with k laid out over [C_in, C_out/g, kh, kw]
        w = builder.weight("w", weight_values((4, C_OUT // 2, 2, 2)), scale=0.01)
        x = data_input(builder, (2, 4, 6, 6))
    conv = builder.node("ConvTranspose", [x, w], name="conv", strides=[2, 2], group=group)
    builder.output(batchnorm(builder, conv, gamma, beta, mean, var), [2, C_OUT, 12, 12])
    path = save(builder, tmp_path)
    feeds = {"x": RNG.standard_normal((2, C_IN if group == 1 else 4, 6, 6)).astype(np.float32)}
    model = load_model(path)
    (change,) = apply_fix(model, "QDQ204")
    save_model(model, tmp_path / "fixed.onnx")
    before, after = run_ort(path, feeds)[0], run_ort(tmp_path / "fixed.onnx", feeds)[0]
    if group == 1:
        assert change.values["weight"] == "scales multiplied"
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    else:
        assert change.values["weight"] == "re-quantized"
        assert sqnr_db(before, after) > 35


def test_gemm_with_trans_b_and_beta(builder, tmp_path):
    gamma, beta, mean, var = bn_stats()
    x = builder.qdq(builder.input("x", [2, 6]), scale=0.05, name="x")
    w = builder.weight("w", weight_values((C_OUT, 6)), scale=f32([0.01, 0.02, 0.015, 0.012]), axis=0)
    c = builder.init("c", f32([0.1, 0.2, 0.3, 0.4]))
    gemm = builder.node("Gemm", [x, w, c], name="gemm", transB=1, beta=0.5)
    builder.output(batchnorm(builder, gemm, gamma, beta, mean, var), [2, C_OUT])
    path = save(builder, tmp_path)
    feeds = {"x": RNG.standard_normal((2, 6)).astype(np.float32)}
    model = load_model(path)
    (change,) = apply_fix(model, "QDQ204")
    save_model(model, tmp_path / "fixed.onnx")
    assert change.values["weight"] == "scales multiplied"
    after, before = run_ort(tmp_path / "fixed.onnx", feeds)[0], run_ort(path, feeds)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


# --- what is not reported, or not fixed -----------------------------------------------------------------


def plain_conv(b: GraphBuilder, quantized: bool = True) -> str:
    values = weight_values((C_OUT, C_IN, 3, 3))
    w = b.weight("w", values, scale=0.01) if quantized else b.init("w", values)
    return b.node("Conv", [data_input(b), w], name="conv")


def test_conv_output_read_twice_is_not_reported(builder, tmp_path):
    conv = plain_conv(builder)
    builder.output(batchnorm(builder, conv, *bn_stats()), [2, C_OUT, 4, 4])
    builder.output(builder.node("Relu", [conv], ["r"], name="relu"), [2, C_OUT, 4, 4])
    assert findings_of(load_model(save(builder, tmp_path)), "QDQ204") == []


def test_div_by_a_computed_tensor_is_not_reported(builder, tmp_path):
    conv = plain_conv(builder)
    divisor = builder.node("Abs", [builder.input("d", [1, C_OUT, 1, 1])], name="abs")
    builder.output(batchnorm(builder, builder.node("Div", [conv, divisor], name="div"), *bn_stats()), [2, C_OUT, 4, 4])
    assert findings_of(load_model(save(builder, tmp_path)), "QDQ204") == []


def test_float_conv_is_not_reported(builder, tmp_path):
    builder.output(batchnorm(builder, plain_conv(builder, quantized=False), *bn_stats()), [2, C_OUT, 4, 4])
    assert findings_of(load_model(save(builder, tmp_path)), "QDQ204") == []


def test_constant_minus_conv_ends_the_chain(builder, tmp_path):
    sub = builder.node("Sub", [builder.init("t", f32(1.0)), plain_conv(builder)], name="sub")
    builder.output(batchnorm(builder, sub, *bn_stats()), [2, C_OUT, 4, 4])
    assert findings_of(load_model(save(builder, tmp_path)), "QDQ204") == []


def test_without_fold_scaling_ops_only_chains_ending_in_batchnorm(builder, tmp_path):
    conv = plain_conv(builder)
    bn = batchnorm(builder, conv, *bn_stats())
    builder.output(builder.node("Mul", [bn, builder.init("m", f32(0.5))], ["y"], name="mul"), [2, C_OUT, 4, 4])
    path = save(builder, tmp_path)
    rules = tmp_path / "rules.toml"
    rules.write_text('extends = "common"\n[rules.QDQ204]\nfold_scaling_ops = false\n')
    ruleset = load_rules_file(rules).narrowed(select=["QDQ204"])
    (finding,) = findings_of(load_model(path), "QDQ204")
    assert finding.values["max_abs_k_minus_1"] > 0 and "Mul" in finding.message
    model = load_model(path)
    (change,) = fix(model, ruleset, max_rounds=1).changes
    assert change.old == "Conv + BatchNormalization"
    save_model(model, tmp_path / "fixed.onnx")
    assert ops(tmp_path / "fixed.onnx")[-2:] == ["Conv", "Mul"]


def test_shared_weight_with_k_not_one_is_reported_but_not_fixed(builder, tmp_path):
    w = builder.weight("w", weight_values((C_OUT, C_IN, 3, 3)), scale=0.01)
    x = data_input(builder)
    conv = builder.node("Conv", [x, w], name="conv")
    builder.output(batchnorm(builder, conv, *bn_stats()), [2, C_OUT, 4, 4])
    builder.output(builder.node("Conv", [x, w], ["other"], name="other"), [2, C_OUT, 4, 4])
    model = load_model(save(builder, tmp_path))
    (finding,) = findings_of(model, "QDQ204")
    assert finding.fix is None and finding.message.endswith("(not fixable: the weight is shared with other ops)")
    assert apply_fix(model, "QDQ204") == []


# --- a real PyTorch FX QAT export ---------------------------------------------------------------------------


def export_fx_conv_bn_relu(path: Path) -> Path:
    torch = torch_or_skip()
    from torch import nn
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    from qdq.fx import export, int8_backend_config, symmetric_int8_qconfig_mapping

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    example = torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        prepared = prepare_qat_fx(model.train(), symmetric_int8_qconfig_mapping(), (example,),
                                  backend_config=int8_backend_config())
        optimizer = torch.optim.SGD(prepared.parameters(), lr=0.01)
        for _ in range(5):  # moves weights and BN statistics away from their initial values
            loss = prepared(torch.randn(4, 3, 8, 8)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    prepared.eval()
    return export(prepared, (example,), path, input_names=["x"], output_names=["y"])


def test_fx_qat_conv_bn_relu_export_is_folded(tmp_path):
    path = export_fx_conv_bn_relu(tmp_path / "fx.onnx")
    chain = [op for op in ops(path) if op not in ("QuantizeLinear", "DequantizeLinear", "Identity", "Constant")]
    assert chain == ["Conv", "Div", "BatchNormalization", "Relu"]
    model: Model = load_model(path)
    (finding,) = findings_of(model, "QDQ204")
    assert finding.values["max_abs_k_minus_1"] < 1e-6
    result = fix(model, load_target("common"))
    (change,) = [c for c in result.changes if c.code == "QDQ204"]
    assert change.values["exact"] is True
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    assert "BatchNormalization" not in ops(out) and "Div" not in ops(out)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    before, after = run_ort(path, feeds)[0], run_ort(out, feeds)[0]
    assert np.max(np.abs(after - before)) <= 1e-6
    assert "QDQ204" not in lint_codes(load_model(out))


def test_float_weight_behind_a_quantize_is_scaled_as_a_float(builder, tmp_path):
    """FX keeps float weights behind Q → DQ: the fold writes k·W and the Q re-quantizes it at run time."""
    gamma, beta, mean, var = bn_stats()
    values = weight_values((C_OUT, C_IN, 3, 3))
    w = builder.qdq(builder.init("w", values), scale=float(np.abs(values).max() / 127), name="wq")
    conv = builder.node("Conv", [data_input(builder), w], name="conv")
    builder.output(batchnorm(builder, conv, gamma, beta, mean, var), [2, C_OUT, 4, 4])
    path = save(builder, tmp_path)
    (change,), out, before, after = fold(path, tmp_path)
    assert change.values["weight"] == "re-quantized" and change.values["saturated"] == 0
    q = node_of(out, "wq_q")
    k = gamma / np.sqrt(var + EPS)
    np.testing.assert_allclose(arrays(out)[q.input[0]], k.reshape(-1, 1, 1, 1) * values, rtol=1e-6)
    assert q.input[1] == node_of(out, "wq_dq").input[1]  # Q and DQ still share one scale
    assert sqnr_db(before[0], after[0]) > 35


def test_bundled_fx_demo_folds_div_add_batchnorm_bit_exactly(tmp_path):
    """The demo's ConvBn layers had a conv bias, which FX adds between the Div and the BN."""
    path = Path(__file__).resolve().parent.parent / "examples" / "models" / "demo_fx_qat.onnx"
    model = load_model(path)
    findings = findings_of(model, "QDQ204")
    assert [f.message.split(": ")[1].split(" after")[0] for f in findings] == ["Div → Add → BatchNormalization"] * 5
    changes = apply_fix(model, "QDQ204")
    assert [c.values["exact"] for c in changes] == [True] * 5
    save_model(model, tmp_path / "fixed.onnx")
    feeds = {"input": np.random.default_rng(4).standard_normal((1, 1, 32, 32)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(tmp_path / "fixed.onnx", feeds)[0], run_ort(path, feeds)[0])


def test_negative_factor_on_minus_128_saturates_and_is_reported(builder, tmp_path):
    ints = np.full((C_OUT, C_IN, 1, 1), 5, np.int8)
    ints[1, 0] = -128  # mirrored to +128, which int8 cannot hold
    builder.init("w_q", ints)
    w = builder.dq("w_q", scale=f32([0.01] * C_OUT), name="w_dq", axis=0)
    conv = builder.node("Conv", [data_input(builder), w], name="conv")
    gamma, beta, mean, var = bn_stats()
    builder.output(batchnorm(builder, conv, -gamma, beta, mean, var), [2, C_OUT, 6, 6])
    (change,), out, _, _ = fold(save(builder, tmp_path), tmp_path)
    assert change.values["weight"] == "scales multiplied"
    assert change.values["saturated"] == 1 and change.values["exact"] is False
    assert "1 weight value(s) saturate" in change.description
    assert arrays(out)[node_of(out, "w_dq").input[0]][1, 0, 0, 0] == 127
