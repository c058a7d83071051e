"""qdq: lint and fix QDQ ONNX models for NPU, TensorRT and onnxruntime targets.

The library API mirrors the command line:

    from qdq import load_model, load_target, lint
    result = lint(load_model("model.onnx"), load_target("common"))
"""

from qdq.lint import LintResult, lint
from qdq.model import Model, load_model, save_model
from qdq.ruleset import RuleSet, load_rules_file, load_target

__version__ = "0.1.0"

__all__ = ["LintResult", "Model", "RuleSet", "__version__", "lint", "load_model", "load_rules_file", "load_target", "save_model"]
