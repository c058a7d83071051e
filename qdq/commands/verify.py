"""`qdq verify`: judge a candidate model against a reference by the verdict `qdq fix` uses."""

from __future__ import annotations

import argparse
from pathlib import Path

from qdq.commands.args import (
    add_input_args, add_logging_args, add_ruleset_args, add_verdict_args, emit, input_feeds, load_for_output, log,
    project_config, resolve_ruleset, verdict_gates,
)
from qdq.reports.json import dumps
from qdq.verification.verdict import Criterion, judge
from qdq.verification.verify import render_text

EXIT_PASS, EXIT_FAIL = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help="judge a candidate model against a reference in onnxruntime, as qdq fix does",
        description="Run a reference (e.g. the model before a fix), its float twin (the reference without its "
        "activation Q/DQ pairs) and a candidate on the same inputs, and judge each output as `qdq fix` does: "
        "PASS when the candidate is no further from the twin than the reference is, within the rule set's "
        "[verdict] margin. Give the --target the candidate was fixed for: it decides the runtime (onnxruntime's "
        "default optimisations for ort) and the margin. Exit 0: every output passes; 1: some output fails or "
        "carries no information on the inputs; 2: bad input or usage.",
    )
    parser.add_argument("reference", type=Path, help="the reference model (e.g. before a fix)")
    parser.add_argument("candidate", type=Path, help="the model to judge against it")
    add_ruleset_args(parser)
    add_input_args(parser)
    add_verdict_args(parser)
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")
    group.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here instead of stdout")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    gates = verdict_gates(args)
    ruleset = resolve_ruleset(args, project_config(args))
    criterion = Criterion.of(ruleset, **gates)
    files = [args.reference, args.candidate] + ([args.inputs] if args.inputs is not None else [])
    for model in (args.reference, args.candidate):
        load_for_output(model, args.output, files)
    inputs = input_feeds(args, args.reference)
    log.info("judging %s against %s with rule set %r", args.candidate, args.reference, ruleset.name)
    result = judge(args.reference, args.candidate, ruleset, criterion, inputs.samples, inputs.label, inputs.seed,
                   inputs.shapes)
    emit(args.output, dumps(result.to_dict()) if args.format == "json" else render_text(result))
    return EXIT_PASS if result.passed else EXIT_FAIL
