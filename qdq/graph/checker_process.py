"""The ONNX checker on a large model's file in a second process, while this one builds the graph
(or, for a file `qdq fix` writes, judges it); onnxruntime's load of a large written file; and onnx's
shape inference of a large model, which holds the interpreter lock for seconds (17 s on 100k nodes
under load), so that a thread cannot keep the progress line moving meanwhile.

On 100k nodes the checker takes about 0.7 s and holds the interpreter lock, so a thread would
not overlap it with the import; a child process on a second core does. The child only says
whether the checker accepts the file: when it does not, the caller checks again in process,
where the refusal has its message and the repairs and onnxruntime's verdict follow as usual.
Small models, and machines with one core, are checked in process: starting an interpreter
costs more than their check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Callable

import onnx

from qdq.graph.normalize import without_weight_data
from qdq.support import progress

# Below this many nodes the checker costs less than the child's interpreter start (about 0.3 s).
MIN_NODES = 30_000
# Below this many nodes onnxruntime builds and frees the written file's session in seconds, less than a
# child's start with onnxruntime's import (about a second).
SESSION_MIN_NODES = 30_000
# Below this many nodes onnx's shape inference takes about a second at most, as long as a child's start with
# onnx's import; the checker's placement (MIN_NODES) does not move it, so a test forcing that child keeps this one.
TYPES_MIN_NODES = 30_000
_CHECK = "import sys, onnx.checker; onnx.checker.check_model(sys.argv[1], full_check=sys.argv[2] == 'full')"
_RUN_SCRIPT = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"  # a module of qdq, without qdq



class _Child:
    """A child process with no streams of its own, ended if it still runs when the caller stops waiting."""

    def __init__(self, argv: list[str]):
        self._child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def _wait(self, doing: str) -> int:
        """The child's exit code, once it ends; meanwhile `doing` on the progress line."""
        while self._child.poll() is None:
            progress.step(doing)
            time.sleep(0.25)
        return self._child.returncode

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
        super().__init__([sys.executable, "-c", _RUN_SCRIPT, script, str(path)])

    def accepted(self, doing: str) -> bool:
        """Wait, with `doing` on the progress line; True when onnxruntime built the session."""
        return self._wait(doing) == 0


class TypesProcess(_Child):
    """onnx's shape inference of a model in a child process (`qdq.graph.element_types` run as a script),
    which writes each typed tensor's element type to a JSON file; both files live in a folder of its own."""

    def __init__(self, model: onnx.ModelProto):
        """`model` is written without its weights' data, which inference does not read."""
        light = without_weight_data(model)
        progress.tick()  # the copy takes about a second at 100k nodes, as does writing it
        self._folder = tempfile.TemporaryDirectory(prefix="qdq-types-")
        path, self._types = Path(self._folder.name) / "model.onnx", Path(self._folder.name) / "types.json"
        script = find_spec("qdq.graph.element_types").origin
        try:
            path.write_bytes(light.SerializeToString())
            super().__init__([sys.executable, "-c", _RUN_SCRIPT, script, str(path), str(self._types)])
        except OSError:
            self._folder.cleanup()
            raise

    def element_types(self, doing: str) -> dict[str, int] | None:
        """Wait, with `doing` on the progress line; None when the inference failed."""
        return json.loads(self._types.read_text()) if self._wait(doing) == 0 else None

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._folder.cleanup()


def start_types(model: onnx.ModelProto) -> TypesProcess | None:
    """A child inferring the element types of `model`'s tensors when the model is large and a second core can
    run it; else None (the caller infers them itself, as it does again when the child failed, where a
    failure has its message)."""
    return _start(len(model.graph.node), TYPES_MIN_NODES, lambda: TypesProcess(model))


def start_session(path: Path, nodes: int) -> SessionProcess | None:
    """A child building onnxruntime's session of `path` when the model is large and a second core can run
    it; else None (the caller builds the session itself)."""
    return _start(nodes, SESSION_MIN_NODES, lambda: SessionProcess(path))


def start_checker(path: Path, nodes: int, full_check: bool = False) -> CheckerProcess | None:
    """A child checking `path` when the model is large and a second core can run it; else None."""
    return _start(nodes, MIN_NODES, lambda: CheckerProcess(path, full_check))


def _start(nodes: int, threshold: int, child: Callable[[], _Child]):
    """`child()` when a model of `nodes` nodes is large enough for it to pay; None when it is not, or when no
    interpreter can be started (an embedded Python, a process limit): the caller then works in process."""
    if not _child_pays(nodes, threshold):
        return None
    try:
        return child()
    except OSError:
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
