"""Quantize the corpus CNNs with NVIDIA ModelOpt's PyTorch path, then export with torch.onnx.export.

Writes, next to this file, one model per entry of `VARIANTS` and `manifest.json`. Each network is
the float corpus network (`../float/make_float.py`'s `build`: same seed, same digits training), in
eval mode with its BatchNorms (ModelOpt quantizes the module tree as it is), quantized by
`mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)` over the 16 samples of
`../float/<arch>.npz` (max calibration: per-channel int8 weights, per-tensor int8 inputs of
Conv/Linear/pooling), then exported by the TorchScript exporter (opset 17). What the files show
that the ONNX-path ModelOpt files (`../modelopt/`) do not:

- Conv → BatchNormalization left unfolded (the weight passes a quantizer, so nothing folds it);
- the YOLO's SPPF calls one MaxPool module three times, so its one input quantizer is reused;
- `yolo_int8_shared`: NVIDIA's YOLOv7 QAT guide's rules (pytorch-quantization's
  `apply_custom_rules_to_quantizer`, here with ModelOpt quantizers): the residual Add quantizes
  both inputs, its skip input with the quantizer of the Conv that reads the same tensor; the
  SPPF MaxPool and every C3 Concat input share the quantizer of the Conv after the Concat.

ModelOpt must not go into the project's environment. Run it from a scratch venv:

    python3 -m venv /tmp/venv-modelopt
    /tmp/venv-modelopt/bin/pip install -r tests/corpus/modelopt_torch/requirements.txt
    /tmp/venv-modelopt/bin/python tests/corpus/modelopt_torch/make.py

`requests` and `huggingface_hub` are imported by `modelopt.torch.quantization` but not declared.
"""

from __future__ import annotations

import copy
import functools
import sys
import types
from pathlib import Path

import modelopt
import modelopt.torch.quantization as mtq
import numpy as np
import onnx
import torch
from modelopt.torch.quantization.config import QuantizerAttributeConfig
from modelopt.torch.quantization.nn import TensorQuantizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "float"))
import make_float  # noqa: E402  (the float corpus networks and their training)
import networks  # noqa: E402  (examples/networks.py, on the path make_float set)

OPSET = 17
# file stem → (architecture, apply the YOLOv7 guide's shared-quantizer rules)
VARIANTS = {
    "resnet_int8": ("resnet", False),
    "yolo_int8": ("yolo", False),
    "yolo_int8_shared": ("yolo", True),
}


def first_conv(module: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in module.modules() if isinstance(m, torch.nn.Conv2d))


def residual_add(self: networks.Bottleneck, x: torch.Tensor) -> torch.Tensor:
    """The guide's QuantAdd: both inputs of the residual Add quantized."""
    return self.skip_quantizer(x) + self.branch_quantizer(self.branch(x))


def quantized_concat(self: networks.C3, x: torch.Tensor) -> torch.Tensor:
    """C3 with every Concat input quantized by the quantizer of the Conv after the Concat."""
    shared = first_conv(self.cv3).input_quantizer
    return self.cv3(torch.cat([shared(self.m(self.cv1(x))), shared(self.cv2(x))], 1))


def share_quantizers(model: torch.nn.Module) -> None:
    """The guide's rules, applied after `mtq.quantize` made one input quantizer per Conv and pool."""
    for block in model.modules():
        if isinstance(block, networks.Bottleneck) and block.shortcut:
            block.skip_quantizer = first_conv(block.branch).input_quantizer  # it reads x too
            block.branch_quantizer = TensorQuantizer(QuantizerAttributeConfig(num_bits=8, axis=None))
            block.forward = types.MethodType(residual_add, block)
        elif isinstance(block, networks.SPPF):
            block.pool.input_quantizer = first_conv(block.cv2).input_quantizer
        elif isinstance(block, networks.C3):
            block.forward = types.MethodType(quantized_concat, block)


def calibration(arch: str) -> list[torch.Tensor]:
    """The 16 samples of `<arch>.npz`, one batch of one image each."""
    return [torch.from_numpy(image[None]) for image in np.load(HERE.parent / "float" / f"{arch}.npz")["input"]]


@functools.cache
def trained(arch: str) -> torch.nn.Module:
    return make_float.build(arch, make_float.data_for(arch)).eval()


def quantize(stem: str) -> dict:
    arch, shared = VARIANTS[stem]
    model = copy.deepcopy(trained(arch))  # mtq.quantize changes the model in place
    samples = calibration(arch)

    def forward_loop(net: torch.nn.Module) -> None:
        for sample in samples:
            net(sample)

    with torch.no_grad():
        mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)
        if shared:  # new and shared quantizers measure what they now see
            share_quantizers(model)
            mtq.calibrate(model, "max", forward_loop)
        path = HERE / f"{stem}.onnx"
        torch.onnx.export(model, samples[0], str(path), opset_version=OPSET, dynamo=False,
                          input_names=["input"], output_names=["logits"])
    onnx.checker.check_model(str(path))
    return {
        "file": path.name,
        "architecture": arch,
        "tool": "modelopt.torch.quantization.quantize + torch.onnx.export",
        "version": modelopt.__version__,
        "settings": {"config": "INT8_DEFAULT_CFG", "algorithm": "max", "shared_quantizers": shared,
                     "dynamo": False, "opset_version": OPSET, "torch": torch.__version__},
        "made_by": "make.py",
        "note": f"float network of ../float/make_float.py (seed {make_float.SEED}, BatchNorm kept), "
                f"calibration ../float/{arch}.npz (16 samples)",
    }


if __name__ == "__main__":
    make_float.make_variants(HERE, VARIANTS, quantize)
