"""The `qdq` command line: parse, dispatch to a subcommand module, map errors to exit codes.

Exit codes follow ruff: 0 clean, 1 findings, 2 bad input or usage. Every expected problem is
one line on stderr; a traceback appears only with -vv.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from contextlib import suppress

from qdq import __version__
from qdq.commands import COMMANDS
from qdq.commands.args import setup_logging, subcommands
from qdq.support import progress
from qdq.support.errors import QdqError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = " ".join(message.split())  # argparse messages may wrap; keep them on one line
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qdq", description="Lint and fix QDQ ONNX models for NPU, TensorRT and onnxruntime targets.")
    parser.add_argument("-V", "--version", action="version", version=f"qdq {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(subparsers).set_defaults(run=command.run)
    parser.set_defaults(command_line=parser)  # what `qdq completion` describes
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit code (never raises SystemExit, so callers can test it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (already reported on one line), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        commands = ", ".join(subcommands(parser))
        sys.stderr.write(f"qdq: error: no command given (choose from {commands}; see `qdq --help`)\n")
        return EXIT_USAGE
    setup_logging(args)
    try:
        with progress.shown(sys.stderr, enabled=not args.quiet):
            return args.run(args)
    except QdqError as exc:
        sys.stderr.write(f"qdq: error: {_one_line(str(exc))}\n")
    except KeyboardInterrupt:
        sys.stderr.write("qdq: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`qdq lint m.onnx | head`): stop quietly, keep Python from complaining
        # when it flushes stdout at exit, and exit 1 as Python does on EPIPE: the report was not
        # delivered, so this must not pass as clean in a CI gate.
        with suppress(OSError), open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a bug in qdq, or input no check anticipated: still one line
        if getattr(args, "verbose", 0) >= 2:
            traceback.print_exc()
        first = _one_line(str(exc))[:300]
        sys.stderr.write(f"qdq: error: unexpected {type(exc).__name__}: {first} (run with -vv for details)\n")
    return EXIT_USAGE


def _one_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def entry_point() -> None:
    """The `qdq` console script.

    One command per process, so the cyclic garbage collector stays off: on a 100k-node model its
    passes over the graph's million objects cost more time than everything else in `qdq lint`,
    and the cycles it could free are the few nodes a fix replaces.
    """
    gc.disable()
    code = main()
    # At exit Python would run one last full collection over the graph (1.1 s at 100k nodes);
    # frozen objects are skipped, and the operating system frees the memory anyway.
    gc.freeze()
    sys.exit(code)
