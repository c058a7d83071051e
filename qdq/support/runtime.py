"""onnxruntime as qdq runs a model: CPU, quiet, with optimisations off unless asked, interruptible.

Optimisations off, so what runs is exactly what the file says (calibration, the written-model
check, the fixes that compute constants and the float twin all need that). A verdict for a
target whose deployment is onnxruntime itself runs its defaults instead (`optimized=True`): the
Q/DQ node units become fused integer kernels with their own rounding and saturation.

Building a session of a large model and running it take seconds to minutes in native code, where
Python neither updates the progress line nor sees Ctrl-C. Both happen in a daemon thread while
the calling thread waits in short steps (`background`): the progress line keeps moving and Ctrl-C
answers at once (the thread is left to die with the process). onnxruntime's own log lines appear
only with -vv: qdq reports a failure once, in its own words. Imported lazily by its callers, so
linting never loads onnxruntime.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from contextlib import redirect_stdout
from pathlib import Path
from typing import Callable, NamedTuple, TypeVar

import onnxruntime as ort

from qdq.support import ort_options, progress

log = logging.getLogger("qdq")

T = TypeVar("T")


class InMemory(NamedTuple):
    """A serialised model whose external data lies in `folder` (the float twin of a model with external weights:
    onnxruntime refuses a model file whose data path leaves its folder, links included)."""

    data: bytes
    folder: Path


Source = str | os.PathLike | bytes | InMemory
_TICK = 0.25  # seconds between progress updates while native code runs


def session(model: Source, optimized: bool = False) -> ort.InferenceSession:
    """A CPU session for a model file or serialised model."""
    # onnxruntime's Python layer prints provider errors to stdout, where JSON reports go.
    with redirect_stdout(io.StringIO()):
        return background(lambda: _build(model, optimized), "building an onnxruntime session")


def sessions(*models: Source, optimized: bool = False) -> list[ort.InferenceSession | Exception]:
    """Sessions for several models built side by side; where onnxruntime refuses a model, its exception.

    onnxruntime builds a session without holding the interpreter lock, so on two cores the two
    models of a comparison load in about the time of the slower one (10k-node ladder: 2.1 s for
    both against 3.4 s one after the other). stdout is redirected once, here: redirecting it in
    each thread would swap the one `sys.stdout` back in the wrong order.
    """
    def build(model):
        try:
            return _build(model, optimized)
        except Exception as exc:  # the caller says whose model it was
            return exc

    with redirect_stdout(io.StringIO()):
        threads = [_Worker(lambda m=model: build(m)) for model in models]
        for worker in threads:
            worker.start()
        return [_wait(worker, f"building {len(models)} onnxruntime sessions") for worker in threads]


def run(session: ort.InferenceSession, names: list[str] | None, feeds: dict) -> list:
    """`session.run`, interruptible and with the progress line moving."""
    return background(lambda: session.run(names, feeds), "running the model in onnxruntime")


def background(work: Callable[[], T], doing: str) -> T:
    """`work()` in a daemon thread; this thread waits in short steps, showing `doing` on the progress line."""
    worker = _Worker(work)
    worker.start()
    return _wait(worker, doing)


class _Worker(threading.Thread):
    def __init__(self, work: Callable[[], object]):
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # handed to the waiting thread
            self.error = exc


def _wait(worker: _Worker, doing: str):
    while worker.is_alive():
        progress.step(doing)
        worker.join(_TICK)
    if worker.error is not None:
        raise worker.error
    return worker.result


def _build(model: Source, optimized: bool) -> ort.InferenceSession:
    verbose = log.isEnabledFor(logging.DEBUG)
    if isinstance(model, InMemory):
        return ort_options.build(model.data, optimized, model.folder, verbose)
    return ort_options.build(model if isinstance(model, bytes) else str(model), optimized, verbose=verbose)
