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


def constant_ancestry(tensor: gs.Tensor) -> list[gs.Node] | None:
    """The nodes that compute `tensor` from constants alone, producers first; None if it reads a graph input."""
    order: list[gs.Node] = []
    seen: set[int] = set()

    def visit(t: gs.Tensor) -> bool:
        if isinstance(t, gs.Constant) or t.name == "":
            return True
        if len(t.inputs) != 1:
            return False
        producer = t.inputs[0]
        if id(producer) in seen:
            return True
        seen.add(id(producer))
        if not all(visit(i) for i in producer.inputs if i is not None):
            return False
        order.append(producer)
        return True

    return order if visit(tensor) else None


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
