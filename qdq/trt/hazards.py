"""What in one engine points at a Q/DQ placement problem, and which qdq `trt` rule fixes it.

The signals are the ones a person looks for in a TREx drawing: standalone Q/DQ reformats, fused
Conv+Add layers whose residual input or output stayed float, float islands inside an INT8 engine,
reformats that change the data type, unfused BatchNorm/Scale layers after a quantized conv.
Each layer is explained by the first rule of a fixed table (the codes are those of `rules/trt.toml`).
A rule is only blamed where a Q/DQ or INT8 layer is involved: in an FP16/FP32 engine, reformats and
casts between float types are TensorRT's precision choices, which no Q/DQ placement changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from qdq.engine.ruleset import load_target
from qdq.trt.layers import FLOAT, LOW_BIT, Engine, Layer

CONV_KINDS = frozenset({"Convolution", "ConvActPool", "Deconvolution", "FullyConnected", "MatrixMultiply", "Gemm", "gemm"})


@cache
def commuting_ops() -> frozenset[str]:
    """The ONNX ops Q/DQ move through, as the rule that fixes a requantize around them (QDQ402)
    lists them in rules/trt.toml: a layer is only blamed on QDQ402 where QDQ402 checks its op.
    Read on first use, not when the CLI starts."""
    return frozenset(load_target("trt").rules["QDQ402"].params["ops"])


COMMUTING_KINDS = frozenset({"Shuffle", "Slice", "Padding", "Resize"})

RULES = {
    "QDQ802": "float-residual: quantize the residual (second) input of the Add fused into the Conv",
    "QDQ803": "qdq-in-fused-branch: remove the Q/DQ between the Conv and the Add it feeds",
    "QDQ401": "concat-scale-mismatch: give every Concat input one scale",
    "QDQ402": "in-out-scale-mismatch: give MaxPool and other commuting ops one scale on input and output",
    "QDQ801": "float-input: quantize the input of this Conv/Gemm/MatMul or average pool",
    "QDQ204": "unfolded-batchnorm: fold the BatchNormalization into the conv before quantizing",
}


@dataclass
class Hazard:
    kind: str  # qdq-reformat, type-reformat, float-residual, float-island, unfused-scale
    layers: list[Layer]
    message: str
    rule: str | None = None
    qdq_nodes: list[str] = field(default_factory=list)

    @property
    def time_ms(self) -> float | None:
        times = [layer.time_ms for layer in self.layers if layer.time_ms is not None]
        return sum(times) if times else None


class Graph:
    """Producer/consumer links of one engine, looking through layout-only reformats and NoOps."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._producer = engine.producers()
        self._consumers = engine.consumers()
        self.quantized = engine.quantized
        self._residual_users: dict[str, list[Layer]] = {}
        for layer in engine.layers:
            if len(layer.inputs) > 1 and layer.kind in CONV_KINDS:
                self._residual_users.setdefault(layer.inputs[1].name, []).append(layer)

    def producers(self, layer: Layer) -> list[Layer]:
        found = []
        for tensor in layer.inputs:
            source = self._producer.get(tensor.name)
            while source is not None and _passes_through(source) and source.inputs:
                source = self._producer.get(source.inputs[0].name)
            if source is not None:
                found.append(source)
        return found

    def consumers(self, layer: Layer) -> list[Layer]:
        found, todo = [], [t.name for t in layer.outputs]
        while todo:
            for user in self._consumers.get(todo.pop(), []):
                if _passes_through(user):
                    todo += [t.name for t in user.outputs]
                else:
                    found.append(user)
        return found

    def residual_consumers(self, layer: Layer) -> list[Layer]:
        """Fused Conv+Add layers whose residual (second) input is this layer's input or output."""
        tensors = [t.name for t in layer.outputs + layer.inputs]
        for tensor in list(tensors):  # a Q fed through a layout reformat: look at the reformat's input too
            source = self._producer.get(tensor)
            while source is not None and _passes_through(source) and source.inputs and source is not layer:
                tensors.append(source.inputs[0].name)
                source = self._producer.get(source.inputs[0].name)
        return [c for t in tensors for c in self._residual_users.get(t, [])]

    def near_qdq(self, layer: Layer) -> bool:
        """The layer or one next to it is a Q/DQ or has an INT8 tensor: a Q/DQ rule can explain it."""
        return any(n.touches_low_bit for n in [layer, *self.producers(layer), *self.consumers(layer)])

    def is_boundary(self, layer: Layer) -> bool:
        """The Q of a network input or the DQ of a network output: always needed."""
        bindings = set(self.engine.bindings)
        return any(t.name in bindings for t in layer.inputs + layer.outputs)


def _passes_through(layer: Layer) -> bool:
    return layer.is_noop or (layer.is_reformat and not changes_type(layer))


def changes_type(layer: Layer) -> bool:
    ins = {t.precision for t in layer.inputs if t.precision}
    outs = {t.precision for t in layer.outputs if t.precision}
    return bool(ins and outs and ins != outs)


def float_residual(layer: Layer) -> bool:
    """A fused Conv+Add with an INT8 conv input whose residual input or output stayed float."""
    if layer.kind not in CONV_KINDS or len(layer.inputs) < 2 or layer.inputs[0].precision not in LOW_BIT:
        return False
    return layer.inputs[1].precision in FLOAT or any(t.precision in FLOAT for t in layer.outputs)


def float_input(layer: Layer) -> bool:
    return layer.kind in CONV_KINDS and bool(layer.inputs) and layer.inputs[0].precision in FLOAT and not layer.weights_int8


def float_output(layer: Layer) -> bool:
    """An INT8 conv writing float: its consumer wanted float, so a Q had to follow."""
    return (layer.kind in CONV_KINDS and layer.runs_low_bit and not float_residual(layer)
            and any(t.precision in FLOAT for t in layer.outputs))


POOL_OPS = {"GlobalAveragePool", "AveragePool", "ReduceMean"}


def rule_for_qdq(graph: Graph, layer: Layer) -> str | None:
    """Which rule explains a standalone Q/DQ (or type-changing reformat) layer."""
    if not graph.near_qdq(layer):
        return None
    around = graph.producers(layer) + graph.consumers(layer)
    if any(float_residual(n) for n in around) or any(float_residual(n) for n in graph.residual_consumers(layer)):
        return "QDQ802"
    if any(p.kind in CONV_KINDS for p in graph.producers(layer)) and any(
        "Add" in c.ops and c.kind not in CONV_KINDS for c in graph.consumers(layer)
    ):
        return "QDQ803"
    if any("Concat" in n.ops or n.kind == "Concatenation" or n.name.endswith(" copy") for n in around):
        return "QDQ401"
    # A fused conv lists TensorRT's own Shuffles (`(Unnamed Layer* 849) [Shuffle]`): not a commuting op.
    if any((set(n.ops) & commuting_ops() or n.kind in COMMUTING_KINDS) and n.kind not in CONV_KINDS for n in around):
        return "QDQ402"
    # A Q after a float average pool (the GAP before a classifier): the pool's input needs Q/DQ.
    if any(p.kind == "Pooling" or set(p.ops) & POOL_OPS for p in graph.producers(layer)):
        return "QDQ801"
    return None


def rule_for_layer(graph: Graph, layer: Layer) -> str | None:
    """Which rule explains a compute layer that runs in float or writes float (in a quantized engine)."""
    if not graph.quantized:
        return None
    if float_residual(layer):
        return "QDQ802"
    if float_input(layer):
        return "QDQ801"
    if float_output(layer):
        consumers = graph.consumers(layer) + graph.residual_consumers(layer)
        qdq = [c for c in consumers if c.is_qdq]
        if any(float_residual(c) for c in consumers) or any(rule_for_qdq(graph, q) == "QDQ802" for q in qdq):
            return "QDQ802"
        if any(set(c.ops) & commuting_ops() and c.kind not in CONV_KINDS for c in consumers):
            return "QDQ402"
        return rule_for_qdq(graph, qdq[0]) if qdq else None
    if unfused_scale(graph, layer):
        return "QDQ204"
    if set(layer.ops) & commuting_ops() and not layer.runs_low_bit:
        return "QDQ402"
    if set(layer.ops) & POOL_OPS and not layer.runs_low_bit:
        return "QDQ801"
    return None


def unfused_scale(graph: Graph, layer: Layer) -> bool:
    """A BatchNormalization or Scale layer left after a quantized conv (not a Q/DQ Scale)."""
    if layer.is_qdq or not (layer.kind == "Scale" or "BatchNormalization" in layer.ops):
        return False
    return any(p.kind in CONV_KINDS and p.runs_low_bit for p in graph.producers(layer))


def responsible_qdq(graph: Graph, layer: Layer) -> list[str]:
    """The Q/DQ node names next to a layer (its own standalone Q/DQ, or its neighbours')."""
    if layer.is_qdq:
        return list(layer.qdq_nodes) or [layer.name]
    around = graph.producers(layer) + graph.consumers(layer) + graph.residual_consumers(layer)
    return [n.qdq_nodes[0] if n.qdq_nodes else n.name for n in around if n.is_qdq]


def find_hazards(engine: Engine) -> list[Hazard]:
    """Every signal of a bad Q/DQ placement in one engine, in execution order (islands last)."""
    graph = Graph(engine)
    hazards = []
    for layer in engine.layers:
        io = _io_text(layer)
        if layer.is_qdq and not graph.is_boundary(layer):
            hazards.append(Hazard("qdq-reformat", [layer], f"standalone {layer.qdq_direction or 'Q/DQ'} {io}",
                                  rule_for_qdq(graph, layer), responsible_qdq(graph, layer)))
        elif layer.is_reformat and changes_type(layer) and graph.near_qdq(layer) and not graph.is_boundary(layer):
            hazards.append(Hazard("type-reformat", [layer], f"reformat changes the data type {io}",
                                  rule_for_qdq(graph, layer), responsible_qdq(graph, layer)))
        elif float_residual(layer):
            hazards.append(Hazard("float-residual", [layer], f"Conv+Add with float residual {io}", "QDQ802",
                                  responsible_qdq(graph, layer)))
        elif unfused_scale(graph, layer):
            hazards.append(Hazard("unfused-scale", [layer], f"unfused {layer.kind} after a quantized conv {io}", "QDQ204"))
    if graph.quantized:
        hazards += float_islands(graph)
    return hazards


def float_islands(graph: Graph) -> list[Hazard]:
    """Connected runs of float compute layers in an INT8 engine (FP16/FP32 islands)."""
    floating = [layer for layer in graph.engine.layers if layer.role == "compute" and layer.inputs
                and not layer.runs_low_bit and all(t.precision in FLOAT for t in layer.inputs)]
    index = {id(layer): i for i, layer in enumerate(floating)}
    parent = list(range(len(floating)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for layer in floating:
        for source in graph.producers(layer):
            if id(source) in index:
                parent[root(index[id(layer)])] = root(index[id(source)])
    groups: dict[int, list[Layer]] = {}
    for i, layer in enumerate(floating):
        groups.setdefault(root(i), []).append(layer)
    hazards = []
    for members in groups.values():
        precisions = sorted({t.precision for layer in members for t in layer.inputs if t.precision})
        first, last = members[0], members[-1]
        span = first.name if len(members) == 1 else f"{first.name} ... {last.name}"
        rule = next((r for layer in members if (r := rule_for_layer(graph, layer))), None)
        qdq = [n for layer in members for n in responsible_qdq(graph, layer)]
        hazards.append(Hazard("float-island", members, f"{len(members)} layer(s) run in {'/'.join(precisions)}: {span}",
                              rule, list(dict.fromkeys(qdq))))
    return hazards


def _io_text(layer: Layer) -> str:
    if not layer.detailed:
        return ""
    return f"[{', '.join(p or '?' for p in layer.input_precisions)}] -> [{', '.join(p or '?' for p in layer.output_precisions)}]"
