"""qdq: lint and fix QDQ ONNX models for NPU, TensorRT and onnxruntime targets.

The library API mirrors the command line (docs/python-api.md):

    import qdq
    result = qdq.lint("model.onnx", target="npu")     # a path, an onnx.ModelProto or a qdq.Model

    fixed = qdq.fix("model.onnx", target="npu")       # fixed.changes lists every edit
    qdq.save_model(fixed.model, "model_npu.onnx")
    qdq.verify("model.onnx", "model_npu.onnx", target="npu").passed   # the verdict `qdq fix` gives
"""

import logging

from qdq.api import fix, lint, verify
from qdq.engine.fix import FixResult
from qdq.engine.lint import LintResult
from qdq.engine.ruleset import RuleSet, load_rules_file, load_target
from qdq.graph.model import Model, load_model, save_model

__version__ = "0.1.0"

# As a library should: qdq's warnings go where the application sends them, not to Python's
# last-resort handler.
logging.getLogger("qdq").addHandler(logging.NullHandler())

__all__ = [
    "FixResult", "LintResult", "Model", "RuleSet", "__version__",
    "fix", "lint", "load_model", "load_rules_file", "load_target", "save_model", "verify",
]
