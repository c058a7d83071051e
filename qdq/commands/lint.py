"""`qdq lint`: check models against a target's rule set; the exit code is the CI gate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qdq.commands.args import (
    ALL_TARGETS,
    UsageError,
    add_logging_args,
    add_ruleset_args,
    emit,
    input_files,
    log,
    project_config,
    resolve_fail_on,
    resolve_ruleset,
)
from qdq.engine.lint import LintReport, Unreadable, lint
from qdq.engine.ruleset import RuleSet, builtin_targets
from qdq.engine.suppression import drop_ignored
from qdq.graph.model import load_model
from qdq.reports import FORMATS, matrix, render
from qdq.reports import neighbourhood
from qdq.reports.baseline import drop_baselined, load_baseline, write_baseline
from qdq.reports.text import summary_line
from qdq.support.errors import ModelLoadError
from qdq.support.files import check_writable, same_file
from qdq.support.paths import model_paths

EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lint",
        help="check Q/DQ placement and parameters against a target's rules",
        description="Check QDQ ONNX models against a rule set: files, folders (every *.onnx below them) "
        "and glob patterns, in one report. Exit 0: clean; 1: findings at or above --fail-on; 2: bad input "
        "or usage, or a model could not be read (the others are still linted and reported).",
    )
    parser.add_argument("models", nargs="+", help="ONNX models, folders of them, or glob patterns (e.g. 'models/**/*.onnx')")
    add_ruleset_args(parser)
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=FORMATS, default="text", help="report format (default: text)")
    group.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here instead of stdout")
    group.add_argument("--fail-on", metavar="SEVERITY", help="lowest severity that fails: error, warning (default) or info")
    group.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    group = parser.add_argument_group("baseline")
    baseline = group.add_mutually_exclusive_group()
    baseline.add_argument("--baseline", type=Path, metavar="FILE",
                          help="report and fail only on findings this baseline does not record")
    baseline.add_argument("--write-baseline", type=Path, metavar="FILE",
                          help="record today's findings in FILE (JSON, paths relative to its folder) and exit 0")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.target == ALL_TARGETS:
        return _run_every_target(args)
    config = project_config(args)
    ruleset = resolve_ruleset(args, config)
    fail_on = resolve_fail_on(args, config)
    paths = model_paths(args.models)
    baseline = load_baseline(args.baseline) if args.baseline is not None else None
    outputs = [path for path in (args.output, args.write_baseline) if path is not None]
    if len(outputs) == 2 and same_file(*outputs):
        raise UsageError(f"{args.output}: -o and --write-baseline name the same file")
    reads = input_files(args, config, ruleset) + paths + ([args.baseline] if args.baseline is not None else [])
    _check_outputs(outputs, reads)

    report = _lint_each(paths, ruleset, config.per_node_ignores, outputs, pictures=args.format == "html")
    if not report.results:
        return EXIT_UNREADABLE  # every model failed, each said so on stderr: there is nothing to report

    if args.write_baseline is not None:
        if report.unreadable:
            return EXIT_UNREADABLE  # write no baseline that lacks some models' findings
        recorded = write_baseline(args.write_baseline, report.results)
        if not args.quiet:
            plural = "" if recorded == 1 else "s"
            sys.stderr.write(f"qdq: wrote {args.write_baseline}: the baseline records {recorded} finding{plural}\n")
    elif baseline is not None:
        report.baselined = drop_baselined(report.results, baseline, args.baseline)
    if args.write_baseline is not None and args.output is None and args.format == "text":
        # The findings went into the baseline; the terminal gets what was recorded, not every line again.
        sys.stdout.write(summary_line(report, fail_on) + "\n")
    else:
        emit(args.output, render(report, args.format, fail_on=fail_on))
    if args.output is not None and not args.quiet:
        # The report went to a file: the terminal still says what it holds.
        sys.stderr.write(f"qdq: wrote {args.output}: {summary_line(report, fail_on)}\n")
    if report.unreadable:
        return EXIT_UNREADABLE
    failing = report.failing(fail_on)
    return EXIT_FINDINGS if failing and not args.exit_zero and args.write_baseline is None else EXIT_CLEAN


def _run_every_target(args: argparse.Namespace) -> int:
    """`--target all`: each model against every shipped rule set, one table (or JSON document) per run."""
    if args.format not in ("text", "json"):
        raise UsageError(f"--target {ALL_TARGETS} writes text or json, not {args.format}")
    if args.baseline is not None or args.write_baseline is not None:
        raise UsageError(f"--target {ALL_TARGETS} takes no baseline: a baseline records one rule set's findings")
    config = project_config(args)
    fail_on = resolve_fail_on(args, config)
    rulesets = {name: resolve_ruleset(argparse.Namespace(**{**vars(args), "target": name}), config)
                for name in builtin_targets()}
    paths = model_paths(args.models)
    reads = [p for rs in rulesets.values() for p in input_files(args, config, rs)] + paths
    _check_outputs([args.output] if args.output is not None else [], reads)
    models: list[tuple[Path, dict | str]] = []
    for path in paths:
        try:
            model = load_model(path)
        except ModelLoadError as exc:
            message = str(exc).strip().splitlines()[0]
            sys.stderr.write(f"qdq: error: {message}\n")
            models.append((path, message))
            continue
        _check_outputs([args.output] if args.output is not None else [], model.input_files)
        results = {}
        for name, ruleset in rulesets.items():
            log.info("linting %s with rule set %r (%d rules)", path, name, len(ruleset.enabled()))
            results[name] = lint(model, ruleset)
            drop_ignored(results[name], config.per_node_ignores)
        models.append((path, results))
    linted = [results for _, results in models if not isinstance(results, str)]
    if not linted:
        return EXIT_UNREADABLE  # every model failed, each said so on stderr: there is nothing to report
    if args.format == "json":
        emit(args.output, matrix.document(models, fail_on))
    else:
        emit(args.output, "\n".join(matrix.render_text(path, results, fail_on)
                                    for path, results in models if not isinstance(results, str)))
    if args.output is not None and not args.quiet:
        for path, results in models:
            if not isinstance(results, str):
                sys.stderr.write(f"qdq: wrote {args.output}: {matrix.verdict_line(path, results, fail_on)}\n")
    if len(linted) < len(models):
        return EXIT_UNREADABLE
    fails = any(result.failing(fail_on) for results in linted for result in results.values())
    return EXIT_FINDINGS if fails and not args.exit_zero else EXIT_CLEAN


def _lint_each(paths: list[Path], ruleset: RuleSet, per_node_ignores: dict[str, list[str]], outputs: list[Path],
               pictures: bool = False) -> LintReport:
    """Lint the models one after the other; one that cannot be read is reported on stderr and skipped.

    With `pictures` (the HTML report), each finding keeps the part of the graph around it."""
    report = LintReport(ruleset)
    for path in paths:
        log.info("linting %s with rule set %r (%d rules)", path, ruleset.name, len(ruleset.enabled()))
        try:
            model = load_model(path)
        except ModelLoadError as exc:
            message = str(exc).strip().splitlines()[0]
            sys.stderr.write(f"qdq: error: {message}\n")
            report.models.append(Unreadable(path, message))
            continue
        _check_outputs(outputs, model.input_files)  # external data files are known only now
        result = lint(model, ruleset)
        drop_ignored(result, per_node_ignores)
        if pictures:
            neighbourhood.attach(model, result.findings)
        for finding in result.findings:
            finding.subject = None  # reports never read it; dropping it frees this graph before the next is read
        report.models.append(result)
    return report


def _check_outputs(outputs: list[Path], inputs: list) -> None:
    """Refuse, before any write, an output that cannot be written or would replace something read."""
    for output in outputs:
        check_writable(output, inputs=inputs)
