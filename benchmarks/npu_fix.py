"""What `qdq fix --target npu` costs in accuracy, on the test CNN of examples/cnn.py.

For each quantized model (onnxruntime PTQ with float scales, FX QAT with power-of-two fake-quant)
it runs the NPU fix and prints the error against the float model before and after, the error of
the fixed model against its input, how many tensors each rule touched, and the time the fix took.

    python benchmarks/npu_fix.py [--json results.json] [--samples 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))

import cnn  # noqa: E402

from qdq.engine.fix import fix  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.graph.model import load_model, save_model  # noqa: E402
from qdq.rewrite.rule import Severity  # noqa: E402
from qdq.verification.verify import compare_arrays  # noqa: E402


def outputs(path: Path, inputs: list[np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": x})[0] for x in inputs])


def error(reference: np.ndarray, candidate: np.ndarray) -> dict:
    result = compare_arrays("logits", reference, candidate, atol=np.inf, rtol=0.0, min_sqnr=None)
    return {"relative_l2": round(result.relative_l2, 5), "sqnr_db": round(result.sqnr_db, 2),
            "top1_agreement": round(float(np.mean(reference.argmax(1) == candidate.argmax(1))), 3)}


def measure(name: str, quantized: Path, float_out: np.ndarray, inputs: list[np.ndarray], folder: Path) -> dict:
    model = load_model(quantized)
    start = time.perf_counter()
    result = fix(model, load_target("npu"))
    seconds = time.perf_counter() - start
    fixed = folder / f"{name}_npu.onnx"
    save_model(model, fixed)
    before, after = outputs(quantized, inputs), outputs(fixed, inputs)
    touched = Counter(c.code for c in result.changes)
    return {
        "model": name,
        "fix_seconds": round(seconds, 3),
        "rounds": result.rounds,
        "converged": result.converged,
        "remaining_findings": [f.code for f in result.result.failing(Severity.WARNING)],
        "tensors_touched_by_rule": dict(sorted(touched.items())),
        "before_vs_float": error(float_out, before),
        "after_vs_float": error(float_out, after),
        "after_vs_before": error(before, after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--samples", type=int, default=16, help="inputs to evaluate on (default 16)")
    args = parser.parse_args()
    inputs = [x for x in cnn.calibration_data(args.samples, seed=1)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        float_path = cnn.export_float(folder / "float.onnx")
        float_out = outputs(float_path, inputs)
        models = {
            "ort_ptq": cnn.quantize_ort(float_path, folder / "ort_ptq.onnx", cnn.calibration_data(8)),
            "fx_pow2_qat": cnn.export_fx_pow2_qat(folder / "fx_pow2_qat.onnx"),
        }
        results = [measure(name, path, float_out, inputs, folder) for name, path in models.items()]
    for r in results:
        print(f"{r['model']}: {r['rounds']} rounds, {r['fix_seconds']} s, converged={r['converged']}, "
              f"remaining={r['remaining_findings'] or 'none'}")
        for key in ("before_vs_float", "after_vs_float", "after_vs_before"):
            e = r[key]
            print(f"  {key:16s} rel L2 {e['relative_l2']:.5f}  SQNR {e['sqnr_db']:6.2f} dB  top-1 agreement {e['top1_agreement']:.3f}")
        print("  tensors touched: " + ", ".join(f"{code} {n}" for code, n in r["tensors_touched_by_rule"].items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
