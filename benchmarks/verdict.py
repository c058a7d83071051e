"""Does the verdict agree with the task? The measurement behind the rule sets' [verdict] margins.

For every corpus model quantized from a digits-trained network (tests/corpus/float: ResNet-,
MobileNetV2-, YOLO- and ViT-style, 10 classes) and every target, it runs `qdq fix --no-verify`,
then measures on the held-out digits (the test split of examples/networks.py, never seen in
training or calibration):

- top-1 of the float model, the quantized input and the fixed model, and how many of the float
  model's predictions each keeps;
- the verdict's distances: input → float twin and fixed → float twin (relative L2), on random
  inputs the model is meant to see and on 16 held-out digits given as --inputs;
- the verdict the shipped [verdict] gives, both ways.

    python benchmarks/verdict.py [--json results.json] [--targets npu,trt,ort] [--limit N]

A fix "keeps the task" when it loses at most one point of top-1 against the input model; the
summary counts, for a grid of (margin, epsilon), how often the verdict agrees with that.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "examples"), str(REPO / "tests" / "corpus" / "float")]

import cli  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.support.runtime import session as new_session  # noqa: E402
from qdq.verification.verdict import Criterion, judge  # noqa: E402

ARCHITECTURES = ("resnet", "mobilenetv2", "yolo", "transformer")
MARGINS = (0.1, 0.25, 0.5, 1.0, 2.0)
EPSILONS = (0.001, 0.005, 0.01, 0.02, 0.05)
KEEP_POINTS = 1.0  # a fix keeps the task when top-1 drops by at most this many points against its input


def corpus_entries(limit: int | None) -> list[tuple[Path, str]]:
    entries = []
    for manifest in sorted((REPO / "tests" / "corpus").glob("*/manifest.json")):
        for entry in json.loads(manifest.read_text()):
            if entry.get("architecture") in ARCHITECTURES and entry["file"].endswith(".onnx") \
                    and manifest.parent.name != "float":
                entries.append((manifest.parent / entry["file"], entry["architecture"]))
    return entries[:limit] if limit else entries


def held_out(arch: str) -> tuple[np.ndarray, np.ndarray]:
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


def run_cli(*argv) -> int:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return cli.main([str(a) for a in argv])


def distances(result) -> list[tuple[float, float]]:
    """(input → twin, candidate → twin) of each judged row: the outputs and the deepest quantized tensors."""
    return [(o.input_to_twin, o.candidate_to_twin) for o in result.judged if o.input_to_twin is not None]


def measure(path: Path, arch: str, target: str, images, labels, folder: Path) -> dict | None:
    fixed = folder / f"{path.stem}.{target}.onnx"
    code = run_cli("fix", path, "--target", target, "-o", fixed, "--no-verify", "--isolated")
    if code == 2 or not fixed.exists():
        return None
    ruleset = load_target(target)
    criterion = Criterion.of(ruleset)
    optimized = criterion.runtime == "optimized"
    floats = logits(REPO / "tests" / "corpus" / "float" / f"{arch}.onnx", images)
    before, after = logits(path, images, optimized), logits(fixed, images, optimized)
    row = {
        "model": f"{path.parent.name}/{path.name}", "target": target,
        "top1_float": 100 * float(np.mean(floats.argmax(1) == labels)),
        "top1_input": 100 * float(np.mean(before.argmax(1) == labels)),
        "top1_fixed": 100 * float(np.mean(after.argmax(1) == labels)),
        "kept_input": 100 * float(np.mean(before.argmax(1) == floats.argmax(1))),
        "kept_fixed": 100 * float(np.mean(after.argmax(1) == floats.argmax(1))),
    }
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name  # exporters name it as they like
    samples = [{name: images[i:i + 1]} for i in range(16)]
    for kind, given in (("random", None), ("digits", samples)):
        result = judge(path, fixed, ruleset, criterion, given, "held-out digits" if given else "")
        found = distances(result)
        row[f"{kind}_distances"] = found
        row[f"{kind}_input_to_twin"], row[f"{kind}_fixed_to_twin"] = \
            (max(i for i, _ in found), max(c for _, c in found)) if found else (None, None)
        row[f"{kind}_passed"] = result.passed
        row[f"{kind}_sqnr"] = min(o.sqnr_db for o in result.outputs)
    return row


def agreement(rows: list[dict], kind: str) -> list[dict]:
    """For each (margin, epsilon): fixes the verdict passes that lost the task, and refuses that kept it."""
    table = []
    judged = [r for r in rows if r[f"{kind}_input_to_twin"] is not None]
    for margin in MARGINS:
        for epsilon in EPSILONS:
            false_pass = false_refusal = 0
            for r in judged:
                passes = all(c <= i * (1 + margin) + epsilon for i, c in r[f"{kind}_distances"])
                kept = r["top1_fixed"] >= r["top1_input"] - KEEP_POINTS
                false_pass += passes and not kept
                false_refusal += kept and not passes
            table.append({"margin": margin, "epsilon": epsilon, "judged": len(judged), "false_pass": false_pass,
                          "false_refusal": false_refusal})
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every row and the agreement tables here")
    parser.add_argument("--targets", default="npu,trt,ort")
    parser.add_argument("--limit", type=int, help="only the first N corpus models")
    args = parser.parse_args(argv)
    rows = []
    data = {arch: held_out(arch) for arch in ARCHITECTURES}
    with tempfile.TemporaryDirectory(prefix="qdq-verdict-") as folder:
        for path, arch in corpus_entries(args.limit):
            for target in args.targets.split(","):
                try:
                    row = measure(path, arch, target, *data[arch], Path(folder))
                except Exception as exc:  # a model this measurement cannot run: say so, go on
                    print(f"{path.name} {target}: skipped ({str(exc).splitlines()[0][:120]})", file=sys.stderr)
                    continue
                if row is not None:
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    tables = {kind: agreement(rows, kind) for kind in ("random", "digits")}
    for kind, table in tables.items():
        print(f"\nverdict on {kind} inputs against top-1 (kept = at most {KEEP_POINTS:g} point lost):")
        print("margin  epsilon  judged  false pass  false refusal")
        for t in table:
            print(f"{t['margin']:6g}  {t['epsilon']:7g}  {t['judged']:6d}  {t['false_pass']:10d}  {t['false_refusal']:13d}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "agreement": tables}, indent=1) + "\n")


if __name__ == "__main__":
    main()
