"""onnxruntime `quantize_static` QDQ models of the corpus's float networks, as onnxruntime writes them.

Reads `../float/ARCH.onnx` and calibrates on `../float/ARCH.npz` (16 samples, fed one at a time,
MinMax); writes one `ARCH_VARIANT.onnx` per entry of `VARIANTS` next to this script, and
`manifest.json`. The files are exactly what `quantize_static` wrote: nothing is edited afterwards.
Each is checked by creating an onnxruntime session (default options) and running every sample.

    python tests/corpus/float/make_float.py   # once, if ../float is empty
    python tests/corpus/ort/make_ort.py

Needs onnxruntime (1.31.1 made the committed files). Calibration is MinMax over fixed samples,
so a re-run writes the same files.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

HERE = Path(__file__).resolve().parent
FLOAT = HERE.parent / "float"

# file stem → (architecture, quantize_static keyword arguments, note). Keywords not given take
# quantize_static's defaults: QDQ, per-tensor, int8 activations and weights, MinMax, no extra_options.
VARIANTS: dict[str, tuple[str, dict, str]] = {
    "resnet_default": ("resnet", {}, "quantize_static defaults: asymmetric int8 activations, so the Relus that "
                                      "feed a QuantizeLinear are removed and that Q's zero point is -128"),
    "resnet_u8_per_tensor": ("resnet", {"activation_type": QuantType.QUInt8}, ""),
    "resnet_u8_per_channel_reduce_range": (
        "resnet", {"activation_type": QuantType.QUInt8, "per_channel": True, "reduce_range": True},
        "reduce_range: 7-bit weights (int8 range [-64, 64])"),
    "resnet_s8_symmetric_per_channel": (
        "resnet", {"per_channel": True, "extra_options": {"ActivationSymmetric": True, "WeightSymmetric": True}},
        "symmetric int8 activations: zero points 0, Relus kept"),
    "resnet_u8u8": (
        "resnet", {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QUInt8},
        "U8U8: uint8 weights, asymmetric (zero points 116-137, none 128)"),
    "resnet_keep_activations": (
        "resnet", {"activation_type": QuantType.QUInt8, "extra_options": {"QDQKeepRemovableActivations": True}},
        "Relus kept between Q/DQ pairs"),
    "mobilenetv2_default": ("mobilenetv2", {}, "quantize_static defaults; the ReLU6 Clips that feed a Q are "
                                                "removed, their bound Constant nodes stay in the graph unused"),
    "mobilenetv2_u8_per_channel": ("mobilenetv2", {"activation_type": QuantType.QUInt8, "per_channel": True}, ""),
    "mobilenetv2_dedicated_qdq": (
        "mobilenetv2", {"activation_type": QuantType.QUInt8, "extra_options": {"DedicatedQDQPair": True}},
        "one Q/DQ pair per reader of a tensor instead of a shared pair"),
    "mobilenetv2_u16_activations": (
        "mobilenetv2", {"activation_type": QuantType.QUInt16, "weight_type": QuantType.QUInt8},
        "16-bit activations, uint8 weights; onnxruntime raises the opset to 21"),
    "resnet_qoperator": (
        "resnet", {"quant_format": QuantFormat.QOperator, "activation_type": QuantType.QUInt8},
        "QOperator format: QLinearConv, QLinearAdd and QGemm compute on the integers between the input's "
        "QuantizeLinear and the output's DequantizeLinear, with scales of their own"),
    "yolo_u8_per_tensor": ("yolo", {"activation_type": QuantType.QUInt8}, ""),
    "yolo_s8_per_channel": ("yolo", {"per_channel": True}, ""),
    "yolo_no_bias_quantization": (
        "yolo", {"activation_type": QuantType.QUInt8, "extra_options": {"QuantizeBias": False}},
        "biases stay float"),
    "yolo_weight_qdq_pair": (
        "yolo", {"per_channel": True, "extra_options": {"AddQDQPairToWeight": True}},
        "weights stored float and fed through QuantizeLinear → DequantizeLinear"),
    "transformer_default": ("transformer", {}, "quantize_static defaults"),
    "transformer_u8_per_channel": (
        "transformer", {"activation_type": QuantType.QUInt8, "per_channel": True}, ""),
    "transformer_int4_weights": (
        "transformer", {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt4, "per_channel": True},
        "int4 weights (sub-byte initializers) on every weight onnxruntime quantizes, Conv and "
        "LayerNormalization scales included; at opset 17 the Q/DQ nodes are in the com.microsoft domain"),
    "transformer_preprocessed": (
        "transformer", {"activation_type": QuantType.QUInt8, "per_channel": True},
        "float model run through onnxruntime's quant_pre_process (optimization + symbolic shape inference) first; "
        "on yolo.onnx quant_pre_process fails with 'Incomplete symbolic shape inference'. The pre-processed "
        "model imports eight extra opset domains (ai.onnx.ml, com.microsoft, org.pytorch.aten, ...)"),
    "transformer_s16_symmetric_contrib": (
        "transformer", {"activation_type": QuantType.QInt16, "weight_type": QuantType.QInt8,
                        "extra_options": {"ActivationSymmetric": True, "UseQDQContribOps": True}},
        "16-bit symmetric activations; Q/DQ in the com.microsoft domain (UseQDQContribOps) although "
        "onnxruntime raises the opset to 21"),
}


class Samples(CalibrationDataReader):
    """The samples of an .npz file (one array per graph input, leading sample axis), one at a time."""

    def __init__(self, path: Path) -> None:
        with np.load(path) as arrays:
            inputs = {name: arrays[name] for name in arrays.files}
        count = len(next(iter(inputs.values())))
        self.feeds = iter([{name: array[i:i + 1] for name, array in inputs.items()} for i in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def quantize(stem: str, arch: str, options: dict, scratch: Path) -> Path:
    """quantize_static of ARCH.onnx (through quant_pre_process for the `_preprocessed` variant)."""
    source = FLOAT / f"{arch}.onnx"
    if stem.endswith("_preprocessed"):
        prepared = scratch / f"{arch}_preprocessed.onnx"
        quant_pre_process(source, prepared)
        source = prepared
    path = HERE / f"{stem}.onnx"
    quantize_static(source, path, Samples(FLOAT / f"{arch}.npz"), **{"quant_format": QuantFormat.QDQ, **options})
    return path


def run_all_samples(path: Path, arch: str, optimize: bool = True) -> np.ndarray:
    """Logits of every calibration sample, one sample at a time, from an onnxruntime session.

    `optimize=False` runs the file as written (no QLinear fusions, whose u8×s8 kernels saturate
    on CPUs without VNNI); the default session is the check that onnxruntime accepts the file.
    """
    options = onnxruntime.SessionOptions()
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = Samples(FLOAT / f"{arch}.npz")
    return np.concatenate([session.run(None, feed)[0] for feed in iter(feeds.get_next, None)])


def agreement(path: Path, arch: str, optimize: bool) -> float:
    """Share of the samples whose top-1 class matches the float model's."""
    expected = run_all_samples(FLOAT / f"{arch}.onnx", arch).argmax(1)
    return float((run_all_samples(path, arch, optimize).argmax(1) == expected).mean())


def settings_of(options: dict) -> dict:
    """The quantize_static arguments as JSON, defaults included."""
    settings = {"quant_format": "QDQ", "activation_type": "QInt8", "weight_type": "QInt8", "per_channel": False,
                "reduce_range": False, "calibrate_method": "MinMax", "calibration_samples": 16}
    for key, value in options.items():
        settings[key] = value.name if isinstance(value, (QuantType, QuantFormat)) else value
    return settings


def main() -> None:
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's "consider pre-processing" advice
    onnxruntime.set_default_logger_severity(3)  # and onnxruntime's "removing unused initializer" warnings
    manifest = []
    with tempfile.TemporaryDirectory() as scratch:
        for stem, (arch, options, note) in VARIANTS.items():
            path = quantize(stem, arch, options, Path(scratch))
            print(f"{stem:<36} {path.stat().st_size / 1024:4.0f} KiB  top-1 agreement with float: "
                  f"{agreement(path, arch, optimize=False):.2f} as written, "
                  f"{agreement(path, arch, optimize=True):.2f} optimized", flush=True)
            settings = settings_of(options)
            if stem.endswith("_preprocessed"):
                settings["quant_pre_process"] = {}
            manifest.append({"file": path.name, "architecture": arch,
                             "tool": "onnxruntime.quantization.quantize_static", "version": onnxruntime.__version__,
                             "settings": settings, "made_by": "make_ort.py", "note": note})
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
