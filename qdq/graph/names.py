"""Names for the tensors and nodes fixes create: new to the graph, and traceable to the tensor they replace."""

from __future__ import annotations

from qdq.graph import ir


def stem(node: ir.Node) -> str:
    """The base of names made after a node: its name, or its first output's for the unnamed nodes
    some tools write, so that a fix never creates tensors called "_bias" or "_input2"."""
    if node.name or not node.outputs:
        return node.name
    return node.outputs[0].name


class Names:
    """Fresh tensor names for one fix run; collects the graph's names once instead of on every call.

    It also remembers which model tensor a new constant replaces, so reports can keep naming a
    re-quantized weight as the model did, however often a run moves it.
    """

    def __init__(self, graph: ir.Graph):
        self._taken = set(graph.tensors())
        self._replaces: dict[str, str] = {}

    def new(self, base: str, replacing: str | None = None) -> str:
        name, index = base, 0
        while name in self._taken:
            index += 1
            name = f"{base}_{index}"
        self._taken.add(name)
        if replacing is not None:
            self._replaces[name] = self.original(replacing)
        return name

    def original(self, name: str) -> str:
        """The name the input model had for the tensor `name` replaces (`name` itself if none)."""
        return self._replaces.get(name, name)
