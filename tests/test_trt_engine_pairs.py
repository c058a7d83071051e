"""Which trt rules turn NVIDIA's "bad" Q/DQ placements into the "good" ones (tests/fixtures/trt).

NVIDIA's TREx examples built the same ResNet-18 and MobileNetV2 twice: with pytorch-quantization's
default placement (Q/DQ only on Conv/Gemm inputs; `qat`, `mobilenet.qat`) and with the residual
inputs quantized (`qat-residual`, `mobilenet_v2_residuals.qat`). These tests build the same
topologies at toy width with the same placement, and check that what `qdq lint --target trt`
predicts is what TensorRT built:

- ResNet-18 `qat` has 10 standalone Q/DQ layers: the network input's Q, which every INT8 engine
  with an FP32 input has, and 9 that placement causes. QDQ802 (float-residual) explains 8: the Q
  after each of the first seven fused Conv+Add+Relu (they write FP16 because the residual is
  float) and the Q on the MaxPool output, which the first block also reads in float. QDQ801
  (float-input) explains the ninth: GlobalAveragePool runs in float, so the Q before the FC
  runs alone. `qat-residual-qgap`, which quantizes both, keeps only the input Q.
- MobileNetV2 `mobilenet.qat` has 17: the input Q; 10 Qs after the fused residual Conv+Adds and
  5 on the projection outputs that start each residual stage (QDQ802: 15 distinct layers); and
  the Q before the classifier after the float GlobalAveragePool (QDQ801). The good engine keeps
  the input Q and that last one (NVIDIA did not quantize the pool).

After `qdq fix --target trt` the prediction is 0 for both: the fix gives every residual the Q/DQ
its tensor already has (or one from calibration data) and quantizes the pool's input.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from optional import torch_or_skip

torch = torch_or_skip()
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from networks import BasicBlock, InvertedResidual, export_float, quantize_trt_style  # noqa: E402

import cli  # noqa: E402

from qdq.engine.fix import fix  # noqa: E402
from qdq.engine.lint import lint  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.graph.model import load_model  # noqa: E402
from qdq.quant.calibrate import tensor_ranges  # noqa: E402

ENGINES = Path(__file__).parent / "fixtures" / "trt" / "trex-v0.1.x"
RESNET = ENGINES / "pytorch" / "resnet" / "A100"
MOBILENET = ENGINES / "tests-inputs"


def standalone_qdq_layers(path: Path) -> list[str]:
    """Names of the Q/DQ layers TensorRT could not fuse (Reformat layers of origin QDQ)."""
    return [layer["Name"] for layer in json.loads(path.read_text())["Layers"] if layer.get("Origin") == "QDQ"]


class ResNet18Topology(nn.Module):
    """torchvision's resnet18 layout (stem, MaxPool, [2, 2, 2, 2] basic blocks, GAP, FC) at width 4."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 7, 2, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        widths, blocks = [4, 8, 16, 32], []
        for stage, width in enumerate(widths):
            cin = widths[max(stage - 1, 0)]
            blocks += [BasicBlock(cin, width, 1 if stage == 0 else 2), BasicBlock(width, width)]
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


class MobileNetV2Topology(nn.Module):
    """torchvision's mobilenet_v2 layout ((t, c, n, s) table, 10 residual Adds) at 1/8 width."""

    SETTINGS = [(1, 2, 1, 1), (6, 3, 2, 2), (6, 4, 3, 2), (6, 8, 4, 2), (6, 12, 3, 1), (6, 20, 3, 2), (6, 40, 1, 1)]

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 4, 3, 2, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU6()]
        cin = 4
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 160, 1, bias=False), nn.BatchNorm2d(160), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(160, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def calibration(n: int = 2):
    rng = np.random.default_rng(0)
    batches = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(n)]

    class Reader:
        def __init__(self):
            self.items = iter(batches)

        def get_next(self):
            return next(self.items, None)

    return Reader(), batches[0]


@pytest.fixture(scope="module", params=["resnet18", "mobilenet_v2"])
def bad_placement(request, tmp_path_factory):
    """A toy-width network of NVIDIA's topology, quantized with pytorch-quantization's default placement."""
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    network = (ResNet18Topology() if request.param == "resnet18" else MobileNetV2Topology()).eval()
    float_path = export_float(network, folder / "float.onnx", channels=3)
    reader, sample = calibration()
    return request.param, quantize_trt_style(float_path, folder / "qat.onnx", reader), sample


def test_trt_lint_predicts_the_standalone_layers_of_the_bad_engine(bad_placement):
    name, path, _ = bad_placement
    result = lint(load_model(path), load_target("trt"))
    by_rule = {}
    for finding in result.findings:
        by_rule[finding.code] = by_rule.get(finding.code, 0) + 1
    if name == "resnet18":
        engine = standalone_qdq_layers(RESNET / "qat" / "resnet-qat.onnx.engine.graph.json")
        assert len(engine) == 10 and engine[0] == "QuantizeLinear_2"  # the network input's Q
        # QDQ808: the scaled-down topology's 10-class head (NVIDIA's has 1000 classes) is too small
        # for INT8 tensor cores; it predicts no conversion layer, so the count below is unchanged.
        assert by_rule == {"QDQ801": 1, "QDQ802": 8, "QDQ808": 1}
    else:
        engine = standalone_qdq_layers(MOBILENET / "mobilenet.qat.onnx.engine.graph.json")
        assert len(engine) == 17 and engine[0] == "QuantizeLinear_2"
        assert by_rule == {"QDQ801": 1, "QDQ802": 10, "QDQ808": 1}
    # Every standalone layer of the bad engine but the input's Q, predicted from the ONNX alone.
    assert result.predicted_reformats() == len(engine) - 1


def test_trt_fix_leaves_what_the_good_engines_show(bad_placement):
    name, path, sample = bad_placement
    model = load_model(path)
    result = fix(model, load_target("trt"), ranges=tensor_ranges(path, sample))
    assert result.converged and not result.result.findings
    assert result.result.predicted_reformats() == 0
    codes = {c.code for c in result.changes}
    assert {"QDQ802", "QDQ801"} <= codes
    if name == "resnet18":
        good = standalone_qdq_layers(RESNET / "qat-residual-qgap" / "resnet-qat-residual-qgap.onnx.engine.graph.json")
        assert good == ["QuantizeLinear_2"]  # only the input's Q, as predicted after the fix
    else:
        good = standalone_qdq_layers(MOBILENET / "mobilenet_v2_residuals.qat.onnx.engine.graph.json")
        # NVIDIA's good engine keeps the input Q and the Q after the float pool, which the fix also quantizes.
        assert len(good) == 2


def test_expected_layout_matches_the_bad_engine(bad_placement, capsys):
    """`qdq compare --expect`: the layout predicted from the ONNX alone against NVIDIA's real engine.

    The toy MobileNetV2 keeps a 1×1 expand conv in its first block (t = 1), which torchvision's and
    so NVIDIA's does not have: one INT8 conv more than the engine, nothing else differs."""
    name, path, _ = bad_placement
    engine = RESNET / "qat" / "resnet-qat.onnx.engine.graph.json" if name == "resnet18" else \
        MOBILENET / "mobilenet.qat.onnx.engine.graph.json"
    code = cli.main(["compare", "--expect", str(path), "--target", "trt", str(engine), "--format", "json"])
    rows = {r["key"]: (r["predicted"], r["engine"]) for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["standalone_qdq"] == ((10, 10) if name == "resnet18" else (17, 17))
    assert rows["float_layers"] == (1, 1)  # the GlobalAveragePool NVIDIA left float
    assert rows["int8_layers"] == ((21, 21) if name == "resnet18" else (54, 53))
    assert code == (0 if name == "resnet18" else 1)


def test_expect_takes_one_engine(capsys, tmp_path):
    engine = str(RESNET / "qat" / "resnet-qat.onnx.engine.graph.json")
    assert cli.main(["compare", "--expect", str(tmp_path / "missing.onnx"), engine, engine]) == 2
    assert "one engine file" in capsys.readouterr().err
    assert cli.main(["compare", engine]) == 2
    assert "two engine files" in capsys.readouterr().err
