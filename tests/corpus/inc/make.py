"""Quantize the float corpus models with Intel's onnx-neural-compressor, static QDQ.

Writes, next to this file, one model per entry of `VARIANTS` and `manifest.json`. Each is what
`onnx_neural_compressor.quantization.quantize(float_model, out, StaticQuantConfig(...))` writes,
with the package's defaults unless the variant says otherwise (MinMax calibration, uint8
activations, int8 weights), `quant_format=QDQ`, calibrated on the 16 samples of
`../float/<arch>.npz`. What the files show that no other corpus folder has: the quantizer runs
onnxruntime's basic optimiser first and saves initializers of 1 KiB and more as external data
(`<file>_data`, beside the model); int32 biases as DequantizeLinear of stored integers.

onnx-neural-compressor must not go into the project's environment. Run it from a scratch venv:

    python3 -m venv /tmp/venv-inc
    /tmp/venv-inc/bin/pip install -r tests/corpus/inc/requirements.txt
    /tmp/venv-inc/bin/python tests/corpus/inc/make.py

`prettytable` and `scipy` are imported by the package but not declared; neural-compressor 3.x
has no ONNX backend, so this is the package Intel points ONNX users to.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx_neural_compressor import data_reader
from onnx_neural_compressor.quantization import config, quantize
from onnx_neural_compressor.version import __version__
from onnxruntime import quantization

HERE = Path(__file__).resolve().parent
FLOAT = HERE.parent / "float"

# file stem → (architecture, per-channel weights)
VARIANTS = {
    "mobilenetv2_static_qdq": ("mobilenetv2", False),
    "yolo_static_qdq_per_channel": ("yolo", True),
}


class Samples(data_reader.CalibrationDataReader):
    """The samples of `<arch>.npz`, one feed of batch 1 at a time."""

    def __init__(self, arch: str) -> None:
        self.images = np.load(FLOAT / f"{arch}.npz")["input"]
        self.rewind()

    def get_next(self) -> dict | None:
        return {"input": self.images[next(self.order)][None]} if self.left() else None

    def left(self) -> bool:
        self.position += 1
        return self.position <= len(self.images)

    def rewind(self) -> None:
        self.position = 0
        self.order = iter(range(len(self.images)))


def make(stem: str) -> dict:
    arch, per_channel = VARIANTS[stem]
    path = HERE / f"{stem}.onnx"
    settings = dict(quant_format=quantization.QuantFormat.QDQ, per_channel=per_channel,
                    use_external_data_format=True)
    quantize(str(FLOAT / f"{arch}.onnx"), str(path),
             config.StaticQuantConfig(Samples(arch), **settings))
    onnx.checker.check_model(str(path))
    return {
        "file": path.name,
        "architecture": arch,
        "tool": "onnx_neural_compressor.quantization.quantize (StaticQuantConfig)",
        "version": __version__,
        "settings": {"quant_format": "QDQ", "per_channel": per_channel, "use_external_data_format": True,
                     "calibrate_method": "MinMax", "activation_type": "QUInt8", "weight_type": "QInt8"},
        "made_by": "make.py",
        "note": f"float model ../float/{arch}.onnx, calibration ../float/{arch}.npz (16 samples); "
                "external data in the file the model names",
    }


def main() -> None:
    manifest = [make(stem) for stem in VARIANTS]
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
