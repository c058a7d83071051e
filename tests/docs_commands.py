"""The commands the README and docs/ show, run as a reader would type them, against the shipped files.

A fenced block whose info string is `console` is runnable: each `$ command` line runs (bash, in a
fresh temporary folder where `examples/` is the repository's and `qdq` is this checkout's), and
the lines under it, up to the next `$` line, are the output the page shows. `...` on a line of
its own stands for any number of lines, so a page can show the lines that matter. Outputs are
compared after normalising what differs from run to run: the temporary folder and the checkout's
path, and timings (`12.3 s`, `4 ms`).

A block marked `console not-run` is shown but not run (it runs too long for the suite, like the
end-to-end training); the page should say so. Other blocks (sh, toml, python, yaml) are not run.

    python tests/docs_commands.py            # run every runnable block, report the differences
    python tests/docs_commands.py --update   # rewrite the shown outputs with what the commands print now

`--update` keeps each block's shape (which lines are shown, where `...` sits): each shown line is
replaced by the line of the new output it matches best, so a changed verdict line is rewritten
in place; a line with no close match is reported for a person to look at.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE, NOT_RUN = "console", "console not-run"
ELLIPSIS = "..."
PROMPT = "$ "
# What a shown output line and a printed one may differ in.
_TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|µs|min)\b")
# Folders of the checkout a command may read; its own outputs go to the temporary folder.
_SHIPPED = ("examples",)
TIMEOUT_S = 300


@dataclass
class Command:
    page: Path
    line: int  # 1-based line of the `$` line in the page
    text: str
    shown: list[str]  # the output lines the page shows under it
    shown_lines: list[int]  # their 0-based indices in the page, for --update


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    commands: list[Command]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(pages: list[Path] = PAGES, info: str = RUNNABLE) -> list[Block]:
    """Every fenced block with exactly this info string, with its commands and shown outputs."""
    found = []
    for page in pages:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```") and lines[i][3:].strip() == info:
                start, commands = i, []
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    if lines[i].startswith(PROMPT):
                        commands.append(Command(page, i + 1, lines[i][len(PROMPT):], [], []))
                    elif commands:
                        commands[-1].shown.append(lines[i])
                        commands[-1].shown_lines.append(i)
                    i += 1
                found.append(Block(page, start + 1, commands))
            i += 1
    return found


def run_block(block: Block) -> list[str]:
    """Run a block's commands one after the other in a fresh folder; the output each prints (stdout and stderr)."""
    with tempfile.TemporaryDirectory(prefix="qdq-docs-") as folder:
        work = Path(folder)
        for name in _SHIPPED:
            (work / name).symlink_to(ROOT / name)
        bin_dir = work / ".bin"
        bin_dir.mkdir()
        shim = bin_dir / "qdq"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m qdq "$@"\n')
        shim.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": str(ROOT), "COLUMNS": "100", "QDQ_CPU": "x86-avx2"}
        outputs = []
        for command in block.commands:
            run = subprocess.run(["bash", "-c", command.text], cwd=work, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
            outputs.append(run.stdout.replace(f"{work.resolve()}/", "").replace(f"{work}/", "")
                           .replace(f"{ROOT}/", ""))
        return outputs


def normalise(line: str) -> str:
    return _TIMING.sub("<time>", line.rstrip())


def _segments(shown: list[str]) -> list[list[int]]:
    """The shown lines between `...` lines, as runs of indices into `shown` (the first and last may be empty)."""
    segments: list[list[int]] = [[]]
    for index, line in enumerate(shown):
        if line.strip() == ELLIPSIS:
            segments.append([])
        else:
            segments[-1].append(index)
    return segments


def _starts(number: int, segments: list[list[int]], position: int, printed: int) -> range:
    """Where segment `number` may start in the printed lines: at the top or bottom when no `...` frees it."""
    size = len(segments[number])
    if number == len(segments) - 1 and segments[-1]:
        return range(printed - size, printed - size + 1)
    if number == 0:
        return range(0, 1)
    return range(position, printed - size + 1)


def mismatch(shown: list[str], printed: str) -> str | None:
    """Why the printed output does not contain the shown lines as the page claims, or None when it does.

    Each run of shown lines must be printed as it is, consecutive lines, the runs in order; the
    first run starts the output and the last ends it unless a `...` stands before or after them."""
    if not shown:
        return None
    actual = [normalise(line) for line in printed.splitlines()]
    position = 0
    for number, segment in enumerate(_segments(shown)):
        if not segment:
            continue
        want = [normalise(shown[i]) for i in segment]
        match = next((s for s in _starts(number, _segments(shown), position, len(actual))
                      if s >= position and actual[s:s + len(want)] == want), None)
        if match is None:
            return f"shown lines not printed (in this order): {want[0]!r}" + (
                f" … ({len(want)} lines)" if len(want) > 1 else "")
        position = match + len(want)
    return None


def updated(shown: list[str], printed: str) -> tuple[list[str], list[str]]:
    """The shown lines rewritten from the printed output, keeping the block's shape (how many lines
    each run has, where `...` sits); and the shown lines no printed line comes close to."""
    actual = printed.splitlines()
    new, doubtful, position = list(shown), [], 0
    segments = _segments(shown)

    def likeness(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, normalise(a), normalise(b)).ratio()

    for number, segment in enumerate(segments):
        if not segment:
            continue
        starts = [s for s in _starts(number, segments, position, len(actual)) if s >= position]
        if not starts or starts[0] + len(segment) > len(actual):
            doubtful += [shown[i] for i in segment]
            continue
        best = max(starts, key=lambda s: sum(likeness(shown[i], actual[s + k]) for k, i in enumerate(segment)))
        for k, i in enumerate(segment):
            if likeness(shown[i], actual[best + k]) < 0.6:
                doubtful.append(shown[i])
            new[i] = actual[best + k]
        position = best + len(segment)
    return new, doubtful


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the shown outputs with what the commands print")
    args = parser.parse_args(argv)
    failures = 0
    edits: dict[Path, list[str]] = {}
    for block in blocks():
        outputs = run_block(block)
        for command, printed in zip(block.commands, outputs):
            if args.update:
                lines = edits.setdefault(command.page, command.page.read_text().splitlines())
                new, doubtful = updated(command.shown, printed)
                for index, text in zip(command.shown_lines, new):
                    lines[index] = text
                for line in doubtful:
                    print(f"{command.page.relative_to(ROOT)}:{command.line}: no close match for {line!r}; look at it")
            else:
                why = mismatch(command.shown, printed)
                if why:
                    failures += 1
                    print(f"{command.page.relative_to(ROOT)}:{command.line}: $ {command.text}\n  {why}")
    for page, lines in edits.items():
        page.write_text("\n".join(lines) + "\n")
        print(f"updated {page.relative_to(ROOT)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
