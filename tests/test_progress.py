"""Progress on a terminal: shown for long runs only, erased at the end, never on pipes or with -q."""

from __future__ import annotations

import io
import time

from qdq.support import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_long_run_shows_steps_then_erases_the_line():
    stream, clock = Terminal(), Clock()
    with progress.shown(stream, clock=clock):
        progress.step("reading m.onnx")  # before DELAY: silent
        assert stream.getvalue() == ""
        clock.now += progress.DELAY + 0.5
        progress.step("checking QDQ504 (3/20)")
        clock.now += progress.INTERVAL / 2
        progress.step("checking QDQ505 (4/20)")  # too soon after the last redraw: skipped
        clock.now += progress.INTERVAL
        progress.step("fixing, round 2")
    written = stream.getvalue()
    assert "\rqdq: checking QDQ504 (3/20) (2 s)" in written
    assert "QDQ505" not in written
    assert "fixing, round 2" in written
    # The last thing written blanks the line and returns to its start.
    assert written.endswith("\r") and written.rsplit("\r", 2)[-2].strip() == ""


def test_short_run_writes_nothing():
    stream, clock = Terminal(), Clock()
    with progress.shown(stream, clock=clock):
        progress.step("reading m.onnx")
        clock.now += progress.DELAY / 2
        progress.step("checking")
    assert stream.getvalue() == ""


def test_pipes_and_quiet_runs_write_nothing():
    clock = Clock()
    pipe = io.StringIO()  # not a terminal
    with progress.shown(pipe, clock=clock):
        clock.now += 10
        progress.step("checking")
    quiet = Terminal()
    with progress.shown(quiet, enabled=False, clock=clock):
        clock.now += 10
        progress.step("checking")
    assert pipe.getvalue() == "" and quiet.getvalue() == ""


def test_step_outside_a_display_is_a_no_op():
    progress.step("nobody is watching")  # must not raise


def test_timed_gives_each_step_the_time_until_the_next():
    with progress.timed() as steps:
        progress.step("reading m.onnx")
        time.sleep(0.05)
        progress.step("checking QDQ504 (3/20)")
    assert [text for text, _ in steps] == ["(before the first step)", "reading m.onnx", "checking QDQ504 (3/20)"]
    assert steps[1][1] >= 0.05 and steps[2][1] >= 0
    progress.step("after the block")  # recorded nowhere
    assert len(steps) == 3
