"""How qdq builds every onnxruntime session, in a module that imports nothing of qdq.

`qdq.support.runtime` builds its sessions here, and so does the second process that loads a large
written file (`qdq.graph.checker_process.SessionProcess`): run as a script, this module checks that
onnxruntime accepts a file without loading qdq itself (a second of imports).

    python ort_options.py MODEL.onnx    exit 0 when onnxruntime builds a session of it
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnxruntime as ort


def build(model: str | bytes, optimized: bool = False, folder: Path | None = None,
          verbose: bool = False) -> ort.InferenceSession:
    """A CPU session of a file or serialised model (`folder`: where a serialised model's external data lies)."""
    options = ort.SessionOptions()
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Without its arena onnxruntime gives each run's buffers back: with it, a session that dequantizes a
    # 256 MiB int8 weight grew by the 1 GiB float copy on every sample (9 GB for four samples of a 0.5 GiB model).
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 2 if verbose else 4
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


if __name__ == "__main__":
    build(sys.argv[1])
    sys.stdout.flush()
    os._exit(0)  # without freeing the session: onnxruntime takes seconds to free a 100k-node one
