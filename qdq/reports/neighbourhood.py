"""The part of an ONNX graph around a lint finding, as plain data for the HTML reports' pictures.

A picture holds the finding's node, the compute nodes up to two hops upstream and downstream of it,
and every Q/DQ and pass-through node on the way: those do not count as hops, so the picture reaches
the layers that produce and consume the node's values, not just the quantizers between them. DQs of
constants (weights, biases) are left out: they would double a picture and say nothing about how
activations are quantized. Each Q/DQ keeps its scale and zero point, so a page can give equal
parameters one colour and show a mismatch at a glance.

Taken while the model is loaded: `qdq lint` drops each graph before it reads the next.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from qdq.graph import ir
from qdq.graph.model import Model
from qdq.quant.index import QuantIndex
from qdq.rewrite.rule import Finding, mention

HOPS = 2
MAX_NODES = 40  # a node with a huge fan-out (a shared input) still gives a picture that reads


@dataclass(frozen=True)
class Node:
    id: str  # n0, n1, ...: ONNX node names may be empty or repeated
    name: str
    op: str
    params: str | None  # a Q/DQ's "scale 0.0176 zp 16"; None for other nodes
    centre: bool


@dataclass(frozen=True)
class Neighbourhood:
    nodes: list[Node]
    edges: list[tuple[str, str, str]]  # producer id, consumer id, tensor name
    tensors: tuple[str, ...]  # the finding's tensors, which the picture marks


def neighbourhoods(model: Model, findings: list[Finding]) -> list[Neighbourhood | None]:
    """One picture per finding (None for a finding on the whole model, or whose node is gone)."""
    graph = _Graph(QuantIndex(model))
    by_name = {shown: node for node in model.graph.nodes if (shown := mention(node))}  # as findings name them
    tensors = model.graph.tensors()
    return [graph.around(_centre(finding, by_name, tensors), finding.tensors) for finding in findings]


def attach(model: Model, findings: list[Finding]) -> None:
    """Give each finding its neighbourhood (`finding.neighbourhood`), for the HTML reports."""
    for finding, drawn in zip(findings, neighbourhoods(model, findings)):
        finding.neighbourhood = drawn


def _centre(finding: Finding, by_name: dict[str, ir.Node], tensors: dict[str, ir.Tensor]) -> ir.Node | None:
    """The finding's node, else the producer (or first consumer) of its first tensor in the graph."""
    if finding.node in by_name:
        return by_name[finding.node]
    for name in finding.tensors:
        tensor = tensors.get(name)
        if tensor is not None and (tensor.inputs or tensor.outputs):
            return tensor.inputs[0] if tensor.inputs else tensor.outputs[0]
    return None


class _Graph:
    """A model's Q/DQ index, with its Q/DQ nodes as a set (membership by identity, not ir.Node equality)."""

    def __init__(self, index: QuantIndex):
        self.index = index
        self.qdq = {id(node) for node in index.quantizes + index.dequantizes}

    def around(self, centre: ir.Node | None, marked: tuple[str, ...] = ()) -> Neighbourhood | None:
        """The nodes within HOPS compute hops of `centre`, upstream and downstream, and the tensors between them."""
        if centre is None:
            return None
        kept = {id(centre): centre}
        for upstream in (True, False):
            self._walk(centre, upstream, kept)
        ids = {key: f"n{k}" for k, key in enumerate(kept)}
        nodes = [Node(ids[id(n)], mention(n), n.op, self._params(n), n is centre) for n in kept.values()]
        edges = [(ids[id(n)], ids[id(consumer)], tensor.name)
                 for n in kept.values() for tensor in n.outputs for consumer in tensor.outputs if id(consumer) in kept]
        return Neighbourhood(nodes, edges, tuple(marked))

    def _walk(self, centre: ir.Node, upstream: bool, kept: dict[int, ir.Node]) -> None:
        """Breadth first in one direction; Q/DQ and pass-through nodes cost no hop, so they go first."""
        queue = deque([(centre, 0)])
        while queue and len(kept) < MAX_NODES:
            node, hops = queue.popleft()
            for tensor in node.inputs if upstream else node.outputs:
                for other in tensor.inputs if upstream else tensor.outputs:
                    if id(other) in kept or self._is_constant_dq(other):
                        continue
                    cost = 0 if id(other) in self.qdq or self.index.is_pass_through(other) else 1
                    if hops + cost > HOPS or len(kept) >= MAX_NODES:
                        continue
                    kept[id(other)] = other
                    (queue.appendleft if cost == 0 else queue.append)((other, hops + cost))

    def _is_constant_dq(self, node: ir.Node) -> bool:
        return id(node) in self.qdq and node.op != "QuantizeLinear" and bool(node.inputs) \
            and isinstance(node.inputs[0], ir.Constant)

    def _params(self, node: ir.Node) -> str | None:
        """`scale 0.0175735 zp 16`, `per-channel (64)`, or `set at run time` for a Q/DQ; None otherwise."""
        if id(node) not in self.qdq:
            return None
        params = self.index.params(node)
        scale, zero_point = params.scale, params.zero_point
        if scale is None or zero_point is None:
            return "set at run time"
        if scale.size != 1:
            return f"per-channel ({scale.size})"
        return f"scale {float(scale.flat[0]):.6g} zp {int(zero_point.flat[0])}"
