"""`qdq fix`: rewrite a model until it is lint-clean for a target, report every change, verify the numbers."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import onnx

from qdq.commands.args import (
    Inputs,
    UsageError,
    add_input_args,
    add_logging_args,
    add_ruleset_args,
    add_verdict_args,
    emit,
    input_feeds,
    input_files,
    load_for_output,
    log,
    project_config,
    resolve_fail_on,
    resolve_ruleset,
    verdict_gates,
)
from qdq.engine.exponent_search import Objective, search_exponents, search_settings
from qdq.engine.fix import DEFAULT_MAX_ROUNDS, FixResult, fix
from qdq.engine.lint import LintResult, lint
from qdq.engine.registry import claims_exact
from qdq.engine.ruleset import RuleSet
from qdq.engine.suppression import drop_ignored
from qdq.graph.model import Model, save_model
from qdq.quant.calibrate import tensor_ranges
from qdq.reports import fix as fix_report
from qdq.reports import fix_html
from qdq.reports import neighbourhood
from qdq.reports.json import dumps
from qdq.support import progress
from qdq.support.errors import InvalidOutputError
from qdq.support.files import atomic_write_text, check_writable, same_file
from qdq.verification.twin import Twin, float_twin
from qdq.verification.verdict import Criterion, judge
from qdq.verification.verify import CandidateFailed, UnfeedableInput, VerifyResult, load_samples

EXIT_CLEAN, EXIT_NOT_CLEAN = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "fix",
        help="rewrite a model until it is lint-clean for a target",
        description="Apply the rule set's fixes in its order until nothing changes, write the result, report "
        "every change and judge the result as `qdq verify` does: each output no further from the input model's "
        "float twin (its activation Q/DQ pairs removed) than the input is, within the rule set's [verdict] "
        "margin; a model that fails is not written. Exit 0: the output is lint-clean and within tolerance (or its "
        "inputs cannot be generated, which the report says); 1: findings remain, the fixes did not settle, or the "
        "verdict failed; 2: bad input or usage.",
    )
    parser.add_argument("model", type=Path, help="the ONNX model (never modified unless --in-place)")
    add_ruleset_args(parser)
    group = parser.add_argument_group("output")
    where = group.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", type=Path, metavar="OUT", help="write the fixed model here")
    where.add_argument("--in-place", action="store_true", help="overwrite the input model")
    where.add_argument("--dry-run", action="store_true", help="report what would change; write no model")
    group.add_argument("--keep-failed", action="store_true",
                       help="with -o: write the fixed model even when its outputs moved past tolerance (still exit 1)")
    group.add_argument("--report", type=Path, metavar="FILE.json", help="also write the full report as JSON")
    group.add_argument("--report-html", type=Path, metavar="FILE.html",
                       help="also write an HTML page drawing each finding's neighbourhood before and after the fix")
    group.add_argument("--format", choices=("text", "json"), default="text", help="stdout report format (default: text)")
    group.add_argument("--fail-on", metavar="SEVERITY", help="lowest remaining severity that fails (default: warning)")
    group = parser.add_argument_group("fixing")
    group.add_argument("--exact-only", action="store_true", help="apply only fixes that keep outputs bit-identical")
    group.add_argument("--max-rounds", type=int, default=DEFAULT_MAX_ROUNDS, metavar="N",
                       help=f"give up after N rounds without a fixed point (default: {DEFAULT_MAX_ROUNDS})")
    group.add_argument("--calibrate", type=Path, metavar="FILE.npz",
                       help="inputs to measure ranges on, for fixes that need a scale the graph does not have "
                       "(one array per graph input name; a leading sample axis holds N samples); for --target npu "
                       "also the data the power-of-two positions are chosen on ([search] in the rule set)")
    add_input_args(parser)
    group = parser.add_argument_group("verification")
    group.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                       help="judge the fixed model against the input's float twin in onnxruntime, as `qdq verify` "
                       "does (default: on)")
    add_verdict_args(parser)
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    config = project_config(args)
    ruleset = resolve_ruleset(args, config)
    fail_on = resolve_fail_on(args, config)
    output = args.model if args.in_place else args.output
    reads = input_files(args, config, ruleset) + [p for p in (args.inputs, args.calibrate) if p is not None]
    reports = [path for path in (args.report, args.report_html) if path is not None]
    if len(reports) == 2 and same_file(*reports):
        raise UsageError(f"{args.report}: --report and --report-html name the same file")
    for path in reports:
        check_writable(path, inputs=reads + ([output] if output is not None else []))
    model = load_for_output(args.model, args.output, reads)
    criterion = Criterion.of(ruleset, **verdict_gates(args))
    # Read (and check) an --inputs file before anything is written: a bad .npz writes nothing.
    feeds, skipped = None, None
    if args.verify:
        try:
            feeds = input_feeds(args, args.model)
        except UnfeedableInput as exc:
            skipped = exc.reason
    samples = load_samples(args.calibrate, args.model) if args.calibrate else []
    ranges = tensor_ranges(args.model, *samples) if samples else None

    before = _drawn_findings(model, ruleset, ranges, config.per_node_ignores) if args.report_html else None
    log.info("fixing %s with rule set %r", args.model, ruleset.name)
    fixed = fix(model, ruleset, exact_only=args.exact_only, max_rounds=args.max_rounds, ranges=ranges)
    search, budget = search_settings(ruleset)
    twin = None  # the input's float twin, when the search builds it: the verdict judges by the same one
    if search and samples and fixed.converged and not args.exact_only:
        twin = input_twin(args.model, ruleset)
        fixed = search_exponents(model, _search_objective(args.model, twin), samples, ruleset, fixed, ranges,
                                 budget)
    drop_ignored(fixed.result, config.per_node_ignores)  # as `qdq lint` reports them
    if not fixed.changes:
        skipped = None  # nothing to verify
    verification, unfeedable, written = _save_verified(model, args, fixed, feeds, ruleset, criterion, twin)
    skipped = skipped or unfeedable
    numbers_ok = verification is None or verification.passed

    clean = fixed.converged and not fixed.result.failing(fail_on)
    passed = clean and numbers_ok
    verdict = _verdict(fixed, clean, numbers_ok, verification, skipped, written, fail_on, args)
    report = fix_report.to_dict(args.model, output, fixed, verification, skipped, written, fail_on, passed)
    if args.report is not None:
        atomic_write_text(args.report, dumps(report) + "\n")
    if before is not None:
        atomic_write_text(args.report_html, _html_report(before, fixed, model, args.model, output if written else None,
                                                         verdict))
    text = dumps(report) if args.format == "json" else fix_report.render_text(
        args.model, output, fixed, verification, skipped, fail_on, verdict
    )
    emit(None, text)
    return EXIT_CLEAN if passed else EXIT_NOT_CLEAN


def input_twin(path: Path, ruleset: RuleSet) -> Twin:
    """The float twin of the model at `path`, as the verdict builds it."""
    return float_twin(onnx.load(str(path), load_external_data=False), ruleset.params_of("QDQ006"), path.parent)


def _search_objective(path: Path, twin: Twin) -> Objective:
    """What the exponent search aims at: the input's float twin, which the verdict judges by; the input
    model itself where the twin cannot be built."""
    if twin.model is None:
        return Objective(onnx.load(str(path), load_external_data=False), "the input model",
                         f"no float twin: {twin.reason}")
    return Objective(twin.model, "the float twin")


def _drawn_findings(model: Model, ruleset, ranges, per_node_ignores: dict[str, list[str]]) -> LintResult:
    """The input model's findings, each with its neighbourhood drawn before the fixes edit the graph."""
    before = lint(model, ruleset, ranges)
    drop_ignored(before, per_node_ignores)
    neighbourhood.attach(model, before.findings)
    return before


def _html_report(before: LintResult, fixed: FixResult, model: Model, path: Path, output: Path | None,
                 verdict: str) -> str:
    """The fix report page: the same nodes drawn in the fixed graph, and the findings the fixes introduced."""
    final = fixed.model or model
    neighbourhood.attach(final, fixed.result.findings)
    return fix_html.render(path, output, before, neighbourhood.neighbourhoods(final, before.findings), fixed, verdict)


def _check_options(args: argparse.Namespace) -> None:
    if args.output is None and not args.in_place and not args.dry_run:
        raise UsageError("say where the fixed model goes: -o OUT, --in-place or --dry-run")
    if args.keep_failed and args.output is None:
        raise UsageError(
            "--keep-failed applies to -o OUT (--in-place never replaces the input with a model that failed)"
        )
    if args.max_rounds < 1:
        raise UsageError(f"--max-rounds must be at least 1, not {args.max_rounds}")


class _Rejected(Exception):
    """The fixed model's outputs moved past tolerance: it is not moved into place."""


def _save_verified(
    model: Model, args: argparse.Namespace, fixed: FixResult, inputs: Inputs | None, ruleset: RuleSet,
    criterion: Criterion, twin: Twin | None,
) -> tuple[VerifyResult | None, str | None, bool]:
    """Write the fixed model where it goes, judged on the very file written: (verification, why skipped, written).

    The verdict (`qdq.verification.verdict`, the one `qdq verify` gives) runs on the complete temporary file
    before it is renamed into place, so a model that fails is never moved into place (unless
    --keep-failed; never over the input with --in-place). It runs only the part of the file the
    fix changed, in pieces, after onnxruntime has loaded the file whole once (`save_model`'s own
    check; when the fix changed most of the model, the fixed model runs in that session). A dry run
    verifies a copy in a temporary folder. `twin`: the input's float twin, when the exponent search built it.
    """
    target = args.model if args.in_place else args.output
    found: dict = {"verification": None, "skipped": None}
    exact = claims_exact(c.code for c in fixed.changes)

    def verify(candidate: Path, opened: list) -> None:
        if inputs is None or not fixed.changes:
            return
        try:
            progress.step("judging the fixed model against the input's float twin in onnxruntime")
            result = judge(args.model, candidate, ruleset, criterion, inputs.samples, inputs.label, inputs.seed,
                           inputs.shapes, exact=exact, opened=opened, twin=twin)
        except UnfeedableInput as exc:
            found["skipped"] = exc.reason
            return
        except CandidateFailed as exc:  # the input ran: the fixed model is at fault
            where = str(target or args.model)
            raise InvalidOutputError(f"{where}: not written: {str(exc).replace(str(candidate), where)}; "
                                     "this is a bug in qdq, please report it") from None
        if target is not None:
            result.candidate = str(target)  # the file this comparison stands for
        found["verification"] = result
        if not result.passed and not args.keep_failed:
            raise _Rejected

    written = False
    try:
        if args.output is not None or (args.in_place and fixed.changes):
            save_model(model, target, in_place=args.in_place, check=verify)
            written = True
        elif inputs is not None and fixed.changes:
            with tempfile.TemporaryDirectory(prefix="qdq-fix-") as folder:
                save_model(model, Path(folder) / args.model.name, check=verify)
    except _Rejected:
        pass
    return found["verification"], found["skipped"], written


def _verdict(
    fixed: FixResult, clean: bool, numbers_ok: bool, verification: VerifyResult | None, skipped: str | None,
    written: bool, fail_on, args: argparse.Namespace,
) -> str:
    parts = []
    if clean:
        parts.append(f"lint-clean at --fail-on {fail_on}")
    elif not fixed.converged:
        parts.append("the fixes did not settle")
    else:
        parts.append(f"{len(fixed.result.failing(fail_on))} finding(s) not fixed")
    if skipped is not None:
        parts.append("outputs not verified")
    elif verification is not None:
        parts.append("outputs within tolerance" if numbers_ok else _failed(written, args, verification.inconclusive))
    return "; ".join(parts)


def _failed(written: bool, args: argparse.Namespace, inconclusive: bool) -> str:
    """What became of a fixed model whose verdict failed: its outputs moved past tolerance, or (`inconclusive`)
    some carry no information on the inputs used, so nothing says whether they did."""
    why = "no evidence on these inputs to judge the outputs by, give --inputs" if inconclusive else \
        "outputs moved past tolerance"
    if args.in_place:
        return f"{why}; the input was left unchanged"
    if written:
        return f"{why}; written although verification failed"
    if args.output is not None:
        return f"not written: {why} (use --keep-failed to write it anyway)"
    return why
