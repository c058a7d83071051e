"""`qdq explain CODE|NAME`: a rule's documentation, severity, fix kind and parameters."""

from __future__ import annotations

import argparse

from qdq.commands.args import UsageError, add_logging_args
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import builtin_targets, load_target
from qdq.reports.rule_docs import shipped_settings, toml_value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("explain", help="print a rule's documentation",
                                   description="Print what a rule checks, why it matters, and an example.")
    parser.add_argument("code", metavar="RULE", help="rule code or name, e.g. QDQ102 or float-bias")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    registry = all_rules()
    by_name = {rule.name: rule for rule in registry.values()}
    rule = registry.get(args.code.upper()) or by_name.get(args.code.lower())
    if rule is None:
        raise UsageError(f"unknown rule {args.code!r}: neither a code nor a name (see `qdq rules --all`)")
    fix = f"{rule.fix_safety} fix" if rule.fix_safety else "no automatic fix"
    print(f"{rule.code} {rule.name}")
    print(f"default severity: {rule.severity}; {fix}")
    print()
    print(rule.doc())
    if rule.parameters:
        print()
        print("Parameters (defaults; set them in a rules file under [rules.%s]):" % rule.code)
        for key, value in rule.parameters.items():
            print(f"  {key} = {toml_value(value)}")
        shipped = shipped_settings(rule, {name: load_target(name) for name in builtin_targets()})
        if shipped:
            print("Set by the shipped rule sets:")
            for name, values in shipped.items():
                print(f"  {name}: " + ", ".join(f"{k} = {toml_value(v)}" for k, v in values.items()))
    return 0
