"""The ONNX checker on a large model's file in a second process, while this one builds the graph
(or, for a file `qdq fix` writes, judges it); and onnxruntime's load of a large written file.

On 100k nodes the checker takes about 0.7 s and holds the interpreter lock, so a thread would
not overlap it with the import; a child process on a second core does. The child only says
whether the checker accepts the file: when it does not, the caller checks again in process,
where the refusal has its message and the repairs and onnxruntime's verdict follow as usual.
Small models, and machines with one core, are checked in process: starting an interpreter
costs more than their check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from qdq.support import progress

# Below this many nodes the checker costs less than the child's interpreter start (about 0.3 s).
MIN_NODES = 30_000
# Below this many nodes onnxruntime builds and frees the written file's session in seconds, less than a
# child's start with onnxruntime's import (about a second).
SESSION_MIN_NODES = 30_000
_CHECK = "import sys, onnx.checker; onnx.checker.check_model(sys.argv[1], full_check=sys.argv[2] == 'full')"


class _Child:
    """A child process with no streams of its own, ended if it still runs when the caller stops waiting."""

    def __init__(self, argv: list[str]):
        self._child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        """End the child if it still runs (the caller stopped waiting for its answer)."""
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()


class CheckerProcess(_Child):
    """`onnx.checker.check_model(path, full_check)` running in a child process."""

    def __init__(self, path: Path, full_check: bool = False):
        super().__init__([sys.executable, "-c", _CHECK, str(path), "full" if full_check else "plain"])

    def accepted(self) -> bool:
        """True when the checker accepted the file; False when it refused it or the child failed in any way."""
        return self._child.wait() == 0


class SessionProcess(_Child):
    """onnxruntime building a session of a written file in a child process, as qdq builds every session
    (`qdq.support.ort_options`, run as a script: the child does not load qdq).

    The session of a 100k-node file takes minutes to build and seconds to free, and freeing it holds the
    interpreter lock, so the progress line stands still; the child exits without freeing it, and meanwhile
    this process verifies the file. Like `CheckerProcess` it only says whether onnxruntime accepts the
    file: the caller loads it again in process for the refusal's message.
    """

    def __init__(self, path: Path):
        script = find_spec("qdq.support.ort_options").origin  # found without importing onnxruntime here
        run_script = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
        super().__init__([sys.executable, "-c", run_script, script, str(path)])

    def accepted(self, doing: str) -> bool:
        """Wait, with `doing` on the progress line; True when onnxruntime built the session."""
        while self._child.poll() is None:
            progress.step(doing)
            time.sleep(0.25)
        return self._child.returncode == 0


def start_session(path: Path, nodes: int) -> SessionProcess | None:
    """A child building onnxruntime's session of `path` when the model is large and a second core can run
    it; else None (the caller builds the session itself)."""
    if not _child_pays(nodes, SESSION_MIN_NODES):
        return None
    try:
        return SessionProcess(path)
    except OSError:
        return None


def start_checker(path: Path, nodes: int, full_check: bool = False) -> CheckerProcess | None:
    """A child checking `path` when the model is large and a second core can run it; else None."""
    if not _child_pays(nodes, MIN_NODES):
        return None
    try:
        return CheckerProcess(path, full_check)
    except OSError:  # no interpreter to start (an embedded Python, a process limit): check in process
        return None


def _child_pays(nodes: int, threshold: int) -> bool:
    """Whether a model is large enough for a child process to pay, and a second core can run it. A frozen
    application's executable is not an interpreter that takes -c."""
    return nodes >= threshold and usable_cores() >= 2 and not getattr(sys, "frozen", False)


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1
