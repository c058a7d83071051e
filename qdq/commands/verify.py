"""`qdq verify`: run two models in onnxruntime on the same inputs and compare their outputs."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from qdq.commands.args import UsageError, add_input_args, add_logging_args, emit, input_feeds, load_for_output, log
from qdq.reports.json import dumps
from qdq.verify import compare, render_text

EXIT_PASS, EXIT_FAIL = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help="compare two models' outputs in onnxruntime",
        description="Run a reference and a candidate model in onnxruntime (CPU, graph optimisations off) on "
        "the same inputs and compare every output: max abs error, relative L2, cosine, SQNR. Exit 0: every "
        "output within tolerance; 1: some output past it; 2: bad input or usage.",
    )
    parser.add_argument("reference", type=Path, help="the reference model (e.g. before a fix, or the float model)")
    parser.add_argument("candidate", type=Path, help="the model to check against it")
    add_input_args(parser)
    group = parser.add_argument_group("tolerance")
    group.add_argument("--atol", type=float, default=1e-4, metavar="X", help="absolute tolerance (default: 1e-4)")
    group.add_argument("--rtol", type=float, default=1e-3, metavar="X", help="relative tolerance (default: 1e-3)")
    group.add_argument("--min-sqnr", type=float, metavar="DB", help="also fail an output whose SQNR is below DB decibels")
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")
    group.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here instead of stdout")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    for option, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{option} must be a finite number >= 0, not {value:g}")
    if args.min_sqnr is not None and math.isnan(args.min_sqnr):
        raise UsageError("--min-sqnr must be a number of decibels, not nan")
    files = [args.reference, args.candidate] + ([args.inputs] if args.inputs is not None else [])
    for model in (args.reference, args.candidate):
        load_for_output(model, args.output, files)
    feeds, label = input_feeds(args, args.reference)(args.candidate)
    log.info("comparing %s with %s on %s", args.candidate, args.reference, label)
    result = compare(
        args.reference, args.candidate, feeds, atol=args.atol, rtol=args.rtol, min_sqnr=args.min_sqnr, inputs_label=label
    )
    emit(args.output, dumps(result.to_dict()) if args.format == "json" else render_text(result))
    return EXIT_PASS if result.passed else EXIT_FAIL

