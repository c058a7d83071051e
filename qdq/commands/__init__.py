"""One module per subcommand. Each has `add_parser(subparsers)` and `run(args) -> exit code`."""

from qdq.commands import explain, inspect, lint, rules, verify

COMMANDS = (lint, inspect, rules, explain, verify)
