"""Argument groups shared by the subcommands (as in polygraphy), and how each is resolved."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from qdq.errors import QdqError
from qdq.files import atomic_write_text, check_writable
from qdq.model import Model, load_model
from qdq.rule import Severity
from qdq.ruleset import ProjectConfig, RuleSet, builtin_targets, find_project_config, load_rules_file, load_target

log = logging.getLogger("qdq")
DEFAULT_TARGET = "common"


class UsageError(QdqError):
    """Options that contradict each other."""


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument("-v", "--verbose", action="count", default=0, help="more detail on stderr (repeatable)")
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
    choice.add_argument("--target", metavar="NAME", help=f"shipped rule set ({', '.join(builtin_targets())})")
    choice.add_argument("--rules", metavar="FILE", type=Path, help="your own rules file (TOML; may `extends` a target)")
    group.add_argument("--select", metavar="CODES", help="comma-separated rule codes or prefixes to run (e.g. QDQ1,QDQ201)")
    group.add_argument("--ignore", metavar="CODES", help="comma-separated rule codes or prefixes to skip")
    group.add_argument("--isolated", action="store_true", help="ignore [tool.qdq] in pyproject.toml")


def project_config(args: argparse.Namespace) -> ProjectConfig:
    return ProjectConfig() if args.isolated else find_project_config(Path.cwd())


def resolve_ruleset(args: argparse.Namespace, config: ProjectConfig) -> RuleSet:
    """Command line first, then [tool.qdq], then the `common` set."""
    if args.rules is not None:
        ruleset = load_rules_file(args.rules)
    elif args.target is not None:
        ruleset = load_target(args.target)
    elif config.rules is not None:
        ruleset = load_rules_file(config.rules)
    else:
        ruleset = load_target(config.target or DEFAULT_TARGET)
    select = _codes(args.select) if args.select is not None else config.select
    ignore = _codes(args.ignore) if args.ignore is not None else config.ignore
    return ruleset.narrowed(select, ignore)


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


def _codes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]
