"""What libraries print stays out of qdq's output: qdq reports what matters in its own words.

onnx-graphsurgeon prints to stdout, where qdq's JSON and SARIF reports go: "[W] Could not
convert: FLOAT8E4M3FN …" when it reads an FP8 model, "[W] colored module is not installed …"
the first time it logs at all. So it is silent from `import qdq` on, and the command line lets
it speak with -vv (as `qdq.runtime` does for onnxruntime's session log). qdq's own logger has a
NullHandler, the convention for a library: its warnings appear where the application (or the
command line) sends them, not by Python's last-resort handler.
"""

from __future__ import annotations

import logging

from onnx_graphsurgeon.logger import G_LOGGER


def show_library_logs(shown: bool) -> None:
    """graphsurgeon's warnings and errors when `shown`, nothing otherwise (its errors become qdq's)."""
    G_LOGGER.severity = G_LOGGER.WARNING if shown else G_LOGGER.CRITICAL + 1


show_library_logs(False)
logging.getLogger("qdq").addHandler(logging.NullHandler())
