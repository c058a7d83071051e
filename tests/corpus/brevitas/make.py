"""Quantize the corpus CNNs with AMD/Xilinx Brevitas and export them with `export_onnx_qcdq`.

Writes, next to this file, one model per entry of `VARIANTS` and `manifest.json`. Each network is
the float corpus network (`../float/make_float.py`'s `build`: same seed, same digits training),
quantized the way Brevitas's own ImageNet PTQ example does it (`brevitas_examples ... ptq_common`):
`preprocess_for_quantize` (FX trace, BatchNorm merged unless the variant keeps it), then
`quantize_model` with the "fx" backend, then one forward pass and `calibrate` over the 16 samples
of `../float/<arch>.npz`, then `export_onnx_qcdq`. What the files show that no other corpus
folder has:

- weights stored as int8 constants → Clip(-2^(b-1)+1, 2^(b-1)-1) → DequantizeLinear (QCDQ), at
  4, 6 and 8 bits, per tensor and per channel, and int32 biases from the weight and input scales;
- TorchScript path (`dynamo=False`): parameters that are also graph inputs with initializers;
- dynamo path (`dynamo=True`, opset 18): float weights → Q → Clip → DQ, float biases, every node
  with torch's metadata_props. torch writes the weights as external data; Brevitas then loads
  the model and saves it again with `onnx.save`, inline, so the `.data` file it leaves beside the
  model is referenced by nothing (this script deletes it).

Brevitas must not go into the project's environment. Run it from a scratch venv:

    python3 -m venv /tmp/venv-brevitas
    /tmp/venv-brevitas/bin/pip install -r tests/corpus/brevitas/requirements.txt
    /tmp/venv-brevitas/bin/python tests/corpus/brevitas/make.py

`onnxoptimizer` is needed by the TorchScript export but not declared by Brevitas.
"""

from __future__ import annotations

import sys
from pathlib import Path

import brevitas
import numpy as np
import onnx
import torch
from brevitas.export import export_onnx_qcdq
from brevitas.graph.quantize import preprocess_for_quantize
from brevitas_examples.imagenet_classification.ptq.ptq_common import calibrate, quantize_model

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "float"))
import make_float  # noqa: E402  (the float corpus networks and their training)

# file stem → (architecture, weight bits, weight granularity, merge BatchNorm, dynamo export); the
# dynamo path refuses quantized biases, so its biases stay float.
VARIANTS = {
    "resnet_w8_per_tensor": ("resnet", 8, "per_tensor", True, False),
    "mobilenetv2_w4_per_channel_bn": ("mobilenetv2", 4, "per_channel", False, False),
    "yolo_w6_per_channel_dynamo": ("yolo", 6, "per_channel", True, True),
}
OPSET = {False: 13, True: 18}  # Brevitas's example default for TorchScript; dynamo's lowest is 18


def calibration(arch: str) -> list[tuple[torch.Tensor, None]]:
    """`calibrate`'s loader: one (batch of one image, no label) per sample of `<arch>.npz`."""
    images = np.load(HERE.parent / "float" / f"{arch}.npz")["input"]
    return [(torch.from_numpy(image[None]), None) for image in images]


def quantize(stem: str) -> dict:
    arch, bits, granularity, merge_bn, dynamo = VARIANTS[stem]
    model = make_float.build(arch, make_float.data_for(arch)).eval()
    model = preprocess_for_quantize(model, merge_bn=merge_bn)
    bias_bits = None if dynamo else 32
    quant = quantize_model(
        model, backend="fx", weight_bit_width=bits, act_bit_width=8, bias_bit_width=bias_bits,
        weight_quant_granularity=granularity, act_quant_percentile=99.999, act_quant_type="sym",
        scale_factor_type="float_scale", quant_format="int",
    )
    loader = calibration(arch)
    with torch.no_grad():
        quant(loader[0][0])
    calibrate(loader, quant)
    path = HERE / f"{stem}.onnx"
    export_onnx_qcdq(quant.eval(), loader[0][0], str(path), opset_version=OPSET[dynamo], dynamo=dynamo)
    path.with_name(path.name + ".data").unlink(missing_ok=True)  # torch's external data, re-saved inline
    onnx.checker.check_model(str(path))
    return {
        "file": path.name,
        "architecture": arch,
        "tool": "brevitas.export.export_onnx_qcdq",
        "version": brevitas.__version__,
        "settings": {
            "dynamo": dynamo, "opset_version": OPSET[dynamo], "backend": "fx", "merge_bn": merge_bn,
            "weight_bit_width": bits, "weight_quant_granularity": granularity, "act_bit_width": 8,
            "bias_bit_width": bias_bits, "act_quant_type": "sym", "act_quant_percentile": 99.999,
            "scale_factor_type": "float_scale", "torch": torch.__version__,
        },
        "made_by": "make.py",
        "note": f"float network of ../float/make_float.py (seed {make_float.SEED}), "
                f"calibration ../float/{arch}.npz (16 samples)",
    }


if __name__ == "__main__":
    make_float.make_variants(HERE, VARIANTS, quantize)
