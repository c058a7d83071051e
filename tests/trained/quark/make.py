"""AMD Quark XINT8 (power-of-two, the Ryzen AI NPU configuration) of the trained corpus's float models.

Writes `MODEL_xint8.onnx` here for each float model of `../float/manifest.json`, and
`manifest.json`: exactly what `quark.onnx.ModelQuantizer(Config(get_default_config("XINT8")))
.quantize_model(float.onnx, out.onnx, reader)` writes (MinMSE power-of-two calibration,
per-tensor, uint8 activations with zero point 128, int8 weights, `enable_npu_cnn` and the refine
step that moves positions to the NPU's rules). Calibration: the 16 samples of
`../data/TASK_calib.npz`, one per batch. magika alone is calibrated with NonOverflow (power-of-two
positions that hold each tensor's min/max), because MinMSE took over a minute per sample on it
here and was not waited for. Quark writes `quantized_info.csv` into the working
directory, so the script works in a temporary directory.

Quark must not go into the project's environment. Run it from a scratch venv that sees the
project's CPU torch 2.13 (quark.onnx imports torch; PyPI's torch wheel pulls CUDA):

    python3 -m venv --system-site-packages /tmp/venv-quark
    /tmp/venv-quark/bin/pip install amd-quark==0.13 onnxruntime==1.28.0 onnx==1.22.0 onnx_ir
    /tmp/venv-quark/bin/python tests/trained/quark/make.py [--only TASK]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader
from quark.onnx import ModelQuantizer, PowerOfTwoMethod
from quark.onnx.quantization.config import Config, get_default_config

HERE = Path(__file__).resolve().parent
TRAINED = HERE.parent
sys.path.insert(0, str(TRAINED))
import tasks  # noqa: E402  (numpy + onnxruntime only)

COMMIT_LIMIT = 3_300_000
CALIBRATION = {"magika": PowerOfTwoMethod.NonOverflow}  # tasks not calibrated with XINT8's MinMSE


class Reader(CalibrationDataReader):
    """The calibration samples of a task, one at a time."""

    def __init__(self, task: str) -> None:
        self.feeds = iter(tasks.samples(task, "calib"))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def quantize(model: dict) -> dict:
    path = HERE / f"{model['file'].removesuffix('.onnx')}_xint8.onnx"
    config = copy.deepcopy(get_default_config("XINT8"))
    config.calibrate_method = CALIBRATION.get(model["task"], config.calibrate_method)
    entry = {"file": path.name, "architecture": model["architecture"], "task": model["task"],
             "tool": "quark.onnx.ModelQuantizer.quantize_model", "version": version("amd-quark"),
             "settings": {"config": "XINT8", "calibrate_method": str(config.calibrate_method),
                          "activation_type": str(config.activation_type), "weight_type": str(config.weight_type),
                          "enable_npu_cnn": config.enable_npu_cnn, "extra_options": dict(config.extra_options)},
             "made_by": "make.py", "float": f"../float/{model['file']}", "licence": model["licence"]}
    try:
        ModelQuantizer(Config(global_quant_config=config)).quantize_model(
            str(TRAINED / "float" / model["file"]), str(path), Reader(model["task"]))
    except Exception as error:  # noqa: BLE001 - a quantizer's failure is recorded, not fatal
        entry["quantizer_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        path.unlink(missing_ok=True)
        return entry
    entry |= {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
              "committed": path.stat().st_size <= COMMIT_LIMIT}
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the models of this task (the manifest keeps the others)")
    args = parser.parse_args()
    models = json.loads((TRAINED / "float" / "manifest.json").read_text())
    kept = {}
    if (HERE / "manifest.json").exists():
        kept = {e["file"]: e for e in json.loads((HERE / "manifest.json").read_text())}
    start = Path.cwd()
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        try:
            for model in models:  # the manifest is rewritten after each model: a long run keeps what it made
                if args.only in model["task"]:
                    entry = quantize(model)
                    kept[entry["file"]] = entry
                    print(json.dumps(entry, default=str), flush=True)
                    write(list(kept.values()))
        finally:
            os.chdir(start)


def write(manifest: list[dict]) -> None:
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    (HERE / ".gitignore").write_text("".join(f"{e['file']}\n" for e in manifest if not e.get("committed", True)))


if __name__ == "__main__":
    main()
