"""What differs between a reference engine A and a candidate B, after alignment.

Four kinds of difference, each tied to the layer(s) involved, the network region, the times and,
where the engine alone says so, the qdq `trt` rule that fixes it:

- `only-in-b` / `only-in-a`: Q/DQ and reformat layers (and compute layers) one engine does not have;
- `precision`: a paired layer whose input or output data types changed;
- `fusion`: A fuses ops into one layer that B's counterpart does not hold (B split the fusion).

When too few compute layers pair, A and B are not one network: the differences are listed but no rule
is blamed, since they say nothing about Q/DQ placement.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from qdq.trt import hazards
from qdq.trt.align import Pair, align
from qdq.trt.layers import FLOAT, LOW_BIT, Engine, Layer
from qdq.trt.names import STRUCTURAL_OPS

SCHEMA_VERSION = 1
SAME_NETWORK = 0.5  # least share of the larger engine's compute layers that must pair (same network: >= 0.9)


@dataclass
class Difference:
    kind: str  # only-in-b, only-in-a, precision, fusion
    region: str
    message: str
    a: Layer | None = None
    b: Layer | None = None
    rule: str | None = None
    qdq_nodes: list[str] = field(default_factory=list)  # Q/DQ ONNX nodes involved (in B's model)
    details: dict[str, Any] = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)  # lint findings of B's ONNX model touching qdq_nodes

    @property
    def delta_ms(self) -> float | None:
        a = self.a.time_ms if self.a is not None else 0.0
        b = self.b.time_ms if self.b is not None else 0.0
        return None if a is None or b is None else b - a

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "region": self.region, "message": self.message,
            "a": self.a.name if self.a else None, "b": self.b.name if self.b else None,
            "a_ms": self.a.time_ms if self.a else None, "b_ms": self.b.time_ms if self.b else None,
            "rule": self.rule, "qdq_nodes": list(self.qdq_nodes), "details": self.details,
            "findings": list(self.findings),
        }


@dataclass
class Comparison:
    a: Engine
    b: Engine
    pairs: list[Pair]
    differences: list[Difference]
    notes: list[str]

    def of_kind(self, *kinds: str) -> list[Difference]:
        return [d for d in self.differences if d.kind in kinds]

    def totals(self) -> dict[str, Any]:
        paired, larger = self.compute_pairing()
        return {"a": summary(self.a), "b": summary(self.b),
                "paired": sum(1 for p in self.pairs if p.a is not None and p.b is not None),
                "paired_compute": paired, "compute_layers_larger": larger, "same_network": self.same_network}

    def compute_pairing(self) -> tuple[int, int]:
        """Compute layers paired, and compute layers of the larger engine (Q/DQ and reformats left out:
        a QAT engine has many more of them than its reference)."""
        paired = sum(1 for p in self.pairs if p.a is not None and p.b is not None and "compute" in (p.a.role, p.b.role))
        larger = max(sum(1 for layer in e.layers if layer.role == "compute") for e in (self.a, self.b))
        return paired, larger

    @property
    def same_network(self) -> bool:
        paired, larger = self.compute_pairing()
        return paired >= SAME_NETWORK * larger

    def regions(self) -> list[dict[str, Any]]:
        """Per network region: time in A and B and the number of differences, in network order."""
        rows: dict[str, dict[str, Any]] = {}
        for pair in self.pairs:
            row = rows.setdefault(pair.region, {"region": pair.region, "a_ms": 0.0, "b_ms": 0.0, "differences": 0})
            row["a_ms"] += _ms(pair.a)
            row["b_ms"] += _ms(pair.b)
        for diff in self.differences:
            rows[diff.region]["differences"] += 1
        return list(rows.values())

    def breakdown(self) -> dict[str, int]:
        """The differences counted the way reports and `--fail-on` read them."""
        only_b = Counter(d.details.get("role") for d in self.of_kind("only-in-b"))
        precision = Counter(d.details["direction"] for d in self.of_kind("precision"))
        return {
            "qdq_only_in_b": only_b["qdq"],
            "reformats_only_in_b": only_b["reformat"],
            "compute_only_in_b": only_b["compute"],
            "lost_int8": precision["lost-int8"],
            "float_residual": sum(1 for d in self.of_kind("precision") if d.details["float_residual"]),
            "gained_int8": precision["gained-int8"],
            "other_precision": precision["changed"],
            "split_fusions": len(self.of_kind("fusion")),
            "only_in_a": len(self.of_kind("only-in-a")),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "tool": "qdq",
            "command": "compare",
            "a": str(self.a.path), "b": str(self.b.path),
            "totals": self.totals(),
            "counts": dict(Counter(d.kind for d in self.differences)),
            "regions": self.regions(),
            "differences": [d.to_dict() for d in self.differences],
            "pairs": [_pair_dict(p) for p in self.pairs],
            "notes": list(self.notes),
        }


def summary(engine: Engine) -> dict[str, Any]:
    """Layer counts and time of one engine (NoOp/Constant layers counted apart, as TREx folds them)."""
    layers = [layer for layer in engine.layers if not layer.is_noop]
    return {
        "path": str(engine.path), "version": engine.version, "detailed": engine.detailed,
        "layers": len(engine.layers), "layers_without_noops": len(layers),
        "quantized": engine.quantized, "qdq_layers": sum(1 for layer in layers if layer.is_qdq),
        "reformat_layers": sum(1 for layer in layers if layer.is_reformat),
        "int8_layers": sum(1 for layer in layers if layer.role == "compute" and layer.runs_low_bit) if engine.detailed else None,
        "total_ms": engine.total_ms(),
        "profile": str(engine.profile_path) if engine.profile_path else None,
    }


def compare(a: Engine, b: Engine) -> Comparison:
    pairs = align(a, b)
    graph_a, graph_b = hazards.Graph(a), hazards.Graph(b)
    differences: list[Difference] = []
    split_pieces: set[int] = set()
    for pair in pairs:
        if pair.a is not None and pair.b is not None:
            differences += _precision(pair, graph_b)
            fusion = _fusion(pair, graph_b)
            if fusion is not None:
                differences.append(fusion)
                split_pieces |= {id(layer) for layer in fusion.details.pop("pieces")}
    for pair in pairs:
        if pair.b is None and not pair.a.is_noop:
            differences.append(_only(pair.a, "only-in-a", pair.region, graph_a))
        elif pair.a is None and not pair.b.is_noop and id(pair.b) not in split_pieces:
            differences.append(_only(pair.b, "only-in-b", pair.region, graph_b))
    order = {id(p): i for i, p in enumerate(pairs)}
    position = {id(layer): order[id(p)] for p in pairs for layer in (p.a, p.b) if layer is not None}
    differences.sort(key=lambda d: position[id(d.b if d.b is not None else d.a)])
    comparison = Comparison(a, b, pairs, differences, _notes(a, b))
    if not comparison.same_network:
        paired, larger = comparison.compute_pairing()
        comparison.notes.insert(0, f"only {paired} of {larger} compute layers pair: these look like different "
                                   "networks; the differences below are not evidence of a Q/DQ problem")
        for diff in differences:
            diff.rule = None
    return comparison


def _only(layer: Layer, kind: str, region: str, graph: hazards.Graph) -> Difference:
    side = "B" if kind == "only-in-b" else "A"
    io = _io(layer)
    tensor = layer.inputs[0].name if layer.inputs else None
    details: dict[str, Any] = {"role": layer.role, "tensor": tensor, "io": io}
    if layer.is_qdq:
        message = f"standalone {layer.qdq_direction or 'Q/DQ'} {layer.name} only in {side}"
        rule = hazards.rule_for_qdq(graph, layer)
    elif layer.is_reformat:
        what = "type" if hazards.changes_type(layer) else "layout"
        message = f"{what} reformat only in {side}: {layer.name}"
        rule = hazards.rule_for_qdq(graph, layer) if what == "type" else None
    else:
        message = f"layer only in {side}: {layer.name}"
        rule = hazards.rule_for_layer(graph, layer)
    if io and layer.detailed:
        message += f" {io}"
    if tensor and layer.detailed and layer.role != "compute":
        message += f" on tensor {tensor}"
    if graph.is_boundary(layer):
        message += " (network input/output)"
    if kind == "only-in-a" or graph.is_boundary(layer):
        rule = None  # not in B, or needed at the network boundary: nothing in B's model to fix
    return Difference(kind, region, message, a=layer if side == "A" else None, b=layer if side == "B" else None,
                      rule=rule, qdq_nodes=hazards.responsible_qdq(graph, layer) if side == "B" else [],
                      details=details)


def _precision(pair: Pair, graph_b: hazards.Graph) -> list[Difference]:
    a, b = pair.a, pair.b
    if not (a.detailed and b.detailed) or a.is_noop:
        return []
    if (a.input_precisions, a.output_precisions) == (b.input_precisions, b.output_precisions):
        return []
    # Inputs and outputs position by position (a fused residual adds an input: compare what both have).
    zipped = list(zip(a.input_precisions, b.input_precisions)) + list(zip(a.output_precisions, b.output_precisions))
    positions = [p for p, (x, y) in enumerate(zipped) if x != y]
    residual = hazards.float_residual(b) and a.runs_low_bit and not hazards.float_residual(a)
    lost = residual or any(x in LOW_BIT and y in FLOAT for x, y in zipped)
    gained = any(x in FLOAT and y in LOW_BIT for x, y in zipped)
    direction = "lost-int8" if lost else "gained-int8" if gained else "changed"
    if hazards.float_residual(b):
        label = "float residual"
    elif direction == "lost-int8":
        inputs_kept = not any(x in LOW_BIT and y in FLOAT for x, y in zip(a.input_precisions, b.input_precisions))
        label = "writes float" if inputs_kept else "falls back to float"
    elif direction == "gained-int8":
        label = "now quantized"
    else:
        label = "changes float precision" if all({x, y} <= FLOAT for x, y in zipped if x != y) else "changes type"
    message = f"{_short(b.name)} {label}: {_io(a)} in A, {_io(b)} in B"
    rule = hazards.rule_for_layer(graph_b, b) if lost else None
    return [Difference("precision", pair.region, message, a=a, b=b, rule=rule,
                       qdq_nodes=hazards.responsible_qdq(graph_b, b) if lost else [],
                       details={"direction": direction, "changed_positions": positions,
                                "a_io": _io(a), "b_io": _io(b), "float_residual": hazards.float_residual(b)})]


def _fusion(pair: Pair, graph_b: hazards.Graph) -> Difference | None:
    """A's layer fuses structural ops (Add, MaxPool, Concat, ...) that B's counterpart lacks."""
    missing = Counter(op for op in pair.a.ops if op in STRUCTURAL_OPS) - Counter(pair.b.ops)
    if not missing or not pair.b.ops:
        return None
    neighbours = graph_b.producers(pair.b) + graph_b.consumers(pair.b) if pair.b.detailed else []
    pieces = [n for n in neighbours if set(n.ops) & set(missing) and not n.is_qdq]
    ops = "+".join(sorted(missing))
    where = f"; in B it runs in {', '.join(_short(p.name) for p in pieces)}" if pieces else ""
    message = f"A fuses {ops} into {_short(pair.a.name)}; B's {_short(pair.b.name)} does not{where}"
    # A float fusion TensorRT chose differently, with no Q/DQ or INT8 layer near: no placement decides it.
    rule = _fusion_rule(missing, neighbours, pieces) if any(graph_b.near_qdq(n) for n in [pair.b, *pieces]) else None
    qdq = [q for layer in [pair.b, *pieces] for q in hazards.responsible_qdq(graph_b, layer)]
    return Difference("fusion", pair.region, message, a=pair.a, b=pair.b, rule=rule, qdq_nodes=list(dict.fromkeys(qdq)),
                      details={"missing_ops": sorted(missing.elements()), "b_pieces": [p.name for p in pieces],
                               "pieces": pieces})


def _fusion_rule(missing: Counter, neighbours: list[Layer], pieces: list[Layer]) -> str | None:
    if "Add" in missing:
        between = [n for n in neighbours if n.is_qdq]
        return "QDQ803" if between and not any(hazards.float_residual(p) for p in pieces) else "QDQ802"
    if set(missing) & hazards.commuting_ops():
        return "QDQ402"
    if "Concat" in missing:
        return "QDQ401"
    return "QDQ204" if "BatchNormalization" in missing else None


def _notes(a: Engine, b: Engine) -> list[str]:
    notes = list(a.notes) + list(b.notes)
    if not b.quantized:
        notes.append(f"B ({b.path.name}) has no Q/DQ or INT8 layer: a float engine, whose precision, reformat "
                     "and fusion differences are TensorRT's choices; no Q/DQ rule applies")
    elif not a.quantized:  # an FP16 engine of the float model: the reference TensorRT 11 leaves
        still = [layer.name for layer in b.layers if layer.role == "compute" and not layer.runs_low_bit]
        if still:
            shown = ", ".join(_short(name, 40) for name in still[:5]) + (", ..." if len(still) > 5 else "")
            notes.append(f"A ({a.path.name}) is a float engine: {len(still)} compute layer(s) of B still run "
                         f"float ({shown}); B's standalone Q/DQ below are what its placement costs")
    for engine, side in ((a, "A"), (b, "B")):
        if not engine.detailed:
            notes.append(
                f"{side} ({engine.path.name}) lists layer names only (built without --profilingVerbosity=detailed): "
                "data types, formats, shapes and tactics cannot be compared, so precision changes are not reported "
                "and layers are matched by name only; Q/DQ layers are recognised by their names"
            )
    if (a.profile_path is None) != (b.profile_path is None):
        notes.append("only one engine has a profile: time differences are not reported")
    return notes


def _pair_dict(pair: Pair) -> dict[str, Any]:
    return {"region": pair.region, "how": pair.how,
            "a": pair.a.name if pair.a else None, "b": pair.b.name if pair.b else None,
            "a_ms": pair.a.time_ms if pair.a else None, "b_ms": pair.b.time_ms if pair.b else None,
            "a_io": _io(pair.a) if pair.a else None, "b_io": _io(pair.b) if pair.b else None}


def _ms(layer: Layer | None) -> float:
    return layer.time_ms or 0.0 if layer is not None else 0.0


def _io(layer: Layer) -> str:
    if not layer.detailed:
        return ""
    return (f"[{', '.join(p or '?' for p in layer.input_precisions)}] -> "
            f"[{', '.join(p or '?' for p in layer.output_precisions)}]")


def _short(name: str, limit: int = 70) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."
