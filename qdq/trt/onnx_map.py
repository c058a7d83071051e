"""Back to ONNX: attach to each engine difference the lint findings of B's model that explain it.

A difference names the Q/DQ nodes involved (standalone Q/DQ layers are named after their ONNX node)
and the engine tensors (which keep their ONNX names). A finding of the `trt` rule set touches the
difference when its node is one of those Q/DQ nodes, or when one of its tensors is an input or
output of them or one of those engine tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qdq.engine.lint import LintResult, lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model
from qdq.trt.diff import Comparison, Difference

TARGET = "trt"


@dataclass
class OnnxMapping:
    model: Path
    target: str
    notes: list[str] = field(default_factory=list)
    findings: int = 0  # findings of the model in total
    addressed: list[str] = field(default_factory=list)  # rule codes of the findings attached to differences

    def to_dict(self) -> dict:
        return {"model": str(self.model), "target": self.target, "notes": list(self.notes),
                "findings": self.findings, "addressed": list(self.addressed)}


def map_to_onnx(comparison: Comparison, model_path: Path) -> OnnxMapping:
    """Lint B's ONNX model with the `trt` rules and attach the findings to the differences."""
    model = load_model(model_path)
    mapping = OnnxMapping(model_path, TARGET)
    result = lint(model, load_target(TARGET))
    mapping.findings = len(result.findings)
    node_tensors = {node.name: {t.name for t in node.inputs + node.outputs} for node in model.graph.nodes}
    addressed = []
    for diff in comparison.differences:
        diff.findings = [f.to_dict() for f in _touching(result, diff, node_tensors)]
        addressed += [f["code"] for f in diff.findings]
        missing = [n for n in diff.qdq_nodes if n not in node_tensors]
        if missing and diff.kind != "only-in-a":
            diff.details["not_in_onnx"] = missing
    mapping.addressed = sorted(set(addressed))
    if any(d.details.get("not_in_onnx") for d in comparison.differences):
        mapping.notes.append(f"some Q/DQ nodes named by engine B are not in {model_path.name}: is it the model B was built from?")
    return mapping


def _touching(result: LintResult, diff: Difference, node_tensors: dict[str, set[str]]) -> list:
    nodes = set(diff.qdq_nodes)
    tensors = {t for n in nodes for t in node_tensors.get(n, ())}
    if diff.b is not None:
        tensors |= {t.name for t in diff.b.inputs + diff.b.outputs}
    return [f for f in result.findings if (f.node in nodes) or (set(f.tensors) & tensors)]
