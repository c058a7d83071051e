"""`qdq completion SHELL`: print a completion script for bash, zsh or fish (docs/commands.md says how to load it)."""

from __future__ import annotations

import argparse
import sys

from qdq.commands.args import add_logging_args, subcommands
from qdq.commands.completion_script import SHELLS, script


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "completion", help="print a shell completion script (bash, zsh, fish)",
        description="Print the completion script for SHELL on stdout. bash: eval \"$(qdq completion bash)\" in "
        "~/.bashrc; zsh: eval \"$(qdq completion zsh)\" in ~/.zshrc; fish: qdq completion fish > "
        "~/.config/fish/completions/qdq.fish.",
    )
    parser.add_argument("shell", choices=SHELLS)
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    parser = args.command_line  # the whole command line, this command included (set by qdq.cli)
    sys.stdout.write(script(args.shell, parser, subcommands(parser)))
    return 0
