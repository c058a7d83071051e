"""What a fix changed: the part of the fixed model that computes anything differently from the input.

A fix rewrites a few Q/DQ nodes and constants; everything upstream of its first change computes
exactly what the input model computes. So the fixed model need not run whole: its *region*, the
nodes that differ from the input's or read something that does, runs on the input model's values
at the region's boundary (`boundary`, recorded from the one run of the input model the verdict
makes anyway). With optimisations off the result is bit for bit a whole run of the fixed model,
at the cost of the part the fix touched.

A tensor is unchanged when both models have it and it is the same graph input, the same weight
(same type, shape and bytes, external data compared on disk), or the output of the same node
(op, domain, attributes, inputs and outputs by name) reading only unchanged tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from qdq.graph.model import external_range
from qdq.support import progress

_CHUNK = 16 << 20


@dataclass
class Region:
    """The fixed model's changed part, as a model that reads the unchanged values it needs."""

    model: onnx.ModelProto  # its inputs: the graph inputs it reads, then the boundary tensors (untyped)
    boundary: list[str]  # unchanged tensors the region reads, from the input model's run
    unchanged_outputs: list[str]  # the fixed model's outputs that are the input model's values
    nodes: int  # how many of the fixed model's nodes it holds
    of: int  # out of


def changed_region(reference: onnx.ModelProto, reference_folder: Path, candidate: onnx.ModelProto,
                   candidate_folder: Path) -> Region:
    """The region of `candidate` (models read without their external data) that differs from `reference`."""
    ref_graph, graph = reference.graph, candidate.graph
    same = _Same(Path(reference_folder), Path(candidate_folder))
    ref_inputs = {v.name: v for v in ref_graph.input}
    ref_producer = {o: n for n in progress.each(ref_graph.node, "finding what the fix changed") for o in n.output if o}
    ref_weights = {t.name: t for t in ref_graph.initializer}
    unchanged = {""}
    unchanged |= {v.name for v in graph.input if v.name in ref_inputs and v == ref_inputs[v.name]}
    unchanged |= {t.name for t in progress.each(graph.initializer, "finding what the fix changed")
                  if t.name in ref_weights and t.name not in ref_producer and same.tensor(ref_weights[t.name], t)}
    weights = {t.name for t in graph.initializer}
    changed_nodes = []
    for node in progress.each(_in_order(graph), "finding what the fix changed"):
        old = ref_producer.get(node.output[0]) if node.output else None
        if old is not None and _same_node(old, node) and all(name in unchanged for name in node.input):
            unchanged.update(node.output)
        else:
            changed_nodes.append(node)
    made = {o for n in progress.each(changed_nodes, None) for o in n.output}
    read = list(dict.fromkeys(i for n in progress.each(changed_nodes, None) for i in n.input if i and i not in made))
    declared = {v.name: v for v in graph.input}
    boundary = [name for name in read if name in unchanged and name not in weights and name not in declared]
    outputs = [o for o in graph.output if o.name not in unchanged]
    needed = set(read)
    progress.tick()  # copying the region's nodes into a model of their own: once, into the model itself
    region = helper.make_model(onnx.GraphProto(name=graph.name or "region"), opset_imports=candidate.opset_import,
                               ir_version=candidate.ir_version)
    region.graph.node.extend(changed_nodes)
    progress.tick()
    region.graph.input.extend([declared[name] for name in read if name in declared] +
                              [onnx.ValueInfoProto(name=n) for n in boundary])
    region.graph.output.extend(outputs)
    region.graph.initializer.extend(t for t in graph.initializer if t.name in needed)
    region.functions.extend(candidate.functions)
    return Region(region, boundary, [o.name for o in graph.output if o.name in unchanged],
                  len(changed_nodes), len(graph.node))


def _in_order(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    from qdq.verification.pieces import topological

    return topological(graph) or list(graph.node)


def _same_node(a: onnx.NodeProto, b: onnx.NodeProto) -> bool:
    # Field by field, cheapest first: at 100k nodes building the tuples of both nodes cost seconds.
    return a.op_type == b.op_type and a.domain == b.domain and a.input == b.input and a.output == b.output \
        and [x.SerializeToString() for x in a.attribute] == [y.SerializeToString() for y in b.attribute]


class _Same:
    """Whether two weights hold the same values; external bytes are read from each model's folder in chunks."""

    def __init__(self, reference_folder: Path, candidate_folder: Path):
        self.folders = reference_folder, candidate_folder

    def tensor(self, a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
        if (a.data_type, list(a.dims)) != (b.data_type, list(b.dims)):
            return False
        external = onnx.TensorProto.EXTERNAL
        if a.data_location != external and b.data_location != external:
            return a.SerializeToString() == b.SerializeToString()
        if a.data_location != b.data_location:
            return False
        return self._same_bytes(_where(a, self.folders[0]), _where(b, self.folders[1]))

    @staticmethod
    def _same_bytes(a: tuple[Path, int, int] | None, b: tuple[Path, int, int] | None) -> bool:
        if a is None or b is None or a[2] != b[2]:
            return False
        if a == b:
            return True
        try:
            with open(a[0], "rb") as fa, open(b[0], "rb") as fb:
                fa.seek(a[1])
                fb.seek(b[1])
                for start in range(0, a[2], _CHUNK):
                    size = min(_CHUNK, a[2] - start)
                    if fa.read(size) != fb.read(size):
                        return False
        except OSError:
            return False
        return True


def _where(tensor: onnx.TensorProto, folder: Path) -> tuple[Path, int, int] | None:
    try:
        return external_range(tensor, folder)
    except (KeyError, ValueError, OSError):  # no location, a malformed number, a missing file: not the same
        return None


def whole(candidate: onnx.ModelProto) -> Region:
    """The fixed model as its own region: what runs when its values cannot be taken from the input's
    (onnxruntime's optimisations fuse across any cut)."""
    return Region(candidate, [], [], len(candidate.graph.node), len(candidate.graph.node))
