"""Argument groups shared by the subcommands (as in polygraphy), and how each is resolved."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from qdq.engine.ruleset import ProjectConfig, RuleSet, builtin_targets, find_project_config, load_rules_file, load_target
from qdq.graph.model import Model, load_model
from qdq.rewrite.rule import Severity
from qdq.support.errors import QdqError
from qdq.support.files import atomic_write_text, check_writable
from qdq.verification.verify import check_input_shapes, load_samples

log = logging.getLogger("qdq")
DEFAULT_TARGET = "common"
# `qdq lint --target all`: every shipped rule set at once (qdq.reports.matrix).
ALL_TARGETS = "all"


class UsageError(QdqError):
    """Options that contradict each other."""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by the name a user types (`inspect-engine`, not the module's `inspect_engine`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="more detail on stderr: -v the config and rule set read and each step, "
                       "-vv also each rule's time and a traceback on an unexpected error")
    group.add_argument("-q", "--quiet", action="count", default=0, help="less detail on stderr (repeatable)")


def setup_logging(args: argparse.Namespace) -> None:
    level = logging.WARNING - 10 * (args.verbose - args.quiet)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("qdq: %(levelname)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(max(logging.DEBUG, min(level, logging.CRITICAL)))
    log.propagate = False


def add_ruleset_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rule selection")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("--target", metavar="NAME", help=f"shipped rule set ({', '.join(builtin_targets())}; "
                        f"`qdq lint` also takes {ALL_TARGETS}: every one, in one table)")
    choice.add_argument("--rules", metavar="FILE", type=Path, help="your own rules file (TOML; may `extends` a target)")
    group.add_argument("--select", metavar="CODES", help="comma-separated rule codes or prefixes to run (e.g. QDQ1,QDQ201)")
    group.add_argument("--ignore", metavar="CODES", help="comma-separated rule codes or prefixes to skip")
    group.add_argument("--isolated", action="store_true", help="ignore [tool.qdq] in pyproject.toml")


def project_config(args: argparse.Namespace) -> ProjectConfig:
    """[tool.qdq] of the nearest pyproject.toml; -v says which file that was, since it changes what runs."""
    if args.isolated:
        log.info("--isolated: not reading [tool.qdq] from any pyproject.toml")
        return ProjectConfig()
    config = find_project_config(Path.cwd())
    if config.path is not None:
        log.info("read [tool.qdq] from %s", config.path)
    else:
        log.info("no pyproject.toml with [tool.qdq] in %s or above it", Path.cwd())
    return config


def resolve_ruleset(args: argparse.Namespace, config: ProjectConfig) -> RuleSet:
    """Command line first, then [tool.qdq], then the `common` set."""
    if args.rules is not None:
        ruleset = load_rules_file(args.rules)
    elif args.target is not None:
        ruleset = load_target(args.target)
    elif config.rules is not None:
        ruleset = load_rules_file(config.rules)
    elif config.target is not None:
        try:
            ruleset = load_target(config.target)
        except QdqError as exc:
            raise UsageError(f"{config.path}: [tool.qdq] target: {exc}") from None
    else:
        ruleset = load_target(DEFAULT_TARGET)
    log.info("rule set %r from %s", ruleset.name, ", ".join(str(source) for source in ruleset.sources))
    select = _codes(args.select) if args.select is not None else config.select
    ignore = _codes(args.ignore) if args.ignore is not None else config.ignore
    return ruleset.narrowed(select, ignore)


def resolve_fail_on(args: argparse.Namespace, config: ProjectConfig) -> Severity:
    """The lowest severity that fails the run: --fail-on, then [tool.qdq] fail-on, then warning."""
    if args.fail_on is not None:
        return parse_severity(args.fail_on, "--fail-on")
    return parse_severity(config.fail_on or "warning", f"{config.path} [tool.qdq] fail-on")


def load_for_output(model_path: Path, output: Path | None, inputs: list[Path]) -> Model:
    """Load a model for a command that writes `output`, refusing bad outputs before and after loading.

    Before: the output must be writable and must not be one of `inputs`. After: it must not be one of
    the model's external data files either, which are only known once the model is read.
    """
    if output is not None:
        check_writable(output, inputs=inputs)
    model = load_model(model_path)
    if output is not None:
        check_writable(output, inputs=model.input_files)
    return model


def emit(output: Path | None, text: str) -> None:
    """Write a report to `output` atomically, or to stdout."""
    text = text if text.endswith("\n") else text + "\n"
    if output is not None:
        atomic_write_text(output, text)
    else:
        sys.stdout.write(text)


def parse_severity(text: str, where: str = "") -> Severity:
    """A severity name; `where` (an option or config key) prefixes the error message."""
    try:
        return Severity.parse(text)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}" if where else str(exc)) from None


def input_files(args: argparse.Namespace, config: ProjectConfig, ruleset: RuleSet) -> list[Path]:
    """Every file a command reads, which an output path must never replace."""
    files = [args.model] if getattr(args, "model", None) is not None else []
    files += [Path(source) for source in ruleset.sources]
    if config.path is not None:
        files.append(config.path)
    return files


def add_input_args(parser: argparse.ArgumentParser) -> None:
    """The inputs a numerical comparison runs on: an .npz, or seeded random values."""
    group = parser.add_argument_group("inputs")
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--inputs", type=Path, metavar="FILE.npz",
        help="input values, one array per graph input name (numpy.savez); a leading sample axis holds N samples"
    )
    source.add_argument("--seed", type=int, default=0, metavar="N", help="seed for random inputs (default: 0)")
    group.add_argument(
        "--input-shape", action="append", default=[], metavar="NAME:DIMS",
        help="shape of a random input with dynamic dimensions, e.g. x:1x3x32x32 (repeatable; dynamic dims are 1 otherwise)",
    )


@dataclass
class Inputs:
    """What a verdict runs on: the user's samples (--inputs), or how to draw random ones."""

    samples: list[dict] | None
    label: str
    seed: int
    shapes: dict[str, tuple[int, ...]]


def input_feeds(args: argparse.Namespace, reference: Path) -> Inputs:
    """The inputs chosen by `add_input_args` for a verdict on a candidate of `reference`.

    An --inputs file and --input-shape are checked now, so a bad one stops a command before it
    writes anything. Random values are drawn by the verdict (`qdq.verification.meant_inputs`), from the seed, so
    `qdq fix IN -o OUT` and `qdq verify IN OUT` with the same seed feed the same arrays.
    """
    if args.inputs is not None:
        if args.input_shape:
            raise UsageError("--input-shape applies to random inputs only; the shapes of --inputs come from the file")
        return Inputs(load_samples(args.inputs, reference), str(args.inputs), args.seed, {})
    shapes = parse_input_shapes(args.input_shape)
    check_input_shapes(reference, shapes)
    return Inputs(None, "", args.seed, shapes)


def add_verdict_args(parser: argparse.ArgumentParser) -> None:
    """Gates a user adds to the verdict (`qdq.verification.verdict`): the same options and defaults in `fix` and `verify`."""
    group = parser.add_argument_group("verdict", "a candidate passes when each output is no further from the "
                                      "input model's float twin than the rule set's [verdict] allows; these add gates")
    group.add_argument("--atol", type=float, metavar="X", help="also fail an output past |a-b| <= atol + rtol*|a|")
    group.add_argument("--rtol", type=float, metavar="X", help="relative tolerance, with --atol (default: 0)")
    group.add_argument("--min-sqnr", type=float, metavar="DB",
                       help="also fail an output whose SQNR against the input model is below DB")


def verdict_gates(args: argparse.Namespace) -> dict:
    for option, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if value is not None and (math.isnan(value) or value < 0):
            raise UsageError(f"{option} must be a number >= 0, not {value:g}")
    if args.min_sqnr is not None and math.isnan(args.min_sqnr):
        raise UsageError("--min-sqnr must be a number of decibels, not nan")
    if args.rtol is not None and args.atol is None:
        raise UsageError("--rtol applies with --atol")
    return {"atol": args.atol, "rtol": args.rtol, "min_sqnr": args.min_sqnr}


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """`NAME:1x3x32x32` options to {name: shape}; the last colon separates name and dims."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise UsageError(f"--input-shape {spec!r}: expected NAME:DIMS, e.g. x:1x3x32x32")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise UsageError(f"--input-shape {spec!r}: dimensions must be integers separated by 'x'") from None
        if any(d < 0 for d in shape):
            raise UsageError(f"--input-shape {spec!r}: dimensions must not be negative")
        if name in shapes:
            raise UsageError(f"--input-shape: {name!r} is given twice")
        shapes[name] = shape
    return shapes


def _codes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]
