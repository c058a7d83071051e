"""`qdq inspect`: what is quantized in a model, how, and where it runs in float."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qdq.commands.args import add_logging_args, emit, load_for_output
from qdq.inspect import render_text, summarize


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect", help="summarise a model's quantization",
        description="Summarise op counts, which ops run quantized and which stay float, dtypes, "
        "granularity, and scale ranges (power of two or not).",
    )
    parser.add_argument("model", type=Path, help="the ONNX model")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the summary here instead of stdout")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    summary = summarize(load_for_output(args.model, args.output, inputs=[args.model]))
    emit(args.output, json.dumps(summary, indent=2) if args.format == "json" else render_text(summary))
    return 0
