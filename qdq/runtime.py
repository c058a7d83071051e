"""onnxruntime as qdq runs a model: CPU, graph optimisations off, quiet.

Optimisations off, so what runs is exactly what the file says (verification, calibration, the
written-model check and the fixes that compute constants all need that). onnxruntime's own
log lines appear only with -vv: qdq reports a failure once, in its own words. Imported lazily
by its callers, so linting never loads onnxruntime.
"""

from __future__ import annotations

import io
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stdout

import onnxruntime as ort

log = logging.getLogger("qdq")


def session(model: str | os.PathLike | bytes) -> ort.InferenceSession:
    """A CPU session for a model file or serialised model, graph optimisations off."""
    # onnxruntime's Python layer prints provider errors to stdout, where JSON reports go.
    with redirect_stdout(io.StringIO()):
        return _build(model)


def sessions(*models: str | os.PathLike | bytes) -> list[ort.InferenceSession | Exception]:
    """Sessions for several models built side by side; where onnxruntime refuses a model, its exception.

    onnxruntime builds a session without holding the interpreter lock, so on two cores the two
    models of a comparison load in about the time of the slower one (10k-node ladder: 2.1 s for
    both against 3.4 s one after the other). stdout is redirected once, here: redirecting it in
    each thread would swap the one `sys.stdout` back in the wrong order.
    """
    def build(model):
        try:
            return _build(model)
        except Exception as exc:  # the caller says whose model it was
            return exc

    with redirect_stdout(io.StringIO()), ThreadPoolExecutor(max_workers=len(models)) as pool:
        return list(pool.map(build, models))


def _build(model: str | os.PathLike | bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 2 if log.isEnabledFor(logging.DEBUG) else 4
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
