"""The `qdq` command line: parse, dispatch to a subcommand module, map errors to exit codes.

Exit codes follow ruff: 0 clean, 1 findings, 2 bad input or usage. Every expected problem is
one line on stderr; a traceback appears only with -vv.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from qdq import __version__
from qdq.commands import COMMANDS
from qdq.errors import QdqError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qdq", description="Lint and fix QDQ ONNX models for NPU, TensorRT and onnxruntime targets.")
    parser.add_argument("--version", action="version", version=f"qdq {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(subparsers).set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from qdq.commands.args import setup_logging

    setup_logging(args)
    try:
        return args.run(args)
    except QdqError as exc:
        sys.stderr.write(f"qdq: error: {exc}\n")
    except KeyboardInterrupt:
        sys.stderr.write("qdq: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in qdq, or input no check anticipated: still one line
        if args.verbose >= 2:
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        sys.stderr.write(f"qdq: error: unexpected {type(exc).__name__}: {first} (run with -vv for details)\n")
    return EXIT_USAGE


def entry_point() -> None:
    """The `qdq` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
