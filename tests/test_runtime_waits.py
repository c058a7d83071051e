"""onnxruntime's native work runs in a daemon thread: the progress line keeps moving and Ctrl-C answers at once.

A session build of a large model takes minutes in native code; before, the progress line froze
for 13 minutes and Ctrl-C took ~15 s (the interrupt waited for the build). `time.sleep` stands
in for the native call here: like onnxruntime, it releases the interpreter lock.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qdq.support import progress, runtime

ROOT = Path(__file__).resolve().parent.parent


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_moves_while_native_work_runs(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    stream = Terminal()
    with progress.shown(stream):
        assert runtime.background(lambda: time.sleep(1.2) or "built", "building an onnxruntime session") == "built"
    redraws = stream.getvalue().count("\rqdq: building an onnxruntime session")
    assert redraws >= 4, stream.getvalue()  # one every tick (0.25 s), not one for the whole wait


def test_an_error_in_the_work_reaches_the_caller():
    def fails():
        raise ValueError("no kernel")

    with pytest.raises(ValueError, match="no kernel"):
        runtime.background(fails, "running")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_ctrl_c_answers_within_a_second_while_native_work_runs():
    # A test runner's worker may ignore SIGINT, and a child inherits that: the child takes Ctrl-C as a
    # terminal's process does, whatever started it.
    script = ("import signal, time, sys\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from qdq.support import runtime\n"
              "print('waiting', flush=True)\n"
              "try:\n"
              "    runtime.background(lambda: time.sleep(60), 'building')\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted', time.monotonic(), flush=True)\n"
              "    sys.exit(130)\n")
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "waiting"
    time.sleep(0.3)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    code = child.wait(timeout=10)
    said, answered = child.stdout.read().split()
    assert code == 130 and said == "interrupted"
    # The answer, on the clock both processes share (not the interpreter's exit after it, which a busy
    # machine slows): the sleeping thread is not waited for.
    assert float(answered) - sent < 1.0
