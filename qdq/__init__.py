"""qdq: lint and fix QDQ ONNX models for NPU, TensorRT and onnxruntime targets.

The library API mirrors the command line:

    from qdq import fix, load_model, load_target, lint, save_model
    result = lint(load_model("model.onnx"), load_target("common"))

    model = load_model("model.onnx")
    fixed = fix(model, load_target("npu"))      # edits model.graph; fixed.changes lists every edit
    save_model(model, "model_npu.onnx")
"""

from qdq.fix import FixResult, fix
from qdq.lint import LintResult, lint
from qdq.model import Model, load_model, save_model
from qdq.ruleset import RuleSet, load_rules_file, load_target

__version__ = "0.1.0"

__all__ = ["FixResult", "LintResult", "Model", "RuleSet", "__version__", "fix", "lint", "load_model", "load_rules_file", "load_target", "save_model"]
