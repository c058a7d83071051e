"""`qdq lint`: check a model against a target's rule set; the exit code is the CI gate."""

from __future__ import annotations

import argparse
from pathlib import Path

from qdq.commands.args import (
    add_logging_args,
    add_ruleset_args,
    emit,
    input_files,
    load_for_output,
    log,
    project_config,
    resolve_fail_on,
    resolve_ruleset,
)
from qdq.lint import lint
from qdq.reports import FORMATS, render

EXIT_CLEAN, EXIT_FINDINGS = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lint",
        help="check Q/DQ placement and parameters against a target's rules",
        description="Check a QDQ ONNX model against a rule set. Exit 0: clean; 1: findings at or above "
        "--fail-on; 2: bad input or usage.",
    )
    parser.add_argument("model", type=Path, help="the ONNX model")
    add_ruleset_args(parser)
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=FORMATS, default="text", help="report format (default: text)")
    group.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here instead of stdout")
    group.add_argument("--fail-on", metavar="SEVERITY", help="lowest severity that fails: error, warning (default) or info")
    group.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    config = project_config(args)
    ruleset = resolve_ruleset(args, config)
    fail_on = resolve_fail_on(args, config)
    log.info("linting %s with rule set %r (%d rules)", args.model, ruleset.name, len(ruleset.enabled()))
    model = load_for_output(args.model, args.output, input_files(args, config, ruleset))
    result = lint(model, ruleset)
    emit(args.output, render(result, args.format, fail_on=fail_on))
    failing = result.failing(fail_on)
    return EXIT_FINDINGS if failing and not args.exit_zero else EXIT_CLEAN
