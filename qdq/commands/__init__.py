"""One module per subcommand. Each has `add_parser(subparsers)` and `run(args) -> exit code`."""

from qdq.commands import explain, fix, inspect, lint, rules, verify

COMMANDS = (lint, fix, verify, inspect, rules, explain)
