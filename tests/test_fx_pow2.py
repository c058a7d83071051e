"""qdq.fx power-of-two fake-quant: TQT's learned thresholds and the min/max variant, through export to ONNX.

One small CNN (conv-bn-relu, residual Add, MaxPool, Concat of two 1×1 convs, Linear) is prepared
with each mapping, trained a few steps on random data, exported, and run by onnxruntime.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from optional import torch_or_skip

torch = torch_or_skip()

from conftest import run_ort  # noqa: E402
from fx_models import SmallQatNet  # noqa: E402
from fx_models import prepare as prepare_small  # noqa: E402
from torch import nn  # noqa: E402

from qdq import load_model  # noqa: E402
from qdq.fx import (  # noqa: E402
    TQTFakeQuantize,
    export,
    pow2_int8_qconfig_mapping,
    tqt_pow2_qconfig_mapping,
)
from qdq.quant.index import QuantIndex  # noqa: E402
from qdq.quant.pow2 import all_pow2  # noqa: E402
from qdq.support.errors import QdqError  # noqa: E402


def prepare(mapping) -> nn.Module:
    return prepare_small(mapping, tail="fc")


def train(model: nn.Module, steps: int) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 3, 16, 16, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), torch.zeros(8, 10)).backward()
        optimizer.step()


def thresholds(model: nn.Module) -> dict[str, float]:
    return {n: m.log2_threshold.item() for n, m in model.named_modules() if isinstance(m, TQTFakeQuantize)}


@pytest.fixture(scope="module")
def tqt(tmp_path_factory):
    """(model, t after the first batch, t.grad of the first step, t after training, exported path)."""
    model = prepare(tqt_pow2_qconfig_mapping())
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    nn.functional.mse_loss(model(x), torch.zeros(8, 10)).backward()
    grads = {n: m.log2_threshold.grad.item() for n, m in model.named_modules() if isinstance(m, TQTFakeQuantize)}
    start = thresholds(model)
    model.zero_grad()
    train(model, 5)
    trained = thresholds(model)
    path = export(model, (torch.randn(1, 3, 16, 16),), tmp_path_factory.mktemp("tqt") / "tqt.onnx", input_names=["x"])
    return model, start, grads, trained, path


def qdq_scales(path) -> list[np.ndarray]:
    index = QuantIndex(load_model(path))
    return [params.scale for params in index.all_params()]


def fx_and_ort(model: nn.Module, path) -> tuple[np.ndarray, np.ndarray]:
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    model.eval()
    with torch.no_grad():
        expected = model(x).numpy()
    got = np.concatenate([run_ort(path, {"x": x[i:i + 1].numpy()})[0] for i in range(len(x))])
    return expected, got


def test_tqt_gradient_reaches_every_threshold_and_training_moves_them(tqt) -> None:
    _, start, grads, trained, _ = tqt
    assert len(grads) == 11  # 5 weight + 6 activation fake-quants (MaxPool and Concat share theirs)
    # activation_post_process_3 quantizes relu(a + b) with a and b already on its grid of 2**-4:
    # no rounding error and no clipping, so its gradient is exactly 0 (as the formula says).
    assert [n for n, g in grads.items() if g == 0.0] == ["activation_post_process_3"]
    assert [n for n in start if trained[n] == start[n]] == ["activation_post_process_3"]


def test_tqt_starts_at_the_range_of_the_first_batch() -> None:
    fake_quant = TQTFakeQuantize()
    fake_quant(torch.tensor([-3.0, 0.5, 2.0]))
    # the smallest power-of-two range [-128, 127]·s holding 3.0: s = 2**-5 (127·2**-6 < 3 ≤ 127·2**-5)
    assert fake_quant.scale.item() == 2**-5


def test_tqt_gradient_is_the_straight_through_tqt_gradient() -> None:
    """dy/dt = s·ln2·(round(x/s) − x/s) inside the range, s·ln2·q when clipped; dy/dx = 1 inside, 0 clipped."""
    fake_quant = TQTFakeQuantize().train()
    fake_quant.disable_observer()
    fake_quant.set_scale(0.25)  # range [-32, 31.75]
    x = torch.tensor([0.3, -1.1, 40.0, -50.0], requires_grad=True)
    fake_quant(x).sum().backward()
    s, ln2 = 0.25, math.log(2)
    expected_t = s * ln2 * (round(0.3 / s) - 0.3 / s + round(-1.1 / s) + 1.1 / s + 127 - 128)
    assert fake_quant.log2_threshold.grad.item() == pytest.approx(expected_t, rel=1e-5)
    assert x.grad.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_tqt_export_has_only_power_of_two_scales_and_matches_onnxruntime(tqt) -> None:
    model, _, _, _, path = tqt
    scales = qdq_scales(path)
    assert len(scales) == 2 * 15  # a Q and a DQ for 6 weights and 9 activation tensors
    assert all(all_pow2(scale) and scale.size == 1 for scale in scales)
    expected, got = fx_and_ort(model, path)
    step = float(model.activation_post_process_9.scale)  # the output's quantization step
    assert np.max(np.abs(expected - got)) <= step


def test_pow2_minmax_variant_exports_power_of_two_scales(tmp_path) -> None:
    model = prepare(pow2_int8_qconfig_mapping())
    train(model, 3)
    path = export(model, (torch.randn(1, 3, 16, 16),), tmp_path / "pow2.onnx", input_names=["x"])
    scales = qdq_scales(path)
    assert len(scales) == 30 and all(all_pow2(scale) for scale in scales)
    expected, got = fx_and_ort(model, path)
    assert np.max(np.abs(expected - got)) <= float(model.activation_post_process_9.scale)


def test_export_refuses_torch_default_fused_fake_quant(tmp_path) -> None:
    from torch.ao.quantization import get_default_qat_qconfig_mapping

    model = prepare(get_default_qat_qconfig_mapping("x86"))
    with pytest.raises(QdqError, match="FusedMovingAvgObsFakeQuantize"):
        export(model, (torch.randn(1, 3, 16, 16),), tmp_path / "fused.onnx")


def test_export_refuses_a_model_without_fake_quant(tmp_path) -> None:
    with pytest.raises(QdqError, match="no fake-quant"):
        export(SmallQatNet("fc"), (torch.randn(1, 3, 16, 16),), tmp_path / "float.onnx")
