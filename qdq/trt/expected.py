"""The engine layout a rule set predicts from a Q/DQ ONNX model: the reference when no PTQ engine exists.

TensorRT 11 removed implicit quantization, so the old way of judging a QAT engine (build the
same network with `--int8` calibration, diff the two engines) cannot run. What the QAT engine
should look like follows from the ONNX and the target's rules instead: each weighted op whose
data input and weight are dequantized runs as one INT8 layer with its Q/DQ fused (QDQ801's
`ops`, through the `transparent` ops TensorRT moves Q/DQ across); each Q on a float graph input
runs as a standalone conversion layer, as in every INT8 engine with a float input; and every
finding with an `effect` adds the conversion layers the rule set says it costs. `qdq compare
--expect MODEL.onnx ENGINE.json` sets these counts against what the engine shows. Layout
reformats (TensorRT's choice of memory formats) are not predicted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdq.checks.placement import is_quantized
from qdq.engine.lint import lint
from qdq.engine.ruleset import RuleSet
from qdq.graph.model import load_model
from qdq.graph.ops import QDQ_DOMAINS, QUANTIZE
from qdq.quant.index import QuantIndex
from qdq.rewrite.rule import mention
from qdq.trt.layers import Engine


@dataclass
class Layout:
    """What the rule set predicts TensorRT builds from one ONNX model."""

    model: Path
    target: str
    int8_layers: list[str]  # weighted ops that run INT8 with their Q/DQ fused
    float_layers: list[str]  # weighted ops with a float input or weight
    input_quantizers: list[str]  # Qs of float graph inputs: standalone in every engine
    placement_conversions: int  # conversion layers the findings predict (`effect`/`reformats`)
    by_rule: dict[str, int] = field(default_factory=dict)
    fp32_ops: int = 0  # ops a strongly typed build keeps FP32 (QDQ901), where the rule set has it

    @property
    def standalone_qdq(self) -> int:
        return len(self.input_quantizers) + self.placement_conversions


def predict(path: Path, ruleset: RuleSet) -> Layout:
    model = load_model(path)
    result = lint(model, ruleset)
    index = QuantIndex(model)
    weighted = weighted_ops(ruleset)
    transparent = ruleset.params.get("transparent", [])
    int8, floating = [], []
    for node in model.graph.nodes:
        if node.op not in weighted:
            continue
        slots = [0, 1] if len(node.inputs) > 1 and node.op not in ("AveragePool", "GlobalAveragePool") else [0]
        quantized = all(is_quantized(index, node.inputs[s], transparent) for s in slots)
        (int8 if quantized else floating).append(mention(node))
    graph_inputs = {id(t) for t in model.graph.inputs}
    input_qs = [mention(n) for n in model.graph.nodes
                if n.op == QUANTIZE and n.domain in QDQ_DOMAINS and id(n.inputs[0]) in graph_inputs]
    counted = Counter(f.code for f in result.findings if f.reformats or f.conversions)
    return Layout(path, ruleset.name, int8, floating, input_qs, result.predicted_reformats(), dict(counted),
                  sum(f.values.get("count", 0) for f in result.findings if f.code == "QDQ901"))


def engine_counts(engine: Engine, weighted: set[str]) -> dict[str, int]:
    """What the engine shows, in the terms of `Layout`: INT8 and float weighted layers, standalone Q/DQ, reformats."""
    compute = [layer for layer in engine.layers if layer.role == "compute" and set(layer.ops) & weighted]
    return {
        "int8_layers": sum(1 for layer in compute if layer.runs_low_bit),
        "float_layers": sum(1 for layer in compute if not layer.runs_low_bit),
        "standalone_qdq": sum(1 for layer in engine.layers if layer.is_qdq),
        "reformats": sum(1 for layer in engine.layers if layer.is_reformat),
    }


def weighted_ops(ruleset: RuleSet) -> set[str]:
    """The ops TensorRT runs INT8 when their inputs are quantized: QDQ801's `ops` in the rule set."""
    cfg = ruleset.rules.get("QDQ801")
    return set(cfg.params["ops"]) if cfg is not None else set()


def compare_layout(layout: Layout, engine: Engine, ruleset: RuleSet) -> dict[str, Any]:
    """Predicted against shown, row by row, as the report and `--format json` give them."""
    shown = engine_counts(engine, weighted_ops(ruleset))
    rows = [
        ("int8_layers", "weighted layers with their Q/DQ fused (INT8)", len(layout.int8_layers)),
        ("float_layers", "weighted layers running float", len(layout.float_layers)),
        ("standalone_qdq", "standalone Q/DQ layers", layout.standalone_qdq),
        ("reformats", "layout reformats (not predicted)", None),
    ]
    return {
        "version": 1, "tool": "qdq", "command": "compare", "mode": "expect",
        "model": str(layout.model), "target": layout.target, "engine": str(engine.path),
        "engine_version": engine.version,
        "rows": [{"key": key, "what": what, "predicted": predicted, "engine": shown[key],
                  "match": None if predicted is None else predicted == shown[key]} for key, what, predicted in rows],
        "predicted": {"int8_layers": layout.int8_layers, "float_layers": layout.float_layers,
                      "input_quantizers": layout.input_quantizers,
                      "placement_conversions": layout.placement_conversions, "by_rule": layout.by_rule,
                      "fp32_ops": layout.fp32_ops},
        "notes": list(engine.notes),
    }


def render_text(report: dict[str, Any]) -> str:
    lines = [f"expected: {report['model']}  [rule set {report['target']}]",
             f"engine:   {report['engine']}  [TensorRT {report['engine_version']}]", "",
             f"{'':52} {'predicted':>9} {'engine':>7}"]
    for row in report["rows"]:
        predicted = "-" if row["predicted"] is None else row["predicted"]
        mark = "" if row["match"] is None else ("  ok" if row["match"] else "  DIFFERS")
        lines.append(f"{row['what']:52} {predicted!s:>9} {row['engine']!s:>7}{mark}")
    p = report["predicted"]
    lines += ["", f"standalone Q/DQ predicted: {len(p['input_quantizers'])} on float graph inputs, "
                  f"{p['placement_conversions']} from placement"
              + (f" (by rule: {', '.join(f'{c} x{n}' for c, n in sorted(p['by_rule'].items()))})" if p["by_rule"] else "")]
    if p["fp32_ops"]:
        lines.append(f"ops a strongly typed build keeps FP32 (QDQ901): {p['fp32_ops']}")
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"
