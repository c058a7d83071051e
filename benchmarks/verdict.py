"""Does the verdict agree with the task? The measurement behind the rule sets' [verdict] margins.

For every model of a corpus and every target it runs `qdq fix --no-verify`, then measures per fix:

- the task, paired: the input's and the fixed model's figure on held-out samples, how many samples
  the fixed model newly gets wrong and newly gets right, and the two-sided sign test's p-value on
  those flips (could the loss be chance?);
- each row the verdict judges, separately: every output's and the network's deepest quantized
  tensors' distances from the input's float twin (input → twin, fixed → twin), on random inputs the
  model is meant to see and on held-out samples given as --inputs.

Corpora (`--corpus`):

- `digits`: every tests/corpus model quantized from a digits-trained network (ResNet-,
  MobileNetV2-, YOLO-, ViT-style): top-1 on the 360 held-out digits (the test split of
  examples/networks.py, never seen in training or calibration), the verdict on 16 of them;
- `trained`: the tests/trained files on disk (PP-OCR's direction classifier, detector and
  recognizer, magika): the task metric on the evaluation set in the target's arithmetic
  (tests/trained/tasks.py), the verdict on that set. A sample's score is a class or string right
  or wrong, a page's F1 for the detector.

    python benchmarks/verdict.py [--corpus digits|trained] [--json FILE] [--targets npu,trt,ort]
                                 [--limit N] [--only TEXT]
    python benchmarks/verdict.py --choose FILE [FILE ...]

`--choose` replays the verdict on the measured distances: over the files given, for a grid of the
deepest tensors' (margin, epsilon) at the outputs' shipped ones, and of the outputs' at the deep
row's shipped ones, how often the verdict passes a fix that loses the task or refuses one that
keeps it (`outcome`).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from functools import partial
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "examples"), str(REPO / "tests" / "corpus" / "float"), str(REPO / "tests"),
                str(REPO / "tests" / "trained"), str(REPO / "benchmarks")]

import cli  # noqa: E402
from qdq.engine.registry import claims_exact  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.support.runtime import session as new_session  # noqa: E402
from qdq.verification.verdict import Criterion, judge  # noqa: E402
from significance import outcome, paired  # noqa: E402

ARCHITECTURES = ("resnet", "mobilenetv2", "yolo", "transformer")
# Points of digits top-1 (360 samples) a fix may lose and still keep the task; the trained corpus's
# headline figures (32-64 samples) may lose benchmarks/trained.py's KEEP.
DIGITS_KEEP_POINTS = 1.0
DEEP_MARGINS = (0.41, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, math.inf)
DEEP_EPSILONS = (0.03, 0.05, 0.1, 0.2)
MARGINS = (0.25, 0.41, 0.75, 1.0, 1.5)
EPSILONS = (0.01, 0.03, 0.05)


def judged_rows(result) -> dict:
    """The verdict's rows as measured: each output's (input → twin, fixed → twin, evidence), the deepest
    tensors' (input → twin, fixed → twin) or None where not judged, and the verdict as shipped."""
    deep = result.network
    return {"twin": any(o.input_to_twin is not None for o in result.outputs),
            "outputs": [[_kept(o.input_to_twin), _kept(o.candidate_to_twin), o.evidence] for o in result.outputs],
            "deep": [_kept(deep.input_to_twin), _kept(deep.candidate_to_twin)] if deep is not None else None,
            "passed": result.passed}


def _kept(distance: float | None) -> float | None:
    """A distance to 5 significant digits: the file stays small, the verdict replays the same."""
    return distance if distance is None or not math.isfinite(distance) else float(f"{distance:.5g}")


def replay(rows: dict, margin: float, epsilon: float, deep_margin: float, deep_epsilon: float) -> str:
    """The verdict (`pass`, `refuse` or `no evidence`) the criterion would give on these measured rows."""
    if not rows["twin"]:  # compared with the input directly: the margins play no part
        return "pass" if rows["passed"] else "refuse"
    if not all(evidence for _, _, evidence in rows["outputs"]):
        return "no evidence"
    held = all(c <= i * (1 + margin) + epsilon for i, c, _ in rows["outputs"])
    if rows["deep"] is not None:
        i, c = rows["deep"]
        held = held and c <= i * (1 + deep_margin) + deep_epsilon
    return "pass" if held else "refuse"


def run_cli(*argv) -> int:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return cli.main([str(a) for a in argv])


def fixed_by(model: Path, target: str, folder: Path) -> tuple[Path, bool] | None:
    """The fixed file, and whether its changes all claim to be exact (then `qdq fix` holds them to identity)."""
    out, report = folder / f"{model.stem}.{target}.onnx", folder / f"{model.stem}.{target}.json"
    code = run_cli("fix", model, "--target", target, "-o", out, "--no-verify", "--isolated", "--report", report)
    if code == 2 or not out.exists():
        return None
    return out, claims_exact(change["code"] for change in json.loads(report.read_text())["changes"])


def verdicts(model: Path, fixed: Path, exact: bool, target: str, held_out: list[dict], label: str) -> dict:
    """The verdict `qdq fix` gives, on random inputs and on the held-out samples: an exact claim is judged as
    exact, as fix judges it (bit-identical outputs and integers, optimisations off), not by the margins."""
    ruleset = load_target(target)
    criterion = Criterion.of(ruleset)
    return {"exact": exact, "random": judged_rows(judge(model, fixed, ruleset, criterion, exact=exact)),
            "held_out": judged_rows(judge(model, fixed, ruleset, criterion, held_out, label, exact=exact))}


# --- the digits corpus ---------------------------------------------------------------------------


def corpus_entries(limit: int | None, only: str = "") -> list[tuple[Path, str]]:
    entries = []
    for manifest in sorted((REPO / "tests" / "corpus").glob("*/manifest.json")):
        for entry in json.loads(manifest.read_text()):
            if entry.get("architecture") in ARCHITECTURES and entry["file"].endswith(".onnx") \
                    and manifest.parent.name != "float" and only in f"{manifest.parent.name}/{entry['file']}":
                entries.append((manifest.parent / entry["file"], entry["architecture"]))
    return entries[:limit] if limit else entries


def held_out_digits(arch: str) -> tuple[np.ndarray, np.ndarray]:
    import make_float

    data = make_float.data_for(arch)
    return data[2].numpy().astype(np.float32), data[3].numpy()


def logits(path: Path, images: np.ndarray, optimized: bool = False) -> np.ndarray:
    session = new_session(path, optimized=optimized)
    name = session.get_inputs()[0].name
    batch = session.get_inputs()[0].shape[0]
    if isinstance(batch, int) and batch == 1:
        return np.concatenate([session.run(None, {name: images[i:i + 1]})[0] for i in range(len(images))])
    return session.run(None, {name: images})[0]


def measure_digits(path: Path, arch: str, target: str, images, labels, folder: Path) -> dict | None:
    made = fixed_by(path, target, folder)
    if made is None:
        return None
    fixed, exact = made
    optimized = Criterion.of(load_target(target)).runtime == "optimized"
    floats = logits(REPO / "tests" / "corpus" / "float" / f"{arch}.onnx", images)
    before = (logits(path, images, optimized).argmax(1) == labels).astype(float)
    after = (logits(fixed, images, optimized).argmax(1) == labels).astype(float)
    task = {"metric": "top-1", "float": 100 * float(np.mean(floats.argmax(1) == labels)),
            "input": 100 * float(before.mean()), "fixed": 100 * float(after.mean()),
            **paired(before, after, DIGITS_KEEP_POINTS)}
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name  # exporters name it as they like
    samples = [{name: images[i:i + 1]} for i in range(16)]
    return {"corpus": "digits", "model": f"{path.parent.name}/{path.name}", "target": target, "task": task,
            **verdicts(path, fixed, exact, target, samples, "16 held-out digits")}


def digits_rows(targets: list[str], limit: int | None, only: str):
    data = {arch: held_out_digits(arch) for arch in ARCHITECTURES}
    with tempfile.TemporaryDirectory(prefix="qdq-verdict-") as folder:
        for path, arch in corpus_entries(limit, only):
            for target in targets:
                yield f"{path.name} {target}", partial(measure_digits, path, arch, target, *data[arch], Path(folder))


# --- the trained corpus --------------------------------------------------------------------------


def trained_rows(targets: list[str], limit: int | None, only: str):
    import tasks
    import trained

    scored: dict = {}

    def score(model: Path, task: str, optimized: bool) -> tuple[dict, np.ndarray]:
        outputs = tasks.run(model, tasks.inputs(task), optimized)
        return tasks.figures(outputs, task), tasks.per_sample(outputs, task)

    def measure(folder: str, entry: dict, target: str, scratch: Path) -> dict | None:
        task, model = entry["task"], REPO / "tests" / "trained" / folder / entry["file"]
        made = fixed_by(model, target, scratch)
        if made is None:
            return None
        fixed, exact = made
        optimized = Criterion.of(load_target(target)).runtime == "optimized"  # the target's arithmetic
        if (model, optimized) not in scored:
            scored[(model, optimized)] = score(model, task, optimized)
        (before, before_samples), (after, after_samples) = scored[(model, optimized)], score(fixed, task, optimized)
        figures = {"metric": task, "float": None, "input": 100 * trained.headline(task, before),
                   "fixed": 100 * trained.headline(task, after),
                   **paired(before_samples, after_samples, 100 * trained.KEEP)}
        eval_set = REPO / "tests" / "trained" / "data" / f"{task}_eval.npz"
        return {"corpus": "trained", "model": f"{folder}/{entry['file']}", "target": target, "task": figures,
                **verdicts(model, fixed, exact, target, tasks.samples(task), str(eval_set))}

    with tempfile.TemporaryDirectory(prefix="qdq-verdict-") as scratch:
        for folder, entry in trained.quantized_files(only)[:limit]:
            for target in targets:
                yield f"{folder}/{entry['file']} {target}", partial(measure, folder, entry, target, Path(scratch))


# --- the choice ----------------------------------------------------------------------------------


def disagreements(rows: list[dict], margin: float, epsilon: float, deep_margin: float, deep_epsilon: float) -> dict:
    """Per corpus and inputs: passes of a fix that lost the task, refusals of one that kept it, and the
    verdicts on fixes whose loss is unclear (more than the task's `keep`, too few flips to tell)."""
    counts: dict = {}
    for row in rows:
        lost_or_kept = outcome(row["task"])
        for inputs in ("random", "held_out"):
            said = replay(row[inputs], margin, epsilon, deep_margin, deep_epsilon)
            if said == "no evidence":
                continue
            tally = counts.setdefault(f"{row['corpus']} {inputs}", dict.fromkeys(
                ("judged", "false_pass", "false_refusal", "unclear_pass", "unclear_refusal"), 0))
            tally["judged"] += 1
            tally["false_pass"] += said == "pass" and lost_or_kept == "lost"
            tally["false_refusal"] += said == "refuse" and lost_or_kept == "kept"
            tally[f"unclear_{'pass' if said == 'pass' else 'refusal'}"] += lost_or_kept == "unclear"
    return counts


def choose(rows: list[dict], shipped: Criterion) -> dict:
    """Both grids: the deep row's criterion at the outputs' shipped one, and the outputs' at the deep row's."""
    grid = {"deep": [], "outputs": []}
    for deep_margin in DEEP_MARGINS:
        for deep_epsilon in DEEP_EPSILONS:
            grid["deep"].append({"deep_margin": deep_margin, "deep_epsilon": deep_epsilon, **totals(disagreements(
                rows, shipped.margin, shipped.epsilon, deep_margin, deep_epsilon))})
    for margin in MARGINS:
        for epsilon in EPSILONS:
            grid["outputs"].append({"margin": margin, "epsilon": epsilon, **totals(disagreements(
                rows, margin, epsilon, shipped.deep_margin, shipped.deep_epsilon))})
    return grid


def deep_decides(rows: list[dict], shipped: Criterion) -> list[dict]:
    """The verdicts the deep row decides: the outputs carry evidence and pass as shipped, the deepest
    tensors were judged. Each with the margin the deep row needs to pass (at the shipped deep_epsilon),
    so a deep_margin passes exactly those needing less; most needed first."""
    found = []
    for row in rows:
        for inputs in ("random", "held_out"):
            judged = row[inputs]
            if judged["deep"] is None or replay(judged, shipped.margin, shipped.epsilon, math.inf, 0) != "pass":
                continue
            i, c = judged["deep"]
            task = row["task"]
            found.append({"corpus": row["corpus"], "model": row["model"], "target": row["target"], "inputs": inputs,
                          "deep": [i, c], "needs": (c - shipped.deep_epsilon) / i - 1 if i > 0 else math.inf,
                          "task": [task["input"], task["fixed"], task["worse"], task["better"], task["p"]],
                          "outcome": outcome(task)})
    return sorted(found, key=lambda d: -d["needs"])


def rows_apart(rows: list[dict]) -> dict:
    """Per corpus and inputs: the task's outcomes, and each kind of row's candidate→twin ÷ input→twin
    (median, 90th percentile, max) over the verdicts with evidence."""
    summary: dict = {}
    for row in rows:
        for inputs in ("random", "held_out"):
            judged = row[inputs]
            if not judged["twin"] or not all(evidence for _, _, evidence in judged["outputs"]):
                continue
            part = summary.setdefault(f"{row['corpus']} {inputs}", {"lost": 0, "unclear": 0, "kept": 0,
                                                                    "outputs": [], "deep": []})
            part[outcome(row["task"])] += 1
            part["outputs"].append(max(c / i if i else math.inf for i, c, _ in judged["outputs"]))
            if judged["deep"] is not None:
                part["deep"].append(judged["deep"][1] / judged["deep"][0] if judged["deep"][0] else math.inf)
    for part in summary.values():
        for kind in ("outputs", "deep"):
            ratios = np.array(part[kind])
            part[kind] = {"judged": len(ratios), **({"median": float(np.median(ratios)), "p90": float(
                np.percentile(ratios, 90)), "max": float(ratios.max())} if len(ratios) else {})}
    return summary


def totals(counts: dict) -> dict:
    together = {key: sum(c[key] for c in counts.values()) for key in next(iter(counts.values()), {})}
    return {"by_inputs": counts, **together, "wrong": together.get("false_pass", 0) + together.get("false_refusal", 0)}


def print_grid(grid: dict) -> None:
    for part, keys in (("deep", ("deep_margin", "deep_epsilon")), ("outputs", ("margin", "epsilon"))):
        others = "outputs' margin and epsilon as shipped" if part == "deep" else "deepest tensors' as shipped"
        print(f"\n{part} row(s) judged with each criterion, the {others}; "
              "wrong = false passes + false refusals (unclear losses apart):")
        print(f"{keys[0]:>12} {keys[1]:>12}  judged  wrong  false pass  false refusal  unclear pass/refusal  "
              "by corpus and inputs (false pass + false refusal)")
        for t in grid[part]:
            detail = ", ".join(f"{name} {c['false_pass']}+{c['false_refusal']}" for name, c in t["by_inputs"].items())
            print(f"{t[keys[0]]:12g} {t[keys[1]]:12g}  {t['judged']:6d}  {t['wrong']:5d}  {t['false_pass']:10d}  "
                  f"{t['false_refusal']:13d}  {t['unclear_pass']:9d}/{t['unclear_refusal']:<10d}  {detail}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=("digits", "trained"), default="digits")
    parser.add_argument("--json", type=Path, help="write every row here as it is measured")
    parser.add_argument("--targets", default="npu,trt,ort")
    parser.add_argument("--limit", type=int, help="only the first N models")
    parser.add_argument("--only", default="", help="only models whose folder/file contains this")
    parser.add_argument("--choose", type=Path, nargs="+", metavar="FILE",
                        help="replay the verdict on these measurements over the grids, print them and stop")
    args = parser.parse_args(argv)
    if args.choose:
        rows = [row for path in args.choose for row in json.loads(path.read_text())["rows"]]
        shipped = Criterion.of(load_target("common"))
        grid = choose(rows, shipped) | {"deep_decides": deep_decides(rows, shipped), "rows_apart": rows_apart(rows)}
        print("corpus, inputs: verdicts with evidence (task lost / unclear / kept); candidate→twin ÷ input→twin, "
              "median / 90th percentile / max, of the worst output and of the deepest tensors (judged)")
        for name, part in grid["rows_apart"].items():
            ratios = ["  ".join(f"{part[k].get(q, math.nan):.2f}" for q in ("median", "p90", "max")) +
                      f" ({part[k]['judged']})" for k in ("outputs", "deep")]
            print(f"{name:18s} {part['lost'] + part['unclear'] + part['kept']:4d} ({part['lost']} / {part['unclear']} / "
                  f"{part['kept']})   outputs {ratios[0]}   deep {ratios[1]}")
        print_grid(grid)
        print(f"\nverdicts the deepest tensors decide (outputs pass as shipped), by the deep margin they need "
              f"at deep_epsilon {shipped.deep_epsilon:g}:")
        for d in grid["deep_decides"]:
            before, after, worse, better, p = d["task"]
            print(f"{d['needs']:8.2f}  {d['deep'][0]:.3f} → {d['deep'][1]:.3f}  {d['corpus']} {d['model']} {d['target']} "
                  f"{d['inputs']}: {before:.1f} → {after:.1f} ({worse} worse, {better} better, p {p:.2g}) {d['outcome']}")
        if args.json:
            args.json.write_text(json.dumps(grid, indent=1) + "\n")
        return
    rows = []
    measured = digits_rows if args.corpus == "digits" else trained_rows
    for label, measure in measured(args.targets.split(","), args.limit, args.only):
        try:
            row = measure()
        except Exception as exc:  # a model this measurement cannot run: say so, go on
            print(f"{label}: skipped ({str(exc).splitlines()[0][:120]})", file=sys.stderr)
            continue
        if row is not None:
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:  # one row a line: small, and a rerun's diff shows what moved
                args.json.write_text('{"rows": [\n' + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")


if __name__ == "__main__":
    main()
