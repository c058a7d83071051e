"""Quantize the float corpus models with Intel NNCF's ONNX post-training quantization.

Writes, next to this file, one model per (architecture, preset) and `manifest.json`:

    {resnet,yolo,transformer}_{performance,mixed}.onnx

Each is exactly what `nncf.quantize(onnx_model, nncf.Dataset(...), preset=...)` returns, saved
with `onnx.save` and nothing else: NNCF's own Q/DQ placement, scales and value_info. The
transformer gets `model_type=nncf.ModelType.TRANSFORMER`, as NNCF asks for transformers, which also
runs SmoothQuant: a Mul named `.../nncf_smooth_quant` before the Q/DQ of each activation that feeds a
MatMul or Gemm with a weight. Calibration
uses the 16 samples of `../float/<arch>.npz`, one sample per batch; NNCF's defaults otherwise
(target device ANY, fast bias correction on). Two runs give byte-identical files.

NNCF must not go into the project's environment. Run it from a scratch venv:

    python3 -m venv /tmp/venv-nncf
    /tmp/venv-nncf/bin/pip install -r tests/corpus/nncf/requirements.txt
    /tmp/venv-nncf/bin/python tests/corpus/nncf/make.py
"""

from __future__ import annotations

import json
from pathlib import Path

import nncf
import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
FLOAT = HERE.parent / "float"
SUBSET_SIZE = 16

ARCHITECTURES = {
    "resnet": None,
    "yolo": None,
    "transformer": nncf.ModelType.TRANSFORMER,
}
PRESETS = [nncf.QuantizationPreset.PERFORMANCE, nncf.QuantizationPreset.MIXED]
NOTES = {
    "transformer": [
        "SmoothQuant Mul nodes (.../nncf_smooth_quant) before the activation Q/DQ of the weighted MatMuls and Gemm"
    ],
}


def calibration(arch: str) -> nncf.Dataset:
    """One feed dict per sample of `<arch>.npz`, each with a batch axis of 1."""
    samples = np.load(FLOAT / f"{arch}.npz")
    count = len(samples[samples.files[0]])
    return nncf.Dataset([{name: samples[name][i : i + 1] for name in samples.files} for i in range(count)])


def quantize(arch: str, model_type: nncf.ModelType | None, preset: nncf.QuantizationPreset) -> dict:
    name = f"{arch}_{preset.value}.onnx"
    model = onnx.load(FLOAT / f"{arch}.onnx")
    quantized = nncf.quantize(
        model, calibration(arch), preset=preset, model_type=model_type, subset_size=SUBSET_SIZE
    )
    onnx.save(quantized, HERE / name)
    return {
        "file": name,
        "architecture": arch,
        "tool": "nncf.quantize (ONNX backend)",
        "version": nncf.__version__,
        "settings": {
            "preset": preset.value,
            "model_type": model_type.value if model_type else None,
            "subset_size": SUBSET_SIZE,
            "target_device": "ANY",
            "fast_bias_correction": True,
        },
        "made_by": "make.py",
        "note": "; ".join([f"float model ../float/{arch}.onnx, calibration ../float/{arch}.npz (16 samples)",
                           *NOTES.get(arch, [])]),
    }


def main() -> None:
    manifest = [quantize(arch, model_type, preset) for arch, model_type in ARCHITECTURES.items() for preset in PRESETS]
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
