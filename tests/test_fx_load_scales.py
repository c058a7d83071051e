"""qdq.fx.load_scales: export → qdq fix → load the fixed scales into the FX model → export gives the fixed scales.

The model nests two identical blocks, so the exporter gives their layers the same short names
(`branch.0/weight_fake_quant` and `branch.0/weight_fake_quant_1`); the second block's weights are
8× larger so a swapped match would show as a wrong scale. The torch-free install: tests/test_first_hour.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from optional import torch_or_skip

torch = torch_or_skip()

from torch import nn  # noqa: E402
from torch.ao.quantization.quantize_fx import prepare_qat_fx  # noqa: E402

from qdq import fix, load_model, load_target, save_model  # noqa: E402
from qdq.fx import (  # noqa: E402
    TQTFakeQuantize,
    export,
    int8_backend_config,
    load_scales,
    symmetric_int8_qconfig_mapping,
    tqt_pow2_qconfig_mapping,
)
from qdq.graph import ir
from qdq.quant.index import QuantIndex  # noqa: E402
from qdq.quant.operands import BIAS, role  # noqa: E402
from qdq.support.errors import QdqError  # noqa: E402


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
        )
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.branch(x) + x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(Block(), Block())
        self.pool = nn.MaxPool2d(2)
        self.left, self.right = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = self.pool(self.blocks(self.stem(x)))
        y = torch.cat([self.left(y), self.right(y)], 1)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


EXAMPLE = (torch.zeros(1, 3, 16, 16),)


def prepared(mapping) -> nn.Module:
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        net.blocks[1].branch[0].weight.mul_(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        return prepare_qat_fx(net.train(), mapping, EXAMPLE, backend_config=int8_backend_config())


def train(model: nn.Module, steps: int, seed: int) -> None:
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3, 16, 16, generator=generator)).pow(2).mean().backward()
        optimizer.step()


def scales(path: Path) -> dict[str, np.ndarray]:
    """Q/DQ node name → scale as float32 (the fix writes scalars where the exporter wrote shape [1]).

    Bias DQs (the npu fix's QDQ610 quantizes FX's float biases) have no fake-quant and are left out."""
    index = QuantIndex(load_model(path))
    return {p.node.name: p.scale.astype(np.float32).ravel() for p in index.all_params()
            if role(index, index.qtensor_of(p.node)) != BIAS}


def export_fix_load(mapping, folder: Path):
    """(model after load_scales and 3 more training steps, report, first export, fixed file, re-export)."""
    model = prepared(mapping)
    train(model, 3, seed=1)
    first = export(model, EXAMPLE, folder / "first.onnx", input_names=["x"])
    onnx_model = load_model(first)
    fix(onnx_model, load_target("npu"))
    save_model(onnx_model, folder / "fixed.onnx")
    report = load_scales(model, folder / "fixed.onnx")
    train(model, 3, seed=2)  # frozen scales survive training
    again = export(model, EXAMPLE, folder / "again.onnx", input_names=["x"])
    return model, report, first, folder / "fixed.onnx", again


@pytest.fixture(scope="module")
def int8_round_trip(tmp_path_factory):
    return export_fix_load(symmetric_int8_qconfig_mapping(), tmp_path_factory.mktemp("load_int8"))


def test_reexport_reproduces_the_fixed_scales(int8_round_trip) -> None:
    _, _, first, fixed, again = int8_round_trip
    before, after, reexported = scales(first), scales(fixed), scales(again)
    assert sum(not np.array_equal(before[n], after[n]) for n in after) == len(after) == 46  # npu fix moved all
    assert reexported.keys() == after.keys()
    assert all(np.array_equal(reexported[n], after[n]) for n in after)


def test_report_matches_every_fake_quant(int8_round_trip) -> None:
    model, report, *_ = int8_round_trip
    assert report.unmatched_onnx == [] and report.unmatched_fx == [] and report.problems == []
    assert len(report.loaded) == 18  # 7 weights + 11 activation modules; shared ones cover several nodes
    assert report.nodes["activation_post_process_9"] == [f"/activation_post_process_9{s}/QuantizeLinear" for s in
                                                         ("", "_1", "_2", "_3", "_4")]
    assert str(report).splitlines()[0] == "loaded 18 fake-quant scale(s) from 23 Q/DQ node(s)"
    # the 8× weights of the second block went to its own conv (`branch.0/weight_fake_quant_1`)
    first_block = report.loaded["blocks.0.branch.0.weight_fake_quant"][0]
    assert report.loaded["blocks.1.branch.0.weight_fake_quant"][0] == 8 * first_block


def test_tqt_round_trip_sets_and_freezes_the_thresholds(tmp_path) -> None:
    model, report, _, fixed, again = export_fix_load(tqt_pow2_qconfig_mapping(), tmp_path)
    assert report.unmatched_onnx == [] and report.unmatched_fx == [] and report.problems == []
    after, reexported = scales(fixed), scales(again)
    assert all(np.array_equal(reexported[n], after[n]) for n in after)
    tqt = [m for m in model.modules() if isinstance(m, TQTFakeQuantize)]
    assert tqt and all(not m.log2_threshold.requires_grad for m in tqt)
    assert all(m.log2_threshold.item() == round(m.log2_threshold.item()) for m in tqt)


def test_shared_fake_quant_with_different_fixed_scales_takes_the_largest(int8_round_trip, tmp_path) -> None:
    model, _, _, fixed, _ = int8_round_trip
    onnx_model = load_model(fixed)
    index = QuantIndex(onnx_model)
    node = next(n for n in index.quantizes if n.name == "/activation_post_process_9_2/QuantizeLinear")
    node.inputs[1] = ir.Constant("bigger_scale", np.array(1.0, dtype=np.float32))
    save_model(onnx_model, tmp_path / "edited.onnx")
    report = load_scales(model, tmp_path / "edited.onnx")
    assert report.loaded["activation_post_process_9"] == [1.0]
    assert len(report.problems) == 1 and report.problems[0].startswith("activation_post_process_9 is shared")


def test_float_model_is_refused(tmp_path) -> None:
    path = tmp_path / "float.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), EXAMPLE, str(path), dynamo=False, opset_version=13)
    with pytest.raises(QdqError, match="no QuantizeLinear/DequantizeLinear"):
        load_scales(prepared(symmetric_int8_qconfig_mapping()), path)


def test_model_from_another_network_is_refused(int8_round_trip) -> None:
    _, _, _, fixed, _ = int8_round_trip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = prepare_qat_fx(nn.Sequential(nn.Flatten(), nn.Linear(768, 2)).train(), symmetric_int8_qconfig_mapping(),
                               EXAMPLE, backend_config=int8_backend_config())
    with pytest.raises(QdqError, match="from another FX model"):
        load_scales(other, fixed)
