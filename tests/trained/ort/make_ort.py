"""onnxruntime `quantize_static` QDQ models of the trained corpus's float models.

Reads `../float/MODEL.onnx` (run `../float/make_float.py` first for the files not committed),
runs onnxruntime's `quant_pre_process` on it as onnxruntime's documentation asks (with
`skip_symbolic_shape=True`: symbolic shape inference fails on all four models), calibrates on `../data/TASK_calib.npz` (16 samples fed one at a time, MinMax) and writes
`MODEL_VARIANT.onnx` here with `manifest.json`. The files are what `quantize_static` wrote; each
entry records whether onnxruntime loads it and its task metric (`../tasks.py`).

    python tests/trained/ort/make_ort.py

Files over the corpus's size limit are listed in `.gitignore` and made again by this script
(MinMax over fixed samples, so a re-run writes the same numbers; the manifest keeps the sha256).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter
import onnxruntime
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tasks  # noqa: E402

COMMIT_LIMIT = 3_300_000  # bytes; larger files are regenerated, not committed
# Near the limit and saying nothing the committed recognizers do not (all lose every string):
# regenerated, to keep the repository lean.
NOT_COMMITTED = {"ppocr_rec_u8s8_conv_matmul.onnx", "ppocr_rec_u8s8_percentile.onnx"}
MODELS = json.loads((HERE.parent / "float" / "manifest.json").read_text())
U8S8 = {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8, "per_channel": False}
S8_PER_CHANNEL = {"activation_type": QuantType.QInt8, "weight_type": QuantType.QInt8, "per_channel": True}


@dataclass
class Variant:
    options: dict  # quantize_static keywords besides QDQ format and the calibration reader
    preprocess: bool = True  # quant_pre_process first, as onnxruntime's documentation asks
    opset: int | None = None  # onnx.version_converter to this opset first, when the model's is lower
    tasks: tuple[str, ...] = tasks.TASKS  # the models it is made for
    note: str = ""


VARIANTS = {
    "u8s8": Variant(U8S8),
    "s8_per_channel": Variant(S8_PER_CHANNEL, opset=13, note=(
        "converted to opset 13 first: per-channel DequantizeLinear needs `axis`, which opset 11/12 lack")),
    "s8_per_channel_opset_kept": Variant(S8_PER_CHANNEL, tasks=("cls",), note=(
        "what quantize_static writes for per-channel on the opset-11 model as it is: DequantizeLinear with "
        "`axis` at opset 11, which onnxruntime and the ONNX checker refuse")),
    "u8s8_conv_matmul": Variant(U8S8 | {"op_types_to_quantize": ["Conv", "MatMul"]}, note=(
        "only Conv and MatMul quantized, the usual remedy when quantizing every op loses the task "
        "(magika's LayerNorms are computed as E[x^2] - E[x]^2, which int8 Mul/Sub destroy)")),
    "u8s8_percentile": Variant(U8S8 | {"calibrate_method": CalibrationMethod.Percentile}, tasks=("rec", "det"), note=(
        "Percentile calibration (99.999 %), the usual remedy when MinMax ranges are set by outliers")),
    "u8s8_raw": Variant(U8S8, preprocess=False, tasks=("cls",), note=(
        "no quant_pre_process: PP-OCR's weights are Constant nodes, not initializers, so quantize_static "
        "treats them as activations: float weight -> QuantizeLinear -> DequantizeLinear, per-tensor scale "
        "from calibration")),
}


class Samples(CalibrationDataReader):
    """The calibration samples of a task, one at a time."""

    def __init__(self, task: str) -> None:
        self.feeds = iter(tasks.samples(task, "calib"))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def loads(path: Path) -> str:
    try:
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - what onnxruntime says is the record
        return f"no: {str(error).splitlines()[0][:200]}"
    return "yes"


def prepare(source: Path, variant: Variant, scratch: Path) -> Path:
    """The float model as the variant hands it to quantize_static."""
    if variant.preprocess:
        quant_pre_process(source, scratch / "preprocessed.onnx", skip_symbolic_shape=True)
        source = scratch / "preprocessed.onnx"
    model = onnx.load(source)
    opset = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    if variant.opset and opset < variant.opset:
        onnx.save(version_converter.convert_version(model, variant.opset), scratch / "converted.onnx")
        source = scratch / "converted.onnx"
    return source


def main() -> None:
    manifest, ignored = [], []
    for model in MODELS:
        stem = model["file"].removesuffix(".onnx")
        for name, variant in VARIANTS.items():
            if model["task"] not in variant.tasks:
                continue
            path = HERE / f"{stem}_{name}.onnx"
            entry = {"file": path.name, "architecture": model["architecture"], "task": model["task"],
                     "tool": "onnxruntime.quantization.quantize_static", "version": onnxruntime.__version__,
                     "settings": {key: str(value) for key, value in variant.options.items()}
                     | {"calibrate_method": str(variant.options.get("calibrate_method", "MinMax")), "quant_pre_process": variant.preprocess,
                        "opset": variant.opset}, "note": variant.note,
                     "made_by": "make_ort.py", "float": f"../float/{model['file']}", "licence": model["licence"]}
            try:
                with tempfile.TemporaryDirectory() as scratch:
                    source = prepare(HERE.parent / "float" / model["file"], variant, Path(scratch))
                    quantize_static(source, path, Samples(model["task"]), quant_format=QuantFormat.QDQ,
                                    **variant.options)
            except Exception as error:  # noqa: BLE001 - a quantizer's failure is recorded, not fatal
                entry["quantizer_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                path.unlink(missing_ok=True)
                manifest.append(entry)
                print(json.dumps(entry))
                continue
            entry |= {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "committed": path.stat().st_size <= COMMIT_LIMIT and path.name not in NOT_COMMITTED,
                      "ort_loads": loads(path)}
            if entry["ort_loads"] == "yes":
                entry["metric"] = tasks.metric(path, model["task"])
            if not entry["committed"]:
                ignored.append(path.name)
            manifest.append(entry)
            print(json.dumps(entry))
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (HERE / ".gitignore").write_text("".join(f"{name}\n" for name in ignored))


if __name__ == "__main__":
    main()
