"""An independent check of TensorRT-friendly Q/DQ placement, written from NVIDIA's rules, not from
qdq's rule code: what the trt tests assert after `qdq fix --target trt`.

It reads the ONNX graph with plain onnx protobuf (no qdq import) so that a bug in qdq's graph
helpers cannot hide a bug in its rules.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# Ops TensorRT moves Q/DQ through (MaxPool and data movement).
COMMUTING = {"MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Pad", "Resize"}
# The bias input of the ops that have one: TensorRT takes it as a float constant and quantizes it itself.
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


class Graph:
    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def made_by(self, tensor: str, op: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == op else None

    def params(self, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray]:
        scale = self.constants[node.input[1]]
        zero_point = self.constants[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros(1, np.int8)
        return scale, zero_point

    def from_constant(self, node: onnx.NodeProto) -> bool:
        """Whether a Q/DQ handles a weight: its data is a constant, or a Q of a constant made it."""
        data = node.input[0]
        quantize = self.made_by(data, "QuantizeLinear")
        return data in self.constants or (quantize is not None and quantize.input[0] in self.constants)

    def dequantized_bias(self, node: onnx.NodeProto) -> bool:
        """Whether the node's bias input is made by a DQ (through Identity or Cast)."""
        slot = BIAS_INPUT.get(node.op_type)
        if slot is None or len(node.input) <= slot or not node.input[slot]:
            return False
        producer = self.producer.get(node.input[slot])
        while producer is not None and producer.op_type in ("Identity", "Cast"):
            producer = self.producer.get(producer.input[0])
        return producer is not None and producer.op_type == "DequantizeLinear"

    def dequantized_params(self, tensor: str):
        """(scale, zero-point) of the DQ making `tensor`, else None."""
        dq = self.made_by(tensor, "DequantizeLinear")
        return self.params(dq) if dq is not None else None

    def quantized_outputs(self, tensor: str) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.params(c) for c in self.consumers.get(tensor, []) if c.op_type == "QuantizeLinear"]


def violations(model: onnx.ModelProto) -> list[str]:
    """Everything in the model that breaks the TensorRT placement rules this module checks."""
    g = Graph(model)
    problems: list[str] = []
    for node in g.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale, zero_point = g.params(node)
            # int8 with zero-point 0 (an int32 Q/DQ could only be a bias, and biases must be float).
            if np.any(zero_point != 0) or zero_point.dtype != np.int8:
                problems.append(f"{node.name}: zero-point {zero_point.ravel()[:3]} of {zero_point.dtype}, TensorRT needs int8 0")
            if scale.size > 1 and not g.from_constant(node):
                problems.append(f"{node.name}: per-axis scale on an activation")
        elif node.op_type == "Concat":
            inputs = [g.dequantized_params(t) for t in node.input]
            outputs = g.quantized_outputs(node.output[0])
            scales = {float(p[0].ravel()[0]) for p in inputs + outputs if p is not None}
            if len(scales) > 1:
                problems.append(f"{node.name}: Concat inputs and output use {len(scales)} different scales")
        elif node.op_type in COMMUTING:
            before, after = g.dequantized_params(node.input[0]), g.quantized_outputs(node.output[0])
            if before is not None and any(float(p[0].ravel()[0]) != float(before[0].ravel()[0]) for p in after):
                problems.append(f"{node.name}: {node.op_type} output Q differs from its input DQ")
        elif node.op_type == "Add":
            problems += _residual_problems(g, node)
        if g.dequantized_bias(node):
            problems.append(f"{node.name}: dequantized bias; TensorRT's parser needs a float constant")
    return problems


def _residual_problems(g: Graph, add: onnx.NodeProto) -> list[str]:
    """A conv-fed Add: its conv side straight from the Conv, its other side from a DQ."""
    sides = []
    for tensor in add.input:
        node, through_qdq = g.producer.get(tensor), False
        if node is not None and node.op_type == "DequantizeLinear":
            q = g.made_by(node.input[0], "QuantizeLinear")
            node, through_qdq = (g.producer.get(q.input[0]) if q is not None else None), True
        while node is not None and node.op_type == "BatchNormalization":
            node = g.producer.get(node.input[0])
        single = node is not None and len(g.consumers.get(node.output[0], [])) == 1
        sides.append((node is not None and node.op_type == "Conv" and single, through_qdq, tensor))
    conv_sides = [s for s in sides if s[0]]
    if not conv_sides:
        return []
    problems = []
    if all(s[1] for s in conv_sides):
        problems.append(f"{add.name}: a Q/DQ sits between every conv input and the Add")
    others = [s for s in sides if not (s[0] and not s[1])]
    if len(others) == 2:  # both inputs are convs without Q/DQ: one of them must be the quantized residual
        others = others[1:]
    for _, _, tensor in others:
        if g.dequantized_params(tensor) is None:
            problems.append(f"{add.name}: residual input {tensor} is not dequantized")
    return problems
