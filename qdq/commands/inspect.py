"""`qdq inspect`: what is quantized in a model, how, and where it runs in float."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qdq.commands.args import UsageError, add_logging_args, emit, load_for_output
from qdq.engine.inspect import predicted, render_tensors, render_text, summarize, tensors
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_target
from qdq.support.paths import model_paths


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect", help="summarise a model's quantization",
        description="Summarise op counts, which ops run quantized and which stay float, dtypes, "
        "granularity, and scale ranges (power of two or not). With several models, one summary each, "
        "in the order given: text one after the other, JSON a list of the summaries "
        "(one model: the summary object itself).",
    )
    parser.add_argument("model", nargs="+",
                        help="ONNX models, folders of them, or glob patterns (as `qdq lint` takes them)")
    parser.add_argument("--tensors", action="store_true",
                        help="also list every quantized tensor: dtype, granularity, scale, zero point, "
                        "power-of-two position (pos = -log2(scale)) and role; JSON: a `tensors` list")
    parser.add_argument("--target", metavar="NAME",
                        help="also predict, with this rule set's `effect` keys, the conversion layers the target "
                        "builds because of Q/DQ placement (e.g. trt)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the summary here instead of stdout")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    ruleset = load_target(args.target) if args.target is not None else None
    if ruleset is not None and not any(cfg.effect for cfg in ruleset.rules.values()):
        raise UsageError(f"rule set {ruleset.name!r} predicts nothing (its rules have no `effect` keys); try --target trt")
    paths = model_paths(args.model)
    summaries = []
    for path in paths:
        model = load_for_output(path, args.output, inputs=paths)
        summary = summarize(model)
        if ruleset is not None:
            summary["predicted"] = predicted(lint(model, ruleset))
        if args.tensors:
            summary["tensors"] = tensors(model)
        summaries.append(summary)
    if args.format == "json":
        text = json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2)
    else:
        text = "\n".join(_text(summary) for summary in summaries)
    emit(args.output, text)
    return 0


def _text(summary: dict) -> str:
    text = render_text(summary)
    if "tensors" in summary:
        text += f"\nTensors ({len(summary['tensors'])})\n" + render_tensors(summary["tensors"])
    return text
