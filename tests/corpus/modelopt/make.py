"""Quantize the float corpus models with NVIDIA ModelOpt's ONNX post-training quantization.

Writes, next to this file, the models listed in VARIANTS and `manifest.json`:

- `{resnet,yolo,transformer}_int8.onnx`: the default int8 mode (entropy calibration, the model
  converted to fp16 with fp16 scales, weights kept as fp16 initializers behind Q and DQ, Q/DQ placed
  for TensorRT, opset raised to 19);
- `transformer_fp8.onnx`: fp8 (E4M3) mode;
- `transformer_int4_awq_clip.onnx`, `transformer_int4_rtn_dq.onnx`,
  `transformer_int4_awq_lite_zp.onnx`: int4 weight-only modes (blocked DequantizeLinear, opset 21);
- `resnet_int8_dla.onnx`: `target_dla=True` (Q/DQ on every tensor, for NVIDIA DLA);
- `resnet_int8_dq_only_fp32.onnx`: `dq_only=True` (int8 weight initializers, no weight Q) and
  `high_precision_dtype="fp32"` (no fp16 conversion);
- `resnet_int8_direct_io.onnx`: `direct_io_types=True` (graph input and output in low precision).

Each file is exactly what `modelopt.onnx.quantization.quantize(..., output_path=FILE)` writes. The
Python API is used because the command line (`python -m modelopt.onnx.quantization`) rejects
`--calibration_method awq_lite`, the only method `use_zero_point` applies to. Every variant runs in
a fresh process: `quantize()` edits onnxruntime's global quantizer registry and patches its
modules, so a second call in the same process quantizes differently (the DLA variant got 32 Q/DQ
pairs instead of 25 after an int8 run). Calibration runs on the CPU execution provider
(`calibration_eps=["cpu"]`) with the 16 samples of `../float/<arch>.npz`. ModelOpt rewrites the
model it is given (`onnx.shape_inference.infer_shapes_path(onnx_path)` in `load_onnx_model` adds
value_info to the input file), so each run quantizes a temporary copy of `../float/<arch>.onnx`; it
also writes intermediate models next to the output and removes them at the end. Two runs give
byte-identical files.

ModelOpt must not go into the project's environment, and its `[onnx]` extra pulls onnxruntime-gpu
and cupy. Run it from a scratch venv with the CPU packages of that extra installed by hand:

    python3 -m venv /tmp/venv-modelopt
    echo torch==2.13.0 > /tmp/torch-pin.txt
    /tmp/venv-modelopt/bin/pip install torch==2.13.0
    /tmp/venv-modelopt/bin/pip install -r tests/corpus/modelopt/requirements.txt -c /tmp/torch-pin.txt
    /tmp/venv-modelopt/bin/python tests/corpus/modelopt/make.py
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
from modelopt.onnx.quantization import quantize

HERE = Path(__file__).resolve().parent
FLOAT = HERE.parent / "float"
CALIBRATION_EPS = ["cpu"]

# (output file, architecture, quantize() options beyond the model, data, EP and output path)
VARIANTS = [
    ("resnet_int8.onnx", "resnet", {"quantize_mode": "int8"}),
    ("yolo_int8.onnx", "yolo", {"quantize_mode": "int8"}),
    ("transformer_int8.onnx", "transformer", {"quantize_mode": "int8"}),
    ("transformer_fp8.onnx", "transformer", {"quantize_mode": "fp8"}),
    ("transformer_int4_awq_clip.onnx", "transformer", {"quantize_mode": "int4", "calibration_method": "awq_clip"}),
    ("transformer_int4_rtn_dq.onnx", "transformer", {"quantize_mode": "int4", "calibration_method": "rtn_dq"}),
    (
        "transformer_int4_awq_lite_zp.onnx",
        "transformer",
        {"quantize_mode": "int4", "calibration_method": "awq_lite", "use_zero_point": True},
    ),
    ("resnet_int8_dla.onnx", "resnet", {"quantize_mode": "int8", "target_dla": True}),
    (
        "resnet_int8_dq_only_fp32.onnx",
        "resnet",
        {"quantize_mode": "int8", "dq_only": True, "high_precision_dtype": "fp32"},
    ),
    ("resnet_int8_direct_io.onnx", "resnet", {"quantize_mode": "int8", "direct_io_types": True}),
]

# What onnxruntime 1.31.1 (CPU) says when it loads each file and runs one calibration sample.
NOTES = {
    "transformer_fp8.onnx": (
        "the model is valid and runs with graph optimization DISABLE_ALL or BASIC, but onnxruntime's "
        "EXTENDED/ALL optimizers (the default) move a Transpose of the attention block between a float8 "
        "QuantizeLinear and its DequantizeLinear, and session creation then fails: Transpose at opset 19 "
        "does not take float8e4m3fn"
    ),
    "transformer_int4_awq_clip.onnx": (
        "onnxruntime fails at run time on head.weight_DequantizeLinear: the Gemm (transB=1) weight [10, 32] "
        "has axis=0, block_size=128 but scale [10, 1], i.e. blocks along axis 1 (the spec wants [1, 32] "
        "for axis 0, which rtn_dq writes)"
    ),
    "transformer_int4_awq_lite_zp.onnx": (
        "onnxruntime fails at run time on head.weight_DequantizeLinear: the Gemm (transB=1) weight [10, 32] "
        "has axis=0, block_size=128 but scale and uint4 zero point [10, 1], i.e. blocks along axis 1 (the "
        "spec wants [1, 32] for axis 0)"
    ),
    "resnet_int8_direct_io.onnx": (
        "the graph input is int8 (the input Q was removed) and the output fp16: a float calibration "
        "sample cannot be fed as is; the session loads and runs on an int8 input"
    ),
}


def run(name: str, arch: str, options: dict) -> None:
    """One quantize() call on a copy of the float model; main() runs it in a process of its own."""
    samples = np.load(FLOAT / f"{arch}.npz")
    with tempfile.TemporaryDirectory() as workdir:
        model = shutil.copy(FLOAT / f"{arch}.onnx", workdir)
        quantize(
            str(model),
            calibration_data={key: samples[key] for key in samples.files},
            calibration_eps=CALIBRATION_EPS,
            output_path=str(HERE / name),
            **options,
        )


def main() -> None:
    spawn = multiprocessing.get_context("spawn")
    manifest = []
    for name, arch, options in VARIANTS:
        process = spawn.Process(target=run, args=(name, arch, options))
        process.start()
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"{name}: quantize() exited with {process.exitcode}")
        note = f"float model ../float/{arch}.onnx, calibration ../float/{arch}.npz (16 samples)"
        manifest.append({
            "file": name,
            "architecture": arch,
            "tool": "modelopt.onnx.quantization.quantize",
            "version": version("nvidia-modelopt"),
            "settings": {**options, "calibration_eps": CALIBRATION_EPS},
            "made_by": "make.py",
            "note": f"{note}; {NOTES[name]}" if name in NOTES else note,
        })
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
