"""Values of tensors computed from constants alone, as onnxruntime computes them.

Folding a dequantized parameter to float (a bias, LayerNorm's scale, the weight of a GEMM the
target runs in float) must give the exact values the model computed, rounding and clipping
included: so the nodes that make the tensor run in onnxruntime, not in a numpy re-implementation.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper, shape_inference
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

from qdq.rule import CheckContext

log = logging.getLogger("qdq")


# More nodes than this between a tensor and the constants it is computed from means it is not a
# parameter but an activation (a walk to the graph input would cost the whole graph, per tensor).
MAX_CONSTANT_NODES = 64


def constant_ancestry(tensor: gs.Tensor) -> list[gs.Node] | None:
    """The nodes that compute `tensor` from constants alone, producers first; None if it reads a
    graph input or takes more than MAX_CONSTANT_NODES nodes."""
    producer = _producer(tensor)
    if producer is False:
        return None
    if producer is None:
        return []
    order: list[gs.Node] = []
    done: set[int] = set()
    stack = [(producer, iter(producer.inputs))]
    while stack:  # depth-first, a node after all its producers (no recursion: chains can be long)
        node, inputs = stack[-1]
        for t in inputs:
            child = _producer(t) if t is not None else None
            if child is False:
                return None
            if child is not None and id(child) not in done:
                if len(done) + len(stack) >= MAX_CONSTANT_NODES:
                    return None
                stack.append((child, iter(child.inputs)))
                break
        else:
            stack.pop()
            if id(node) not in done:
                done.add(id(node))
                order.append(node)
    return order


def _producer(tensor: gs.Tensor) -> gs.Node | None | bool:
    """The node making `tensor`; None for a constant or an empty input; False for a graph input."""
    if isinstance(tensor, gs.Constant) or tensor.name == "":
        return None
    return tensor.inputs[0] if len(tensor.inputs) == 1 else False


def evaluate_constant(ctx: CheckContext, tensor: gs.Tensor) -> np.ndarray | None:
    """The values of a constant-computed tensor, as onnxruntime (optimisations off) computes them;
    None (with a warning) when the tensor reads a graph input or onnxruntime cannot compute it."""
    from qdq.runtime import session  # imported here: linting never needs onnxruntime

    nodes = constant_ancestry(tensor)
    if nodes is None:
        return None
    constants = {id(t): t for n in nodes for t in n.inputs if isinstance(t, gs.Constant)}.values()
    graph = helper.make_graph(
        [OnnxExporter.export_node(n) for n in nodes], "constant", [],
        [helper.make_value_info(tensor.name, onnx.TypeProto())],
        [numpy_helper.from_array(np.asarray(ctx.model.constant_values(c)), c.name) for c in constants])
    proto = helper.make_model(graph, opset_imports=ctx.model.proto.opset_import, ir_version=ctx.model.proto.ir_version)
    proto.graph.output[0].CopyFrom(shape_inference.infer_shapes(proto).graph.output[0])
    try:
        return session(proto.SerializeToString()).run(None, {})[0]
    except Exception as exc:  # an op onnxruntime cannot run: the input stays, and the finding says it was not fixed
        first = (str(exc).strip().splitlines() or [""])[0]
        log.warning("%s: onnxruntime cannot compute it: %s", tensor.name, first)
        return None
