"""One module per subcommand. Each has `add_parser(subparsers)` and `run(args) -> exit code`.

May import: support, graph, quant, rewrite, checks, engine, verification, trt, reports.
"""

from qdq.commands import compare, completion, explain, fix, inspect, inspect_engine, lint, rules, verify

COMMANDS = (lint, fix, verify, inspect, compare, inspect_engine, rules, explain, completion)
