"""`qdq inspect`: what is quantized in a model, how, and where it runs in float."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qdq.commands.args import add_logging_args
from qdq.inspect import render_text, summarize
from qdq.files import atomic_write_text, check_writable
from qdq.model import load_model


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
    if args.output is not None:
        check_writable(args.output, inputs=[args.model])
    model = load_model(args.model)
    if args.output is not None:
        check_writable(args.output, inputs=model.input_files)  # now also its external data files
    summary = summarize(model)
    text = json.dumps(summary, indent=2) + "\n" if args.format == "json" else render_text(summary)
    if args.output is not None:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
