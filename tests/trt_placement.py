"""An independent check of TensorRT-friendly Q/DQ placement, written from NVIDIA's rules, not from
qdq's rule code: what the trt tests and the conformance run assert after `qdq fix --target trt`.

It reads the ONNX graph with plain onnx protobuf (no qdq import) so that a bug in qdq's graph
helpers cannot hide a bug in its rules. The rules are those of the TensorRT catalogue
(../shared/reference/tensorrt-qdq.md §1, §3, §6.2 and §14):

- Q/DQ types TensorRT parses: int8, and float8 e4m3, with zero-point 0; int4 only on weights
  (weight-only); per-axis scales only on constant (weight) paths, along the output channels
  (Conv axis 0, ConvTranspose 1 or, before TensorRT 10.2, 0; Gemm 0 with transB, else 1);
- a Concat's quantized inputs and output share one scale, as do the DQ before and the Q after an
  op that commutes with them (MaxPool and data movement), and every Q reading a MaxPool's input
  (the SPP fan-out) with the Q after it (NVIDIA's yolov7 rules);
- biases are float constants (TensorRT quantizes them itself);
- a quantized conv feeding an Add (directly, or through its activation) has a dequantized
  residual input; no Q/DQ between a conv and its Add (ModelOpt's mode) or its activation; after
  an activation, two dequantized inputs share one scale (NVIDIA's yolov7 rules).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# The integer types TensorRT's DequantizeLinear takes (§14 "Formats"): int4 is weight-only.
ACTIVATION_TYPES = {"int8", "float8_e4m3fn"}
WEIGHT_ONLY_TYPES = {"int4"}
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
        # What TensorRT folds into a constant when it builds: a constant, or a non-Q/DQ op of constants only
        # (PaddlePaddle's conv bias Reshape(Constant, Constant)); Q/DQ of constants stay, as weights.
        self.folded = set(self.constants)
        for node in model.graph.node:
            inputs = [name for name in node.input if name]
            if inputs and node.op_type not in ("QuantizeLinear", "DequantizeLinear") \
                    and all(name in self.folded for name in inputs):
                self.folded.update(node.output)
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
            # int8 or float8 with zero-point 0, int4 on weights only (an int32 Q/DQ could only be a
            # bias, and biases must be float).
            types = ACTIVATION_TYPES | (WEIGHT_ONLY_TYPES if g.from_constant(node) else set())
            if np.any(zero_point.astype(np.float64) != 0) or str(zero_point.dtype) not in types:
                problems.append(f"{node.name}: zero-point {zero_point.ravel()[:3]} of {zero_point.dtype}, "
                                f"TensorRT needs {' or '.join(sorted(types))} with 0")
            if scale.size > 1 and not g.from_constant(node):
                problems.append(f"{node.name}: per-axis scale on an activation")
            elif scale.size > 1 and node.op_type == "DequantizeLinear":
                problems += _weight_axis_problems(g, node)
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
            if node.op_type == "MaxPool" and after:
                source = _skip_qdq(g, node.input[0])[0]
                siblings = g.quantized_outputs(source) + g.quantized_outputs(node.input[0])
                if len({float(p[0].ravel()[0]) for p in after + siblings}) > 1:
                    problems.append(f"{node.name}: the Qs reading the MaxPool's input and the Q after it differ")
        elif node.op_type == "Add":
            problems += _residual_problems(g, node)
        if g.dequantized_bias(node):
            problems.append(f"{node.name}: dequantized bias; TensorRT's parser needs a float constant")
    return problems + conv_activation_qdq(model) + activated_residual_problems(model)


def activated_residual_problems(model: onnx.ModelProto) -> list[str]:
    """Adds after a quantized conv's activation: the residual dequantized (§14), on the other input's
    scale when both are dequantized."""
    g = Graph(model)
    problems = []
    for name, mode in residual_modes(model).items():
        add = next(n for n in g.graph.node if n.name == name)
        if mode == "different-scales":
            problems.append(f"{name}: both inputs dequantized with different scales")
        elif mode == "float-residual":
            problems.append(f"{name}: the activated conv input is dequantized but the residual is float")
        elif mode == "float" and any(_quantized_conv_activation(g, _skip_qdq(g, t)[0]) for t in add.input):
            problems.append(f"{name}: residual input of a quantized conv's activation is not dequantized")
    return problems


def _quantized_conv_activation(g: Graph, tensor: str) -> bool:
    """Whether `tensor` is an activation of a conv that reads a DQ (an INT8 conv)."""
    if not _activated_conv(g, tensor):
        return False
    node = g.producer[tensor]
    x = node.input[0] if node.op_type != "Mul" else _silu_input(g, node)
    conv = g.producer.get(_skip_qdq(g, x)[0])
    while conv is not None and conv.op_type == "BatchNormalization":
        conv = g.producer.get(conv.input[0])
    return conv is not None and g.made_by(conv.input[0], "DequantizeLinear") is not None


def _weight_axis_problems(g: Graph, dq: onnx.NodeProto) -> list[str]:
    """A per-axis weight DQ must run along the output channels of each op it feeds as a weight."""
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    problems = []
    for reader in g.consumers.get(dq.output[0], []):
        if len(reader.input) < 2 or reader.input[1] != dq.output[0]:
            continue
        trans_b = next((a.i for a in reader.attribute if a.name == "transB"), 0)
        allowed = {"Conv": {0}, "ConvTranspose": {0, 1}, "Gemm": {0 if trans_b else 1}}.get(reader.op_type)
        if allowed is not None and axis not in allowed:
            problems.append(f"{dq.name}: per-channel weight axis {axis} for {reader.op_type} {reader.name}, "
                            f"TensorRT needs {sorted(allowed)}")
    return problems


def _residual_problems(g: Graph, add: onnx.NodeProto) -> list[str]:
    """A conv-fed Add: its conv side straight from the Conv, its other side from a DQ.

    An Add of a constant (hard-swish's x + 3) has no residual: the catalogue's residual detection
    takes only Adds without constant or graph inputs."""
    if any(t in g.folded for t in add.input):
        return []
    sides = []
    for tensor in add.input:
        node, through_qdq = g.producer.get(tensor), False
        if node is not None and node.op_type == "DequantizeLinear":
            q = g.made_by(node.input[0], "QuantizeLinear")
            node, through_qdq = (g.producer.get(q.input[0]) if q is not None else None), True
        while node is not None and node.op_type == "BatchNormalization":
            node = g.producer.get(node.input[0])
        # TensorRT fuses the Add only into a conv whose output feeds nothing else, through a Q/DQ too.
        single = node is not None and len(g.consumers.get(node.output[0], [])) == 1 \
            and len(g.consumers.get(tensor, [])) == 1
        # A float conv runs in float whatever its residual: the rule is for INT8 convs.
        conv = node is not None and node.op_type == "Conv" and single
        quantized = conv and g.made_by(node.input[0], "DequantizeLinear") is not None
        sides.append((quantized, through_qdq, tensor))
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


# Activations TensorRT fuses into the conv before them (SiLU is Sigmoid + Mul, recognised below).
ACTIVATIONS = {"Relu", "LeakyRelu", "Clip", "Sigmoid"}


def _skip_qdq(g: Graph, tensor: str) -> tuple[str, bool]:
    """The tensor a Q→DQ pair making `tensor` reads, and whether there was one."""
    dq = g.made_by(tensor, "DequantizeLinear")
    q = g.made_by(dq.input[0], "QuantizeLinear") if dq is not None else None
    return (q.input[0], True) if q is not None else (tensor, False)


def _conv_output(g: Graph, tensor: str) -> bool:
    """Whether `tensor` is a Conv's output, through BatchNormalization."""
    node = g.producer.get(tensor)
    while node is not None and node.op_type == "BatchNormalization":
        node = g.producer.get(node.input[0])
    return node is not None and node.op_type in ("Conv", "ConvTranspose")


def conv_activation_qdq(model: onnx.ModelProto) -> list[str]:
    """Activations reading a Conv (or its BN) output through a Q/DQ: TensorRT cannot fuse them into the conv."""
    g = Graph(model)
    found = []
    for node in g.graph.node:
        if node.op_type in ACTIVATIONS or (node.op_type == "Mul" and _silu_input(g, node) is not None):
            before, through = _skip_qdq(g, node.input[0] if node.op_type != "Mul" else _silu_input(g, node))
            if through and _conv_output(g, before):
                found.append(f"{node.name}: a Q/DQ between the conv making {before} and this {node.op_type}")
    return found


def _silu_input(g: Graph, mul: onnx.NodeProto) -> str | None:
    """The x of a SiLU's Mul(x, Sigmoid(x)) (each side possibly through a Q/DQ), else None."""
    for a, b in (mul.input, mul.input[::-1]):
        sigmoid = g.made_by(_skip_qdq(g, b)[0], "Sigmoid")
        if sigmoid is not None and _skip_qdq(g, sigmoid.input[0])[0] == _skip_qdq(g, a)[0]:
            return a
    return None


def _activated_conv(g: Graph, tensor: str) -> bool:
    """Whether `tensor` is an activation (Relu, LeakyRelu, Clip, SiLU) of a Conv (or its BN) output."""
    node = g.producer.get(tensor)
    if node is None:
        return False
    if node.op_type in ("Relu", "LeakyRelu", "Clip"):
        return _conv_output(g, _skip_qdq(g, node.input[0])[0])
    x = _silu_input(g, node) if node.op_type == "Mul" else None
    return x is not None and _conv_output(g, _skip_qdq(g, x)[0])


def _dequantized(g: Graph, tensor: str):
    """(scale, zero-point) of the DQ making `tensor`; its input names when they are not constants."""
    dq = g.made_by(tensor, "DequantizeLinear")
    if dq is None:
        return None
    try:
        return g.params(dq)
    except KeyError:
        return tuple(np.array(name) for name in dq.input[1:3])


def _only_for(g: Graph, tensor: str) -> bool:
    """Whether `tensor` (and through a Q/DQ, the Q's input and output) has one consumer: a branch, not a shared input."""
    before, through = _skip_qdq(g, tensor)
    path = {tensor, before, g.producer[tensor].input[0]} if through else {tensor}
    return all(len(g.consumers.get(t, [])) == 1 for t in path)


def residual_modes(model: onnx.ModelProto) -> dict[str, str]:
    """How each Add with an activated conv input is quantized.

    "float-branch": the activated conv input is float and the other input is dequantized (ModelOpt);
    "shared": both inputs dequantized with one scale and zero-point (NVIDIA's yolov7 QAT rules);
    otherwise "different-scales", "float-residual" or "float" (neither input dequantized).
    """
    g = Graph(model)
    modes = {}
    for add in g.graph.node:
        if add.op_type != "Add" or len(add.input) != 2 or any(t in g.folded for t in add.input):
            continue
        sides = [(_activated_conv(g, _skip_qdq(g, t)[0]) and _only_for(g, t), _dequantized(g, t)) for t in add.input]
        if not any(activated for activated, _ in sides):
            continue
        params = [p for _, p in sides]
        if all(p is not None for p in params):
            same = all(np.array_equal(a, b) for a, b in zip(params[0], params[1]))
            modes[add.name] = "shared" if same else "different-scales"
        elif any(activated and p is None for activated, p in sides) and any(p is not None for p in params):
            modes[add.name] = "float-branch"
        elif any(p is not None for p in params):
            modes[add.name] = "float-residual"
        else:
            modes[add.name] = "float"
    return modes
