"""Intel NNCF post-training quantization of the trained corpus's float models.

Writes `MODEL_PRESET.onnx` here for each float model of `../float/manifest.json` and each preset,
and `manifest.json`: exactly what `nncf.quantize(onnx_model, nncf.Dataset(...), preset=...)`
returns, saved with `onnx.save`. Calibration uses the 16 samples of `../data/TASK_calib.npz`, one
sample per batch; NNCF's defaults otherwise (target device ANY, fast bias correction on).

NNCF must not go into the project's environment. Run it from a scratch venv, after
`../float/make_float.py` (in the project's environment) has brought back the float models:

    python3 -m venv /tmp/venv-nncf
    /tmp/venv-nncf/bin/pip install -r tests/corpus/nncf/requirements.txt
    /tmp/venv-nncf/bin/python tests/trained/nncf/make.py

The task metric of each file, and what qdq's fixes do to it, come from `benchmarks/trained.py`,
which runs in the project's environment.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import nncf
import onnx

HERE = Path(__file__).resolve().parent
TRAINED = HERE.parent
sys.path.insert(0, str(TRAINED))
import tasks  # noqa: E402  (numpy + onnxruntime only)

SUBSET_SIZE = 16
COMMIT_LIMIT = 3_300_000
PRESETS = [nncf.QuantizationPreset.PERFORMANCE, nncf.QuantizationPreset.MIXED]


def calibration(task: str) -> nncf.Dataset:
    return nncf.Dataset(tasks.samples(task, "calib"))


def quantize(model: dict, preset: nncf.QuantizationPreset) -> dict:
    path = HERE / f"{model['file'].removesuffix('.onnx')}_{preset.value}.onnx"
    entry = {"file": path.name, "architecture": model["architecture"], "task": model["task"],
             "tool": "nncf.quantize (ONNX backend)", "version": nncf.__version__,
             "settings": {"preset": preset.value, "subset_size": SUBSET_SIZE, "target_device": "ANY",
                          "fast_bias_correction": True},
             "made_by": "make.py", "float": f"../float/{model['file']}", "licence": model["licence"]}
    try:
        quantized = nncf.quantize(onnx.load(TRAINED / "float" / model["file"]), calibration(model["task"]),
                                  preset=preset, subset_size=SUBSET_SIZE)
    except Exception as error:  # noqa: BLE001 - a quantizer's failure is recorded, not fatal
        entry["quantizer_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        return entry
    onnx.save(quantized, path)
    entry |= {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
              "committed": path.stat().st_size <= COMMIT_LIMIT}
    return entry


def main() -> None:
    models = json.loads((TRAINED / "float" / "manifest.json").read_text())
    manifest = []
    for model in models:
        for preset in PRESETS:
            manifest.append(quantize(model, preset))
            print(json.dumps(manifest[-1]), flush=True)
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (HERE / ".gitignore").write_text("".join(f"{e['file']}\n" for e in manifest if not e.get("committed", True)))


if __name__ == "__main__":
    main()
