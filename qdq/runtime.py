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
from contextlib import redirect_stdout

import onnxruntime as ort

log = logging.getLogger("qdq")


def session(model: str | os.PathLike | bytes) -> ort.InferenceSession:
    """A CPU session for a model file or serialised model, graph optimisations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 2 if log.isEnabledFor(logging.DEBUG) else 4
    source = model if isinstance(model, bytes) else str(model)
    # onnxruntime's Python layer prints provider errors to stdout, where JSON reports go.
    with redirect_stdout(io.StringIO()):
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
