"""The NPU test models of examples/cnn.py, and the power-of-two fake-quant of qdq.fx.

Three exports of one small CNN (Concat, MaxPool, residual Add, Resize, HardSigmoid, Mul, GAP, Gemm):
the float model, onnxruntime `quantize_static` (symmetric int8, float scales) and FX QAT with
`pow2_int8_qconfig_mapping` (every scale an exact power of two).

Models run with onnxruntime's graph optimisations off (`run_ort`): what runs is what the file
says. With them on, onnxruntime fuses DQ→Gemm→Q into an int8 QGemm that, on x86 CPUs without
VNNI, computes u8×s8 products with VPMADDUBSW and saturates in int16: the ORT model's logits are
then ~40 % off on such a machine (its GAP output sits near +127); `reduce_range` avoids it.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from optional import torch_or_skip
from onnx import numpy_helper

torch = torch_or_skip()

from conftest import run_ort  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import cnn  # noqa: E402

from qdq.fx import export, int8_backend_config, pow2_int8_qconfig_mapping, pow2_scale  # noqa: E402

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@pytest.fixture(scope="module")
def calibration() -> list[np.ndarray]:
    return cnn.calibration_data()


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> Path:
    return cnn.export_float(tmp_path_factory.mktemp("npu_float") / "float.onnx")


@pytest.fixture(scope="module")
def ort_model(tmp_path_factory, float_model, calibration) -> Path:
    return cnn.quantize_ort(float_model, tmp_path_factory.mktemp("npu_ort") / "ort_qdq.onnx", calibration)


@pytest.fixture(scope="module")
def fx_model(tmp_path_factory) -> Path:
    return cnn.export_fx_pow2_qat(tmp_path_factory.mktemp("npu_fx") / "fx_pow2_qat.onnx")


def logits(path: Path, calibration: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([run_ort(path, {"input": x})[0] for x in calibration])


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def qdq_params(path: Path) -> list[tuple[onnx.NodeProto, np.ndarray, np.ndarray]]:
    """(node, scale, zero-point) of every Q/DQ; parameters resolved through Identity to initializers."""
    graph = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}

    def constant(name: str) -> np.ndarray:
        while name not in inits and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        return inits[name]

    return [(n, constant(n.input[1]), constant(n.input[2])) for n in graph.node if n.op_type in QDQ_OPS]


def is_pow2(values: np.ndarray) -> bool:
    values = np.asarray(values, dtype=np.float64).ravel()
    return values.size > 0 and bool(np.all(np.frexp(values)[0] == 0.5))


# --- (1) the float model ------------------------------------------------------------------------


def test_float_model_has_the_npu_op_mix_and_runs(float_model, calibration):
    proto = onnx.load(str(float_model))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == 13
    assert [i.name for i in proto.graph.input] == ["input"] and [o.name for o in proto.graph.output] == ["logits"]
    ops = Counter(n.op_type for n in proto.graph.node)
    for op in ("Concat", "MaxPool", "Add", "Resize", "GlobalAveragePool", "Gemm", "HardSigmoid", "Mul"):
        assert ops[op] >= 1, (op, ops)
    assert ops["HardSigmoid"] == 2 and "HardSwish" not in ops  # x * hardsigmoid(x) stays HardSigmoid + Mul
    assert "BatchNormalization" not in ops  # folded into Conv by the exporter
    out = logits(float_model, calibration)
    assert out.shape == (8, 10) and np.all(np.isfinite(out))
    assert np.ptp(out, axis=0).max() > 0  # the inputs are told apart


# --- (2) onnxruntime quantize_static ------------------------------------------------------------


def test_ort_model_is_symmetric_int8_and_close_to_float(ort_model, float_model, calibration):
    params = qdq_params(ort_model)
    ops = Counter(node.op_type for node, _, _ in params)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > ops["QuantizeLinear"]  # + weights, biases
    assert all(np.all(zp == 0) for _, _, zp in params)
    assert all(zp.dtype == np.int8 for node, _, zp in params if node.op_type == "QuantizeLinear")
    dq_types = Counter(zp.dtype.name for node, _, zp in params if node.op_type == "DequantizeLinear")
    assert dq_types == {"int8": ops["DequantizeLinear"] - 7, "int32": 7}  # 6 Conv + 1 Gemm biases are int32
    assert not is_pow2(np.concatenate([s.ravel() for _, s, _ in params]))  # float scales: the NPU rules' case
    assert relative_error(logits(ort_model, calibration), logits(float_model, calibration)) < 0.10


# --- (3) FX QAT with power-of-two fake-quant ----------------------------------------------------


def test_fx_pow2_export_has_only_pow2_scales(fx_model, float_model, calibration):
    params = qdq_params(fx_model)
    ops = Counter(node.op_type for node, _, _ in params)
    assert ops["QuantizeLinear"] == ops["DequantizeLinear"] == 24
    scales = np.concatenate([s.ravel() for _, s, _ in params])
    assert np.all(np.frexp(scales.astype(np.float64))[0] == 0.5), sorted(set(scales.tolist()))
    assert scales.min() >= 2**-12
    assert all(zp.dtype == np.int8 and np.all(zp == 0) for _, _, zp in params)
    assert relative_error(logits(fx_model, calibration), logits(float_model, calibration)) < 0.10


def test_fx_pow2_export_never_clips_its_weights(fx_model):
    graph = onnx.load(str(fx_model)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    weights = [(node, scale) for node, scale, _ in qdq_params(fx_model)
               if node.op_type == "QuantizeLinear" and node.input[0] in inits]
    assert len(weights) == 7  # 6 Conv + 1 Gemm
    for node, scale in weights:
        ratio = np.abs(inits[node.input[0]]).max() / scale.item()
        assert 63.5 < ratio <= 127, node.name  # fits, and half the scale would not


def test_fx_pow2_per_channel_weights_export(tmp_path):
    from torch import nn
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    x = torch.randn(2, 3, 8, 8)
    prepared = prepare_qat_fx(model.train(), pow2_int8_qconfig_mapping(per_channel_weights=True), (x,),
                              backend_config=int8_backend_config())
    prepared(x)
    path = export(prepared, (x[:1],), tmp_path / "pc.onnx", input_names=["x"])
    params = qdq_params(path)
    per_channel = [s for node, s, _ in params if s.size > 1]
    assert [s.size for s in per_channel] == [4, 4, 2, 2]  # Conv and Linear weights: Q and DQ each
    assert is_pow2(np.concatenate([s.ravel() for _, s, _ in params]))
    run_ort(path, {"x": x[:1].numpy()})


# --- (4) the observer -----------------------------------------------------------------------------


def observe(values: list[float], weight: bool = False) -> float:
    qconfig = pow2_int8_qconfig_mapping().global_qconfig
    fake_quant = (qconfig.weight if weight else qconfig.activation)()
    fake_quant(torch.tensor(values))
    assert fake_quant.zero_point.tolist() == [0]
    return fake_quant.scale.item()


@pytest.mark.parametrize(("values", "scale"), [
    ([-0.25, 1.0], 2**-6),             # 1/127 rounds up to 1/64 (1/128 would clip 1.0 at 127/128)
    ([0.5, -0.125], 2**-7),
    ([127 * 2**-7], 2**-7),            # exactly at the boundary: 127 * 2**-7 fits in 2**-7
    ([float(np.nextafter(np.float32(127 * 2**-7), np.float32(1)))], 2**-6),  # one ulp above: next power
    ([-3.0, 1.0], 2**-5),              # the negative side sets absmax: 3/127 -> 2**-5
    ([100.0], 1.0),
    ([-128.0], 2.0),
    ([0.0, 0.0], 2**-12),              # absmax 0: the floor
    ([1e-9], 2**-12),
])
def test_pow2_observer_scale(values, scale):
    assert observe(values) == scale
    assert observe(values, weight=True) == scale


def test_pow2_scale_never_clips_and_is_tight():
    rng = np.random.default_rng(0)
    absmax = np.float32(np.exp(rng.uniform(np.log(0.03), np.log(1e3), 500)))
    scales = pow2_scale(torch.from_numpy(-absmax / 2), torch.from_numpy(absmax)).numpy().astype(np.float64)
    assert is_pow2(scales)
    assert np.all(scales * 127 >= absmax) and np.all(scales / 2 * 127 < absmax)
    # Fake-quantizing the observed tensor never saturates: every value moves by at most half a step.
    x = torch.tensor([-0.7, 0.0, 0.3, 1.0])
    qconfig = pow2_int8_qconfig_mapping().global_qconfig
    fake_quant = qconfig.activation()
    y = fake_quant(x)
    assert torch.all((y - x).abs() <= fake_quant.scale / 2) and y.max().item() == 1.0


def test_pow2_observer_rejects_a_non_pow2_floor():
    from qdq.fx import Pow2MovingAverageMinMaxObserver

    with pytest.raises(ValueError, match="power of two"):
        Pow2MovingAverageMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, eps=1e-4)
    with pytest.raises(ValueError, match="symmetric"):
        Pow2MovingAverageMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_affine, eps=2**-12)
