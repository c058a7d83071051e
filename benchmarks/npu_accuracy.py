"""Does `qdq fix --target npu` keep trained models working? Equalization and bias correction measured (issue 35).

For each PP-OCR model of the trained corpus (`tests/trained/`) quantized by onnxruntime and NNCF,
it runs `qdq fix --target npu` (always written: `--keep-failed`) without data and with
`--calibrate tests/trained/data/TASK_calib.npz`, each as shipped (QDQ510 and QDQ511 off) and
with both turned on, and prints the task metric (top-1, F1, string
accuracy) next to the float model, the quantized input and AMD Quark's XINT8 of the same float
model, with each fixed model's relative L2 distance from the float model's outputs on the
evaluation set and the fix's own verdict.

    python tests/trained/float/make_float.py       # the det/rec float models, once
    python benchmarks/npu_accuracy.py [--tasks cls det rec] [--json results.json]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TRAINED = REPO / "tests" / "trained"
sys.path.insert(0, str(TRAINED))
sys.path.insert(0, str(REPO))

import tasks  # noqa: E402

from qdq.cli import main as qdq  # noqa: E402

# The score each task is judged by (tasks.metric returns more).
SCORE = {"cls": "top1", "det": "f1", "rec": "string_accuracy"}
# The shipped npu rule set with QDQ510 and QDQ511 turned on (they ship off).
OPT_IN = REPO / "examples" / "rules" / "npu_accuracy.toml"
# Variants of the fix: (label, whether QDQ510 and QDQ511 run, with calibration data).
VARIANTS = [
    ("no data, before", False, False),
    ("no data, after", True, False),
    ("calibrated, before", False, True),
    ("calibrated, after", True, True),
]


def inputs_of(task: str) -> list[dict[str, np.ndarray]]:
    feeds = tasks.inputs(task)
    count = len(next(iter(feeds.values())))
    return [{name: values[i] if values[i].ndim == 4 else values[i][None] for name, values in feeds.items()}
            for i in range(count)]


def outputs(path: Path, samples: list[dict[str, np.ndarray]]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, feeds)[0].ravel() for feeds in samples])


def distance(reference: np.ndarray, candidate: np.ndarray) -> float:
    return round(float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference)), 4)


def fixed(model: Path, out: Path, rules: list[str], calibration: Path | None) -> dict:
    argv = ["fix", str(model), *rules, "-o", str(out), "--keep-failed", "--format", "json"]
    if calibration is not None:
        argv += ["--calibrate", str(calibration)]
    text, errors = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(text), redirect_stderr(errors):
        code = qdq(argv)
    seconds = round(time.perf_counter() - start, 1)
    if not out.exists():
        return {"exit": code, "error": errors.getvalue().strip().splitlines()[-1:], "seconds": seconds}
    report = json.loads(text.getvalue())
    verdict = report.get("verification") or {}
    return {"exit": code, "seconds": seconds, "verdict": verdict.get("passed"),
            "changes": report.get("changes_by_rule", {})}


def measure(task: str, quantized: list[Path], folder: Path, variants: list[tuple[str, bool, bool]]) -> list[dict]:
    samples = inputs_of(task)
    float_model = TRAINED / "float" / f"ppocr_{task}.onnx"
    reference = outputs(float_model, samples)
    score = SCORE[task]
    quark = TRAINED / "quark" / f"ppocr_{task}_xint8.onnx"
    rows = [{"model": str(p.relative_to(TRAINED)), "variant": "as quantized"} for p in [float_model, quark]]
    for row, path in zip(rows, [float_model, quark]):
        row[score] = tasks.metric(path, task)[score]
        row["distance"] = distance(reference, outputs(path, samples))
    calibration = TRAINED / "data" / f"{task}_calib.npz"
    for model in quantized:
        rows.append({"model": str(model.relative_to(TRAINED)), "variant": "input",
                     score: tasks.metric(model, task)[score], "distance": distance(reference, outputs(model, samples))})
        for label, accuracy_steps, calibrated in variants:
            rules = ["--rules", str(OPT_IN)] if accuracy_steps else ["--target", "npu"]
            out = folder / f"{model.stem}_{len(rows)}.onnx"
            row = {"model": str(model.relative_to(TRAINED)), "variant": label,
                   **fixed(model, out, rules, calibration if calibrated else None)}
            if out.exists():
                row[score] = tasks.metric(out, task)[score]
                row["distance"] = distance(reference, outputs(out, samples))
            rows.append(row)
            print(_line(task, row), flush=True)
    return rows


def _line(task: str, row: dict) -> str:
    score = row.get(SCORE[task])
    shown = f"{score:.3f}" if score is not None else "-"
    verdict = {True: "PASS", False: "FAIL", None: "-"}[row.get("verdict")]
    return (f"{task:4} {row['model']:36} {row['variant']:20} {SCORE[task]} {shown:>6}  "
            f"rel L2 from float {row.get('distance', '-')!s:>7}  verdict {verdict}  {row.get('seconds', '')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["cls", "det", "rec"], choices=sorted(SCORE))
    parser.add_argument("--models", nargs="*", default=["ort/*u8s8.onnx", "ort/*s8_per_channel.onnx",
                                                        "nncf/*performance.onnx"],
                        help="globs under tests/trained/ (TASK in the file name picks the task)")
    parser.add_argument("--variants", nargs="+", default=[label for label, _, _ in VARIANTS],
                        choices=[label for label, _, _ in VARIANTS],
                        help="which fixes to run (calibrated ones take minutes: the exponent search)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for task in args.tasks:
            if not (TRAINED / "float" / f"ppocr_{task}.onnx").exists():
                print(f"{task}: no float model; run python tests/trained/float/make_float.py")
                continue
            quantized = sorted({p for pattern in args.models for p in TRAINED.glob(pattern)
                                if p.name.startswith(f"ppocr_{task}_")})
            variants = [v for v in VARIANTS if v[0] in args.variants]
            rows = measure(task, quantized, Path(scratch), variants)
            for row in rows:
                if "seconds" not in row:
                    print(_line(task, row))
            results += [{"task": task, **row} for row in rows]
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
