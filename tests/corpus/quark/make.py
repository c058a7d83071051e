"""Quantize the float corpus CNNs with AMD Quark: its ONNX quantizer and its torch FX flow.

Writes, next to this file, the models below and `manifest.json`.

Quark ONNX (`quark.onnx.ModelQuantizer(config).quantize_model(float.onnx, out.onnx, reader)`),
on resnet, mobilenetv2 and yolo:

- `ARCH_xint8.onnx`: `get_default_config("XINT8")`, the power-of-two NPU (Vitis AI DPU)
  configuration: MinMSE pow2 calibration, per-tensor, uint8 activations with zero point 128, int8
  weights and biases, `enable_npu_cnn`, and its refine step that adjusts the pow2 positions to the
  DPU's rules;
- `ARCH_xint8_norefine.onnx`: the same with `NPULimitationCheck=False` (refine skipped);
- `ARCH_xint8_int32bias.onnx`: the same with `Int32Bias=True` (bias scale = input × weight scale).

and, once each on yolo: `yolo_a8w8.onnx` (`A8W8`: int8 symmetric MinMax, com.microsoft Q/DQ) and
`yolo_u8s8.onnx` (`U8S8_AAWS`: uint8 activations, int8 weights, percentile calibration);
`transformer_a16w8.onnx` (`A16W8`, Ryzen AI's configuration for transformers: int16 symmetric
activations, int8 weights, com.microsoft Q/DQ); `resnet_bf16.onnx` (`BF16`: Quark's own
ExtendedQuantizeLinear/ExtendedDequantizeLinear in the com.amd.quark domain, which qdq does not
read and onnxruntime runs only with Quark's custom-op library).

Quark torch FX (`quark.torch.ModelQuantizer` with `QuantizationMode.fx_graph_mode`, `freeze()`,
`quark.torch.export_onnx`): `ARCH_fx_pow2.onnx`, int8 symmetric per-tensor pow2 scales
(`PerTensorPowOf2MinMaxObserver`) on weights, biases, inputs and outputs. `freeze()` runs Quark's
pow2 hardware-constraint passes. The torch networks are rebuilt and retrained by
`../float/make_float.py` (seeded; the same weights as `../float/ARCH.onnx`), traced with batch 1.

Calibration uses the 16 samples of `../float/ARCH.npz`, one per batch. Every file is exactly what
Quark writes (the torch exporter's fixed name `quark_model.onnx` is renamed). Quark writes a
`quantized_info.csv` into the working directory, so the script works in a temporary directory.

Quark must not go into the project's environment. Run it from a scratch venv (2 to 6 minutes on two
cores, most of it retraining the torch networks; the first import JIT-compiles Quark's custom-op
library):

    python3 -m venv /tmp/venv-quark
    echo torch==2.13.0 > /tmp/torch-pin.txt
    /tmp/venv-quark/bin/pip install torch==2.13.0
    /tmp/venv-quark/bin/pip install -r tests/corpus/quark/requirements.txt -c /tmp/torch-pin.txt
    /tmp/venv-quark/bin/python tests/corpus/quark/make.py
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from onnxruntime.quantization import CalibrationDataReader
from quark.common.utils.import_utils import export_for_training
from quark.onnx import ModelQuantizer as OnnxQuantizer
from quark.onnx.quantization.config import Config, get_default_config
from quark.torch import ModelQuantizer as TorchQuantizer
from quark.torch import export_onnx
from quark.torch.quantization.config.config import QConfig, QLayerConfig, QTensorConfig
from quark.torch.quantization.config.type import Dtype, QSchemeType, QuantizationMode, RoundType, ScaleType
from quark.torch.quantization.observer.observer import PerTensorPowOf2MinMaxObserver

HERE = Path(__file__).resolve().parent
FLOAT = HERE.parent / "float"
sys.path.insert(0, str(FLOAT))
import make_float  # noqa: E402  (../float/make_float.py: the torch networks behind ../float/*.onnx)

CNNS = ["resnet", "mobilenetv2", "yolo"]

# (output file, architecture, Quark ONNX default config, extra_options changed from that config)
ONNX_VARIANTS = [
    *[(f"{arch}_xint8.onnx", arch, "XINT8", {}) for arch in CNNS],
    *[(f"{arch}_xint8_norefine.onnx", arch, "XINT8", {"NPULimitationCheck": False}) for arch in CNNS],
    *[(f"{arch}_xint8_int32bias.onnx", arch, "XINT8", {"Int32Bias": True}) for arch in CNNS],
    ("yolo_a8w8.onnx", "yolo", "A8W8", {}),
    ("yolo_u8s8.onnx", "yolo", "U8S8_AAWS", {}),
    ("transformer_a16w8.onnx", "transformer", "A16W8", {}),
    ("resnet_bf16.onnx", "resnet", "BF16", {}),
]

# What onnx 1.23.2 and onnxruntime 1.31.1 say of the files, and what Quark's refine log reported.
UNSORTED = (
    "the graph is not topologically sorted: the DPU-simulation Muls (the GlobalAveragePool rescale and, "
    "in yolo, the multiplier after each HardSigmoid that replaces a Sigmoid) and their unnamed Constant "
    "inputs are appended after the QuantizeLinear that reads them, so onnx.checker rejects the model; "
    "onnxruntime sorts it and runs"
)
NOTES = {
    "resnet_xint8_norefine.onnx": "refine would have set the GlobalAveragePool output pos 4 to its input pos 3",
    "mobilenetv2_xint8_norefine.onnx": "refine would have set the GlobalAveragePool output pos 5 to its input pos 4",
    "yolo_xint8_norefine.onnx": (
        "refine would have set one input pos of /stem/stem.2/Concat and of /p4/p4.1/Concat from 5 to 4 "
        "and the GlobalAveragePool output pos 4 to its input pos 3"
    ),
    "yolo_a8w8.onnx": "QuantizeLinear/DequantizeLinear in the com.microsoft domain; int32 bias",
    "transformer_a16w8.onnx": "QuantizeLinear/DequantizeLinear in the com.microsoft domain (int16 activations)",
    "resnet_bf16.onnx": (
        "bfloat16 through com.amd.quark ExtendedQuantizeLinear/ExtendedDequantizeLinear: onnxruntime 1.31.1 "
        "without Quark's custom-op library refuses the file (not a registered op)"
    ),
}

POW2_INT8 = QTensorConfig(
    dtype=Dtype.int8,
    qscheme=QSchemeType.per_tensor,
    observer_cls=PerTensorPowOf2MinMaxObserver,
    symmetric=True,
    scale_type=ScaleType.float,
    round_method=RoundType.half_even,
    is_dynamic=False,
)


def samples(arch: str) -> dict[str, np.ndarray]:
    data = np.load(FLOAT / f"{arch}.npz")
    return {name: data[name] for name in data.files}


class Reader(CalibrationDataReader):
    """Feeds the calibration samples one at a time (batch axis 1)."""

    def __init__(self, arch: str) -> None:
        inputs = samples(arch)
        count = len(next(iter(inputs.values())))
        self.feeds = iter([{name: array[i : i + 1] for name, array in inputs.items()} for i in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def quantize_onnx(name: str, arch: str, config_name: str, extra_options: dict) -> dict:
    config = copy.deepcopy(get_default_config(config_name))
    config.extra_options.update(extra_options)
    settings = {  # taken before quantize_model, which adds its defaults to config.extra_options
        "config": config_name,
        "calibrate_method": str(config.calibrate_method),
        "activation_type": str(config.activation_type),
        "weight_type": str(config.weight_type),
        "enable_npu_cnn": config.enable_npu_cnn,
        "extra_options": dict(config.extra_options),
    }
    OnnxQuantizer(Config(global_quant_config=config)).quantize_model(
        str(FLOAT / f"{arch}.onnx"), str(HERE / name), Reader(arch)
    )
    notes = [f"float model ../float/{arch}.onnx, calibration ../float/{arch}.npz (16 samples)"]
    if config.enable_npu_cnn:
        notes.append(UNSORTED)
    if name in NOTES:
        notes.append(NOTES[name])
    return {
        "file": name,
        "architecture": arch,
        "tool": "quark.onnx.ModelQuantizer.quantize_model",
        "version": version("amd-quark"),
        "settings": settings,
        "made_by": "make.py",
        "note": "; ".join(notes),
    }


def quantize_torch_fx(arch: str, workdir: Path) -> dict:
    name = f"{arch}_fx_pow2.onnx"
    model = make_float.build(arch, make_float.data_for(arch))
    inputs = torch.from_numpy(samples(arch)["input"])
    with torch.no_grad():  # the retrained network is the one in ../float/ARCH.onnx
        np.testing.assert_allclose(model(inputs).numpy(), make_float.check(FLOAT / f"{arch}.onnx", samples(arch)),
                                   rtol=1e-3, atol=1e-4)
    example = inputs[:1]
    config = QConfig(
        global_quant_config=QLayerConfig(
            weight=POW2_INT8, bias=POW2_INT8, input_tensors=POW2_INT8, output_tensors=POW2_INT8
        ),
        quant_mode=QuantizationMode.fx_graph_mode,
    )
    quantizer = TorchQuantizer(config)
    graph = export_for_training(model.eval(), (example,)).module()
    quantized = quantizer.quantize_model(graph, [inputs[i : i + 1] for i in range(len(inputs))])
    frozen = quantizer.freeze(quantized.eval())
    export_onnx(model=frozen, output_dir=workdir / arch, input_args=example, input_names=["input"],
                output_names=["logits"])
    shutil.move(workdir / arch / "quark_model.onnx", HERE / name)
    return {
        "file": name,
        "architecture": arch,
        "tool": "quark.torch.ModelQuantizer (fx_graph_mode) + quark.torch.export_onnx",
        "version": version("amd-quark"),
        "settings": {
            "quant_mode": "fx_graph_mode",
            "weight, bias, input_tensors, output_tensors": {
                "dtype": "int8",
                "qscheme": "per_tensor",
                "observer": "PerTensorPowOf2MinMaxObserver",
                "symmetric": True,
                "round_method": "half_even",
            },
            "torch": torch.__version__,
        },
        "made_by": "make.py",
        "note": (
            f"torch network retrained by ../float/make_float.py (the weights of ../float/{arch}.onnx), "
            f"traced with batch 1 (static input shape); calibration ../float/{arch}.npz (16 samples)"
        ),
    }


def main() -> None:
    torch.use_deterministic_algorithms(True)
    manifest = []
    start = Path.cwd()
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        try:
            manifest += [quantize_onnx(*variant) for variant in ONNX_VARIANTS]
            manifest += [quantize_torch_fx(arch, Path(workdir)) for arch in CNNS]
        finally:
            os.chdir(start)
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
