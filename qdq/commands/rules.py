"""`qdq rules`: list the rules of a rule set with their severity and fix kind."""

from __future__ import annotations

import argparse
import json

from qdq.commands.args import add_logging_args, add_ruleset_args, project_config, resolve_ruleset
from qdq.engine.registry import all_rules


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("rules", help="list the rules of a rule set", description="List the rules a "
                                   "rule set runs, with severity and whether each has an automatic fix (exact or approximate).")
    add_ruleset_args(parser)
    parser.add_argument("--all", action="store_true",
                        help="list every rule qdq has, marking those the set turns off or does not run")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    ruleset = resolve_ruleset(args, project_config(args))
    registry = all_rules()
    rows = []
    for code in sorted(registry if args.all else ruleset.rules):
        cfg, rule = ruleset.rules.get(code), registry[code]
        if not args.all and not cfg.enabled:
            continue
        rows.append({
            "code": code,
            "name": rule.name,
            "severity": str(cfg.severity if cfg else rule.severity),
            "enabled": bool(cfg and cfg.enabled),
            "in_set": cfg is not None,
            "fix": str(rule.fix_safety) if rule.fix_safety else None,
            "summary": rule.doc().splitlines()[0] if rule.doc() else "",
            "params": cfg.params if cfg else rule.parameters,
        })
    if args.format == "json":
        print(json.dumps({"ruleset": ruleset.name, "rules": rows}, indent=2))
        return 0
    print(f"Rule set {ruleset.name!r}: {ruleset.description}")
    for row in rows:
        fix = row["fix"] or "-"
        state = "" if row["enabled"] else " (off)" if row["in_set"] else f" (not in {ruleset.name!r})"
        print(f"  {row['code']}  {row['name']:<28} {row['severity']:<8} fix:{fix:<12} {row['summary']}{state}")
    print(f"{len(rows)} rules. `qdq explain CODE` for details.")
    return 0
