"""Where `qdq lint` spends its time on one model: each phase qdq reports, every rule, and the text report.

    python benchmarks/lint_profile.py MODEL [--target npu] [--repeats 3] [--top 10] [--json FILE]

Phases are timed by the steps the library itself reports (`qdq.support.progress.timed`): reading the file
(and checking its external data), the ONNX checker (and `normalize`), building the graph, indexing
the Q/DQ nodes, each rule, then rendering the text report. All in one process, with the cyclic
collector off as in the `qdq` command; the interpreter's start and imports are not included
(`scale.py` times whole commands). Medians over repeats.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's qdq, not an installed copy

import qdq  # noqa: E402
from qdq.reports.text import render  # noqa: E402
from qdq.rewrite.rule import Severity  # noqa: E402
from qdq.support import progress  # noqa: E402

RULE_STEP = re.compile(r"checking (QDQ\d+) ")
REPORT = "rendering the text report"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--target", default="npu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=10, help="rules listed one by one (default: 10)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the medians as JSON")
    args = parser.parse_args(argv)
    runs = [one_run(args.model, args.target) for _ in range(args.repeats)]
    medians = {phase: statistics.median(run[0].get(phase, 0.0) for run in runs) for phase in runs[0][0]}
    findings = runs[0][1]
    print(render_table(args.model, args.target, medians, findings, args.repeats, args.top))
    if args.json is not None:
        args.json.write_text(json.dumps({"model": str(args.model), "target": args.target, "repeats": args.repeats,
                                         "findings": findings, "seconds": medians}, indent=2) + "\n")
    return 0


def one_run(model: Path, target: str) -> tuple[dict[str, float], int]:
    """Seconds per phase (rules by code) of one lint and its text report, and the number of findings."""
    gc.collect()
    gc.disable()
    try:
        with progress.timed() as steps:
            result = qdq.lint(model, target=target)
            progress.step(REPORT)
            render(result, fail_on=Severity.WARNING)
    finally:
        gc.enable()
    seconds: dict[str, float] = {}
    for text, duration in steps:
        phase = _phase(text, model.name)
        seconds[phase] = seconds.get(phase, 0.0) + duration
    return seconds, len(result.findings)


def _phase(text: str, name: str) -> str:
    rule = RULE_STEP.match(text)
    if rule:
        return rule.group(1)
    return re.sub(r" \(\d+ nodes\)", "", text.replace(name, "MODEL"))


def render_table(model: Path, target: str, medians: dict[str, float], findings: int, repeats: int, top: int) -> str:
    total = sum(medians.values())
    rules = {phase: s for phase, s in medians.items() if phase.startswith("QDQ")}
    lines = [f"qdq lint --target {target} {model} ({findings:,} findings), median of {repeats}: {total:.2f} s",
             f"{'phase':<48} {'seconds':>8} {'share':>6}"]
    rows = [(phase, s) for phase, s in medians.items() if phase not in rules]
    rows.insert(len(rows) - 1, (f"{len(rules)} rules", sum(rules.values())))  # before the report
    for phase, s in rows:
        lines.append(f"{phase:<48} {s:>8.3f} {s / total:>6.1%}")
    lines.append("slowest rules:")
    for code, s in sorted(rules.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {code:<46} {s:>8.3f} {s / total:>6.1%}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
