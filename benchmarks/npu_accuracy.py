"""Does `qdq fix --target npu` keep trained models working, as well as AMD Quark's XINT8 does? (issue 35)

For each PP-OCR model of the trained corpus (`tests/trained/`) quantized by onnxruntime, NNCF and
ModelOpt, it runs `qdq fix --target npu` (always written: `--keep-failed`) without data and with
`--calibrate tests/trained/data/TASK_calib.npz`, each as shipped and with QDQ510 (equalization)
and QDQ511 (bias correction) turned on (`examples/rules/npu_accuracy.toml`), and prints the task
metric (top-1, F1, string accuracy) next to the float model, the quantized input and AMD Quark's
XINT8 of the same float model, with each model's relative L2 distance from the float model's
outputs and the fix's own verdict (random inputs).

Every model is compared with Quark's on the same samples: the samples it scores below and above
Quark's, and the two-sided exact sign test on those (benchmarks/significance.py's), so "within a point
of Quark" and "below Quark" come with a p-value. A sample is a line (right or wrong) for cls and
rec and a page for det, scored by that page's own F1; the det metric itself is the F1 of all
boxes pooled, so its difference from Quark's and the mean per-page difference can disagree a
little. `ci95` is the normal 95 % interval of the mean per-sample difference, in points.

    python tests/trained/float/make_float.py                 # the det/rec float models, once
    python tests/trained/data/make_data.py --split bench     # needs Pillow
    python benchmarks/npu_accuracy.py [--split bench] [--tasks cls det rec] [--json results.json]

`--split eval` (the default) uses the committed evaluation sets (64 lines, 32 pages); `--split bench`
the larger ones `make_data.py --split bench` writes (512 classifier lines, 256 pages, 256 lines).
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
sys.path[:0] = [str(REPO), str(TRAINED), str(REPO / "benchmarks")]

import tasks  # noqa: E402
from significance import paired  # noqa: E402

from qdq.cli import main as qdq  # noqa: E402

# The score each task is judged by (tasks.metric returns more).
SCORE = {"cls": "top1", "det": "f1", "rec": "string_accuracy"}
# The shipped npu rule set with QDQ510 and QDQ511 turned on (they ship off).
OPT_IN = REPO / "examples" / "rules" / "npu_accuracy.toml"
# Variants of the fix: (label, rule set file or None for `--target npu`, with calibration data).
VARIANTS = [
    ("no data", None, False),
    ("no data, QDQ510+511", OPT_IN, False),
    ("calibrated", None, True),
    ("calibrated, QDQ510+511", OPT_IN, True),
]
MODELS = ["ort/*u8s8.onnx", "ort/*u8s8_percentile.onnx", "ort/*s8_per_channel.onnx", "nncf/*performance.onnx",
          "nncf/*mixed.onnx", "modelopt/*int8.onnx"]


def distance(reference: np.ndarray, candidate: np.ndarray) -> float:
    return round(float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference)), 4)


def against(quark: np.ndarray, scores: np.ndarray) -> dict:
    """A model's per-sample scores against Quark's on the same samples: flips, sign test, mean difference."""
    flips = paired(quark, scores, keep=0.0)
    difference = 100 * (scores - quark)
    half = 1.96 * difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else 0.0
    return {"worse": flips["worse"], "better": flips["better"], "p": round(flips["p"], 4),
            "ci95": [round(float(difference.mean() - half), 2), round(float(difference.mean() + half), 2)]}


def fixed(model: Path, out: Path, rules: list[str], calibration: Path | None, verify: bool) -> dict:
    argv = ["fix", str(model), *rules, "-o", str(out), "--keep-failed", "--format", "json"]
    if calibration is not None:
        argv += ["--calibrate", str(calibration)]
    if not verify:
        argv.append("--no-verify")
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


class Scorer:
    """Runs models on one task's evaluation samples and scores them against the float model and Quark's."""

    def __init__(self, task: str, split: str):
        self.task, self.split, self.score = task, split, SCORE[task]
        self.feeds = tasks.inputs(task, split)
        self.reference = tasks.run(TRAINED / "float" / f"ppocr_{task}.onnx", self.feeds)
        self.quark = None
        self.quark_row = self(TRAINED / "quark" / f"ppocr_{task}_xint8.onnx")
        self.quark = np.array(self.quark_row["per_sample"])  # what every later row is paired with

    def __call__(self, path: Path) -> dict:
        outputs = tasks.run(path, self.feeds)
        scores = tasks.per_sample(outputs, self.task, self.split)
        row = {self.score: tasks.figures(outputs, self.task, self.split)[self.score],
               "distance": distance(self.reference, outputs), "per_sample": [round(float(s), 4) for s in scores]}
        if self.quark is not None:
            row["vs_quark"] = against(self.quark, scores)
        return row


def measure(task: str, quantized: list[Path], folder: Path, variants: list[tuple[str, Path | None, bool]],
            split: str, verify: bool) -> list[dict]:
    scorer = Scorer(task, split)
    rows = [{"model": f"float/ppocr_{task}.onnx", "variant": "as made", **scorer(TRAINED / "float" / f"ppocr_{task}.onnx")},
            {"model": f"quark/ppocr_{task}_xint8.onnx", "variant": "as quantized", **scorer.quark_row}]
    for row in rows:
        print(_line(task, row), flush=True)
    calibration = TRAINED / "data" / f"{task}_calib.npz"
    for model in quantized:
        rows.append({"model": str(model.relative_to(TRAINED)), "variant": "input", **scorer(model)})
        print(_line(task, rows[-1]), flush=True)
        for label, rules_file, calibrated in variants:
            rules = ["--rules", str(rules_file)] if rules_file else ["--target", "npu"]
            out = folder / f"{model.stem}_{len(rows)}.onnx"
            row = {"model": str(model.relative_to(TRAINED)), "variant": label,
                   **fixed(model, out, rules, calibration if calibrated else None, verify)}
            if out.exists():
                row.update(scorer(out))
                out.unlink()
            rows.append(row)
            print(_line(task, row), flush=True)
    return rows


def _line(task: str, row: dict) -> str:
    score = row.get(SCORE[task])
    shown = f"{score:.3f}" if score is not None else "-"
    verdict = {True: "PASS", False: "FAIL", None: "-"}[row.get("verdict")]
    paired = row.get("vs_quark")
    quark = (f"vs Quark {paired['worse']:3} worse {paired['better']:3} better p {paired['p']:<6} "
             f"ci95 [{paired['ci95'][0]:+.1f}, {paired['ci95'][1]:+.1f}]") if paired else ""
    return (f"{task:4} {row['model']:36} {row['variant']:22} {SCORE[task]} {shown:>6}  "
            f"rel L2 {row.get('distance', '-')!s:>7}  {quark}  verdict {verdict}  {row.get('seconds', '')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["cls", "det", "rec"], choices=sorted(SCORE))
    parser.add_argument("--split", choices=["eval", "bench"], default="eval",
                        help="the committed evaluation sets, or the larger ones make_data.py --split bench writes")
    parser.add_argument("--models", nargs="*", default=MODELS,
                        help="globs under tests/trained/ (TASK in the file name picks the task)")
    parser.add_argument("--variants", nargs="*", default=[label for label, _, _ in VARIANTS],
                        choices=[label for label, _, _ in VARIANTS],
                        help="which fixes to run (calibrated ones take minutes: the exponent search)")
    parser.add_argument("--rules", nargs="*", type=Path, default=[],
                        help="also fix without data with these rule set files (a candidate change, measured "
                             "beside the shipped one)")
    parser.add_argument("--rules-calibrated", action="store_true",
                        help="fix with the --rules files with --calibrate as well")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip the fix's own verdict (saves its runs; the verdict column shows -)")
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
            variants = [v for v in VARIANTS if v[0] in args.variants] + [
                (f"{'calibrated' if data else 'no data'}, {path.stem}", path, data)
                for path in args.rules for data in ([False, True] if args.rules_calibrated else [False])]
            results += [{"task": task, "split": args.split, **row}
                        for row in measure(task, quantized, Path(scratch), variants, args.split, args.verify)]
            if args.json:  # after every task, so a long run keeps what it measured
                args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
