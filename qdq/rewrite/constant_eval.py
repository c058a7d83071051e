"""Values of tensors computed from constants alone, as onnxruntime computes them.

Folding a dequantized parameter to float (a bias, LayerNorm's scale, the weight of a GEMM the
target runs in float) must give the exact values the model computed, rounding and clipping
included: so the nodes that make the tensor run in onnxruntime. The one exception is the common
case, a DequantizeLinear of stored integers with float32 scales, whose arithmetic,
float32(q - zero_point) · scale, numpy reproduces bit for bit (a test checks it against
onnxruntime over the corpus): a model with thousands of them would otherwise build thousands
of sessions.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from qdq.graph import ir
from qdq.graph.write import node_proto
from qdq.rewrite.rule import CheckContext

log = logging.getLogger("qdq")


# More nodes than this between a tensor and the constants it is computed from means it is not a
# parameter but an activation (a walk to the graph input would cost the whole graph, per tensor).
MAX_CONSTANT_NODES = 64


def constant_ancestry(tensor: ir.Tensor, limit: int = MAX_CONSTANT_NODES) -> list[ir.Node] | None:
    """The nodes that compute `tensor` from constants alone, producers first; None if it reads a
    graph input or takes more than `limit` nodes."""
    producer = _producer(tensor)
    if producer is False:
        return None
    if producer is None:
        return []
    order: list[ir.Node] = []
    done: set[int] = set()
    stack = [(producer, iter(producer.inputs))]
    while stack:  # depth-first, a node after all its producers (no recursion: chains can be long)
        node, inputs = stack[-1]
        for t in inputs:
            child = _producer(t) if t is not None else None
            if child is False:
                return None
            if child is not None and id(child) not in done:
                if len(done) + len(stack) >= limit:
                    return None
                stack.append((child, iter(child.inputs)))
                break
        else:
            stack.pop()
            if id(node) not in done:
                done.add(id(node))
                order.append(node)
    return order


def _producer(tensor: ir.Tensor) -> ir.Node | None | bool:
    """The node making `tensor`; None for a constant or an empty input; False for a graph input."""
    if isinstance(tensor, ir.Constant) or tensor.name == "":
        return None
    return tensor.inputs[0] if len(tensor.inputs) == 1 else False


def evaluate_constant(ctx: CheckContext, tensor: ir.Tensor) -> np.ndarray | None:
    """The values of a constant-computed tensor, as onnxruntime (optimisations off) computes them;
    None (with a warning) when the tensor reads a graph input or onnxruntime cannot compute it."""
    nodes = constant_ancestry(tensor)
    if nodes is None:
        return None
    if len(nodes) == 1 and (values := dequantized_in_numpy(ctx, nodes[0])) is not None:
        return values
    return evaluate_in_onnxruntime(ctx, tensor, nodes)


def evaluate_in_onnxruntime(ctx: CheckContext, tensor: ir.Tensor, nodes: list[ir.Node]) -> np.ndarray | None:
    """`tensor` computed by running `nodes` (its constant ancestry) in onnxruntime, optimisations off."""
    from qdq.support.runtime import session  # imported here: linting never needs onnxruntime

    constants = {id(t): t for n in nodes for t in n.inputs if isinstance(t, ir.Constant)}.values()
    graph = helper.make_graph(
        [node_proto(n) for n in nodes], "constant", [],
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


def dequantized_in_numpy(ctx: CheckContext, node: ir.Node) -> np.ndarray | None:
    """What onnxruntime's DequantizeLinear makes of stored integers with float32 scales (per tensor
    or per axis), computed in numpy; None for anything else (blocked, float8, float16 scales...)."""
    if node.op != "DequantizeLinear" or node.domain not in (None, "", "ai.onnx") or node.attrs.get("block_size", 0):
        return None
    inputs = [t for t in node.inputs if t is not None and t.name != ""]
    if not all(isinstance(t, ir.Constant) for t in inputs):
        return None
    integers, scale, *rest = (np.asarray(ctx.model.constant_values(t)) for t in inputs)
    zero_point = rest[0] if rest else np.zeros((), dtype=integers.dtype)
    if integers.dtype not in _INTEGER_TYPES or zero_point.dtype != integers.dtype or scale.dtype != np.float32:
        return None
    if scale.size > 1:
        if scale.ndim != 1 or zero_point.size not in (1, scale.size) or integers.ndim == 0:
            return None
        axis = node.attrs.get("axis", 1) % integers.ndim
        if integers.shape[axis] != scale.size:
            return None
        shape = [1] * integers.ndim
        shape[axis] = scale.size
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape) if zero_point.size > 1 else zero_point
    difference = integers.astype(np.int64) - zero_point.astype(np.int64)
    return (difference.astype(np.float32) * scale).astype(np.float32)


_INTEGER_TYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32)}
