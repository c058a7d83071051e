"""NVIDIA ModelOpt ONNX post-training quantization (int8, its TensorRT placement) of the trained corpus's float models.

Writes `MODEL_int8.onnx` here for each float model of `../float/manifest.json`, and
`manifest.json`: exactly what `modelopt.onnx.quantization.quantize(float.onnx,
quantize_mode="int8", calibration_data=..., calibration_eps=["cpu"], output_path=...)` writes
(its defaults: entropy calibration, the model converted to fp16 with fp16 scales, Q/DQ placed
for TensorRT). Calibration: the 16 samples of `../data/TASK_calib.npz`. Each model runs in a
process of its own on a temporary copy of the float model, for the reasons
`../../corpus/modelopt/make.py` gives (quantize() patches onnxruntime's quantizer registry and
rewrites the file it is given).

ModelOpt must not go into the project's environment, and its `[onnx]` extra pulls
onnxruntime-gpu and cupy. A venv that sees the project's CPU torch, onnx and onnxruntime
needs only ModelOpt and the CPU packages of the extra:

    python3 -m venv --system-site-packages /tmp/venv-modelopt
    /tmp/venv-modelopt/bin/pip install --no-deps nvidia-modelopt==0.47.0
    /tmp/venv-modelopt/bin/pip install onnx-ir onnxconverter-common~=1.16.0 onnxscript onnxslim polygraphy \\
        lief ml_dtypes cppimport pydantic rich omegaconf PuLP scipy nvidia-ml-py safetensors tqdm regex
    /tmp/venv-modelopt/bin/python tests/trained/modelopt/make.py [--only TASK]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINED = HERE.parent
sys.path.insert(0, str(TRAINED))
import tasks  # noqa: E402  (numpy + onnxruntime only)

COMMIT_LIMIT = 3_300_000
OPTIONS = {"quantize_mode": "int8", "calibration_eps": ["cpu"]}


def run(model: dict, path: Path) -> None:
    """One quantize() call on a copy of the float model; main() runs it in a process of its own."""
    from modelopt.onnx.quantization import quantize

    with tempfile.TemporaryDirectory() as workdir:
        copy = shutil.copy(TRAINED / "float" / model["file"], workdir)
        quantize(str(copy), calibration_data=tasks.inputs(model["task"], "calib"), output_path=str(path), **OPTIONS)


def quantize(model: dict) -> dict:
    path = HERE / f"{model['file'].removesuffix('.onnx')}_int8.onnx"
    entry = {"file": path.name, "architecture": model["architecture"], "task": model["task"],
             "tool": "modelopt.onnx.quantization.quantize", "version": version("nvidia-modelopt"),
             "settings": OPTIONS, "made_by": "make.py", "float": f"../float/{model['file']}",
             "licence": model["licence"]}
    process = multiprocessing.get_context("spawn").Process(target=run, args=(model, path))
    process.start()
    process.join()
    if process.exitcode != 0 or not path.exists():
        entry["quantizer_error"] = f"quantize() exited with {process.exitcode} (its log says why)"
        path.unlink(missing_ok=True)
        return entry
    return entry | {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "committed": path.stat().st_size <= COMMIT_LIMIT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the models of this task (the manifest keeps the others)")
    args = parser.parse_args()
    kept = {}
    if (HERE / "manifest.json").exists():
        kept = {e["file"]: e for e in json.loads((HERE / "manifest.json").read_text())}
    for model in json.loads((TRAINED / "float" / "manifest.json").read_text()):
        if args.only in model["task"]:
            entry = quantize(model)
            kept[entry["file"]] = entry
            print(json.dumps(entry), flush=True)
            write(list(kept.values()))


def write(manifest: list[dict]) -> None:
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (HERE / ".gitignore").write_text("".join(f"{e['file']}\n" for e in manifest if not e.get("committed", True)))


if __name__ == "__main__":
    main()
