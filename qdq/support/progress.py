"""A one-line progress display for long runs, on a terminal only.

Loading, checking and fixing a 100k-node model takes tens of seconds; a CI gate that prints
nothing for that long looks hung. The library calls `step()` at each phase; nothing is shown
unless the command line turned the display on (stderr is a terminal and not `-q`), nothing is
shown for runs shorter than `DELAY` seconds, and the line is erased when the run ends, so
reports and pipes never see it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")

DELAY = 1.0  # seconds before the first line: short runs stay silent
INTERVAL = 0.1  # seconds between redraws


class _Display:
    def __init__(self, stream: TextIO, clock: Callable[[], float]):
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.last_draw = 0.0
        self.width = 0

    def show(self, text: str) -> None:
        now = self.clock()
        if now - self.started < DELAY or now - self.last_draw < INTERVAL:
            return
        self.last_draw = now
        line = f"qdq: {text} ({now - self.started:.0f} s)"[:119]
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def erase(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


_display: _Display | None = None
_last = ""  # the text of the latest step
# (text, start time) of every step while `timed()` is active.
_timeline: list[tuple[str, float]] | None = None


def step(text: str) -> None:
    """Say what the run is doing now (a no-op unless `shown()` or `timed()` is active)."""
    global _last
    _last = text
    if _display is not None:
        _display.show(text)
    if _timeline is not None:
        _timeline.append((text, time.perf_counter()))


def tick() -> None:
    """Still doing what the last step said: the elapsed time moves (inside long numeric work)."""
    step(_last)


def each(items: Iterable[T], text: str | None, every: int = 1000) -> Iterator[T]:
    """`items`, with a `step(text)` every `every` of them: a long loop over a graph keeps the line moving.
    Without `text`, the line keeps saying what the last step said (`tick`)."""
    for index, item in enumerate(items):
        if index % every == 0:
            step(_last if text is None else text)
        yield item


@contextmanager
def shown(stream: TextIO, enabled: bool = True, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Display `step()` texts on `stream` while the block runs, if it is a terminal and `enabled`."""
    global _display
    if not enabled or not stream.isatty():
        yield
        return
    _display = _Display(stream, clock)
    try:
        yield
    finally:
        _display.erase()
        _display = None


@contextmanager
def timed() -> Iterator[list[tuple[str, float]]]:
    """Where a run's time goes: the list this yields holds each step's text and its seconds (until
    the next step, or the end of the block) once the block ends. For benchmarks/lint_profile.py."""
    global _timeline
    durations: list[tuple[str, float]] = []
    _timeline = [("(before the first step)", time.perf_counter())]
    try:
        yield durations
    finally:
        ends = [start for _, start in _timeline[1:]] + [time.perf_counter()]
        durations.extend((text, end - start) for (text, start), end in zip(_timeline, ends))
        _timeline = None
