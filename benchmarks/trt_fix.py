"""What `qdq fix --target trt` changes on the placements users ship, and what it costs.

For each network of examples/networks.py, trained briefly on the digits set, quantized as users
ship it for TensorRT (ResNet and MobileNetV2: pytorch-quantization's default placement, residuals
unquantized; YOLO-style: onnxruntime's quantize_static with uint8 asymmetric activations), it
prints the trt findings and the predicted Q/DQ-caused conversion layers before and after the fix
(with --calibrate on training images), the top-1 accuracy of the float, quantized and fixed
models, and the fixed model's logit SQNR against the quantized one on the test set.

    python benchmarks/trt_fix.py [--epochs 3] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))

import networks  # noqa: E402

from qdq.engine.fix import fix  # noqa: E402
from qdq.engine.lint import lint  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.graph.model import load_model, save_model  # noqa: E402
from qdq.quant.calibrate import tensor_ranges  # noqa: E402
from qdq.verification.verify import compare_arrays  # noqa: E402

PLACEMENTS = {
    "resnet": ("pytorch-quantization", networks.quantize_trt_style),
    "mobilenet": ("pytorch-quantization", networks.quantize_trt_style),
    "yolo": ("ort quantize_static u8", networks.quantize_ort_default),
}


def measure(name: str, epochs: int, folder: Path) -> dict:
    data = networks.load_data(networks.INPUT_CHANNELS[name])
    model = networks.build(name, epochs=epochs, data=data)
    float_path = networks.export_float(model, folder / f"{name}_float.onnx")
    placement, quantize = PLACEMENTS[name]
    quantized = quantize(float_path, folder / f"{name}_quantized.onnx", networks.calibration_batches(data))
    trt = load_target("trt")
    before = lint(load_model(quantized), trt)
    start = time.perf_counter()
    ranges = tensor_ranges(quantized, {"input": data[0][:64].numpy()})
    fixed_model = load_model(quantized)
    result = fix(fixed_model, trt, ranges=ranges)
    seconds = time.perf_counter() - start
    fixed = folder / f"{name}_fixed.onnx"
    save_model(fixed_model, fixed)
    test_x = data[2]
    quantized_logits = networks.predict_onnx(quantized, test_x, optimize=False)
    fixed_logits = networks.predict_onnx(fixed, test_x, optimize=False)
    error = compare_arrays("logits", quantized_logits, fixed_logits, atol=float("inf"), rtol=0.0)
    return {
        "network": name,
        "placement": placement,
        "findings_before": len(before.findings),
        "findings_after": len(result.result.findings),
        "predicted_conversions_before": before.predicted_reformats(),
        "predicted_conversions_after": result.result.predicted_reformats(),
        "changes": len(result.changes),
        "changes_by_rule": result.by_rule(),
        "accuracy_float": networks.accuracy(model, data),
        "accuracy_quantized": networks.accuracy(quantized, data, optimize=False),
        "accuracy_fixed": networks.accuracy(fixed, data, optimize=False),
        "sqnr_db_fixed_vs_quantized": round(error.sqnr_db, 1),
        "max_abs_error": float(error.max_abs_error),
        "fix_seconds": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="float training epochs per network")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qdq-trt-") as folder:
        rows = [measure(name, args.epochs, Path(folder)) for name in PLACEMENTS]
    print(f"{'network':<10} {'placement':<22} {'findings':>12} {'predicted conv.':>16} "
          f"{'top-1 float/quant/fixed':>24} {'SQNR dB':>8} {'max |Δ|':>8}")
    for r in rows:
        print(f"{r['network']:<10} {r['placement']:<22} {r['findings_before']:>5} → {r['findings_after']:<4} "
              f"{r['predicted_conversions_before']:>8} → {r['predicted_conversions_after']:<5} "
              f"{r['accuracy_float']:>8.3f}/{r['accuracy_quantized']:.3f}/{r['accuracy_fixed']:.3f} "
              f"{r['sqnr_db_fixed_vs_quantized']:>8} {r['max_abs_error']:>8.3g}")
        print(f"{'':<10} changes by rule: {r['changes_by_rule']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
