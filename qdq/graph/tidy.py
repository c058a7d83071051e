"""Drop the nodes no graph output needs, then order the rest topologically.

The fix driver runs this after each rule that edits the graph. The order is onnx-graphsurgeon's
`cleanup().toposort()` order (tests/test_graph_layer.py compares them): by depth, ties in the
order a depth-first walk from the nodes in list order finishes them. A node with subgraphs
depends on what their nodes read from the enclosing graph. Fixes add no nodes inside a
subgraph, so subgraphs are left as they are.
"""

from __future__ import annotations

from typing import Iterator

from qdq.graph import ir
from qdq.support import progress
from qdq.support.errors import QdqError


def tidy(graph: ir.Graph) -> None:
    """Remove unused nodes and sort the graph in place."""
    for tensor in graph.inputs:  # a graph input has no producer inside the graph
        tensor.inputs.clear()
    used = _used_nodes(graph)
    kept = []
    for node in graph.nodes:
        if id(node) in used:
            kept.append(node)
        else:
            _detach(node)
    graph.nodes = _by_depth(kept)


def _detach(node: ir.Node) -> None:
    """Unlink a dropped node, and the nodes of its subgraphs, from every tensor."""
    node.inputs.clear()
    node.outputs.clear()
    for subgraph in node.subgraphs():
        for inner in subgraph.nodes:
            _detach(inner)


def _used_nodes(graph: ir.Graph) -> set[int]:
    """The ids of the nodes some graph output depends on."""
    used: set[int] = set()
    seen = {t.name for t in graph.outputs}
    pending = list(graph.outputs)
    while pending:
        tensor = pending.pop()
        for producer in tensor.inputs:
            if id(producer) in used:
                continue
            used.add(id(producer))
            for source in _reads(producer):
                if source.name and source.name not in seen:
                    seen.add(source.name)
                    pending.append(source)
    return used


def _by_depth(nodes: list[ir.Node]) -> list[ir.Node]:
    """Nodes sorted by depth (1 + the deepest producer), stable in depth-first finishing order."""
    local = {id(node) for node in nodes}
    depth: dict[int, int] = {}
    finished: list[ir.Node] = []
    for root in progress.each(nodes, None):
        if id(root) in depth:
            continue
        deepest = {id(root): -1}
        stack = [(root, iter(_producers(root, local)))]
        while stack:
            node, producers = stack[-1]
            for producer in producers:
                if id(producer) in depth:
                    deepest[id(node)] = max(deepest[id(node)], depth[id(producer)])
                    continue
                if id(producer) in deepest:
                    raise QdqError(f"the graph has a cycle through node {producer.name!r}")
                deepest[id(producer)] = -1
                stack.append((producer, iter(_producers(producer, local))))
                break
            else:
                stack.pop()
                depth[id(node)] = deepest.pop(id(node)) + 1
                finished.append(node)
                if stack:
                    parent = id(stack[-1][0])
                    deepest[parent] = max(deepest[parent], depth[id(node)])
    return sorted(finished, key=lambda node: depth[id(node)])


def _producers(node: ir.Node, local: set[int]) -> list[ir.Node]:
    """The graph's nodes that make this node's inputs, each once, in input order."""
    found: dict[int, ir.Node] = {}
    for tensor in _reads(node):
        for producer in tensor.inputs:
            if id(producer) in local:
                found.setdefault(id(producer), producer)
    return list(found.values())


def _reads(node: ir.Node) -> Iterator[ir.Tensor]:
    """The tensors a node reads: its inputs, and whatever the nodes of its subgraphs read."""
    yield from node.inputs
    for subgraph in node.subgraphs():
        for inner in subgraph.nodes:
            yield from _reads(inner)
