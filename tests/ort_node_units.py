"""An independent checker of onnxruntime CPU node units, for tests: what must hold so that
onnxruntime's QDQ selectors fuse each DQ → op → Q group into an integer kernel on x86.

It reads the ONNX protobuf with onnx and numpy only and shares no code with qdq, so a test that
runs `qdq fix --target ort` and then this checker does not grade qdq with its own helpers. The
rules are those of the onnxruntime catalogue (../shared/reference/onnxruntime-cpu-qdq.md §3-§4
and §8):

- every per-tensor Q/DQ has constant 0-d scale and zero-point ([1]-shaped ones make session
  creation fail once a group is fused, and keep a Relu from being absorbed);
- a node unit is an op with a QLinear replacement (§3.7) that reads a dequantized activation
  (a weight-only DQ is MatMulNBits' pattern, not a unit) and writes no graph output (a unit
  never does, so such an op is float by design: a model's interface is its own). Every input
  comes from a DQ (a Conv/Gemm float bias aside: WeightBiasQuantization quantizes it); every
  output edge goes to a Q, directly or through a Relu/Clip the Q makes redundant (a Relu only
  when the Q's zero-point is the type's minimum). MatMul's float output is allowed
  (MatMulIntegerToFloat);
- a Conv/Gemm unit's int32 bias is at input scale × weight scale, per output channel (measured
  with onnxruntime 1.31.1: a bias scale 1.5x off leaves the Conv float);
- the unit's activations are 8-bit (the QLinear kernels are 8-bit) and unsigned on x86, where
  int8 is not allowed: an int8 activation fuses only when onnxruntime's own s8 → u8 pass converts
  it, which it does only for a Q with one DQ that has one reader (§3.5);
- DequantizeLinear → op → QuantizeLinear around the data-movement ops that onnxruntime drops
  (DropQDQ: Reshape, Transpose, Squeeze, ...) uses equal parameters on both sides.

`check(model)` returns human-readable violation strings, each starting with a `[tag]`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QDQ = ("QuantizeLinear", "DequantizeLinear")
# Ops with a QLinear replacement (§3.7); Where and ArgMax are left out (rare, DQ-only).
UNIT_OPS = ("Conv", "Gemm", "MatMul", "Add", "Mul", "Concat", "AveragePool", "GlobalAveragePool", "LeakyRelu",
            "Sigmoid", "Softmax", "Split")
# Inputs onnxruntime quantizes itself when they are float (§3.4).
FLOAT_BIAS = {"Conv": 2, "Gemm": 2}
# Ops whose float output still runs on integers (MatMulIntegerToFloat).
FLOAT_OUTPUT_OK = ("MatMul",)
# DropQDQ (§4): DQ → op → Q becomes the op on integers when both sides have equal parameters.
DROP_QDQ = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather", "Flatten", "Expand", "Tile",
            "MaxPool", "Resize")
QMIN = {TensorProto.UINT8: 0, TensorProto.INT8: -128}
QMAX = {TensorProto.UINT8: 255, TensorProto.INT8: 127}


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                if name:
                    self.consumers[name].append(node)
        self.graph_outputs = {o.name for o in graph.output}
        self.labels = {id(n): n.name or f"{n.op_type}#{i}" for i, n in enumerate(graph.node)}

    def label(self, node: onnx.NodeProto) -> str:
        return self.labels[id(node)]

    def made_by(self, tensor: str, op: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == op else None

    def params(self, node: onnx.NodeProto) -> tuple[np.ndarray | None, np.ndarray | None, int | None]:
        """(scale, zero-point, integer type) of a Q/DQ; the type from the zero-point, else the default."""
        scale = self.constants.get(node.input[1]) if len(node.input) > 1 else None
        zp_name = node.input[2] if len(node.input) > 2 else ""
        zp = self.constants.get(zp_name) if zp_name else None
        if zp is not None:
            elem = helper.np_dtype_to_tensor_dtype(zp.dtype)
        elif node.op_type == "QuantizeLinear":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            elem = attrs.get("output_dtype") or TensorProto.UINT8
        else:
            source = self.constants.get(node.input[0])
            quantize = self.made_by(node.input[0], "QuantizeLinear")
            elem = helper.np_dtype_to_tensor_dtype(source.dtype) if source is not None else (
                self.params(quantize)[2] if quantize is not None else None)
        return scale, zp, elem

    def from_constant(self, dq: onnx.NodeProto) -> bool:
        """A DQ of stored integers (or of a Q of a constant): a weight or bias, not an activation.
        A Clip of constants counts as one (Brevitas's weights): onnxruntime's constant folding runs
        before its Q/DQ fusion."""
        quantize = self.made_by(dq.input[0], "QuantizeLinear")
        return self._constant(dq.input[0]) or (quantize is not None and quantize.input[0] in self.constants)

    def _constant(self, tensor: str) -> bool:
        clip = self.made_by(tensor, "Clip")
        return tensor in self.constants or (clip is not None and all(not t or self._constant(t) for t in clip.input))


def _name(elem: int | None) -> str:
    return TensorProto.DataType.Name(elem).lower() if elem is not None else "unknown"


def _check_qparams(g: _Graph, node: onnx.NodeProto) -> list[str]:
    scale, zp, _ = g.params(node)
    name = g.label(node)
    if scale is None or (len(node.input) > 2 and node.input[2] and zp is None):
        return [f"[constant] {name}: scale or zero-point is not a constant"]
    if scale.size == 1 and (scale.ndim != 0 or (zp is not None and zp.ndim != 0)):
        return [f"[scalar] {name}: per-tensor scale/zero-point of shape {list(scale.shape)}/"
                f"{list(zp.shape) if zp is not None else []}, onnxruntime needs 0-d"]
    return []


def _redundant_clip(g: _Graph, node: onnx.NodeProto, quantize: onnx.NodeProto) -> bool:
    """Whether the Q after a Relu/Clip already clips as it does (IsClipMadeRedundantByQ)."""
    scale, zp, elem = g.params(quantize)
    if scale is None or elem not in QMIN:
        return False
    zero = np.asarray(zp if zp is not None else 0).ravel()
    if node.op_type == "Relu":
        return zp is not None and zp.ndim == 0 and int(zero[0]) == QMIN[elem]
    low = g.constants.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    high = g.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if low is None or high is None:
        return False
    s, z = float(np.ravel(scale)[0]), int(zero[0])
    return float(low) <= (QMIN[elem] - z) * s and float(high) >= (QMAX[elem] - z) * s


def _output_quantizes(g: _Graph, node: onnx.NodeProto) -> tuple[list[onnx.NodeProto], list[str]]:
    """The Qs every output edge of the unit reaches (through an absorbed Relu/Clip), and what does not."""
    quantizes, problems = [], []
    for out in [o for o in node.output if o]:
        for consumer in g.consumers[out]:
            if consumer.op_type == "QuantizeLinear":
                quantizes.append(consumer)
                continue
            after = g.consumers[consumer.output[0]] if consumer.op_type in ("Relu", "Clip") else []
            if len(after) == 1 and after[0].op_type == "QuantizeLinear" and _redundant_clip(g, consumer, after[0]) \
                    and consumer.output[0] not in g.graph_outputs:
                quantizes.append(after[0])
            else:
                problems.append(f"{consumer.op_type} {g.label(consumer)} reads its output {out} as float")
    return quantizes, problems


def _fusable_type(g: _Graph, node: onnx.NodeProto, elem: int | None) -> str | None:
    """Why an activation Q/DQ of this type keeps its unit from an x86 QLinear kernel, or None."""
    if elem == TensorProto.UINT8:
        return None
    if elem == TensorProto.INT8:
        quantize = node if node.op_type == "QuantizeLinear" else g.made_by(node.input[0], "QuantizeLinear")
        readers = g.consumers[quantize.output[0]] if quantize is not None else []
        single = len(readers) == 1 and readers[0].op_type == "DequantizeLinear" \
            and len(g.consumers[readers[0].output[0]]) == 1
        return None if single else "int8 with several readers (onnxruntime's s8 → u8 pass leaves it int8)"
    return f"{_name(elem)} (the QLinear kernels are 8-bit)"


def _check_unit(g: _Graph, node: onnx.NodeProto) -> list[str]:
    name, op = g.label(node), node.op_type
    dqs = [g.made_by(t, "DequantizeLinear") if t else None for t in node.input]
    if not any(dq is not None and not g.from_constant(dq) for dq in dqs):
        return []  # a float op, or weight-only quantization: no node unit to fuse
    if any(o in g.graph_outputs for o in node.output):
        return []  # float by design: a unit never writes a graph output
    found = []
    for slot, (tensor, dq) in enumerate(zip(node.input, dqs)):
        if tensor and dq is None and FLOAT_BIAS.get(op) != slot:
            found.append(f"[unit-input] {name} ({op}): input {tensor} is not dequantized")
    if FLOAT_BIAS.get(op) is not None and len(dqs) > 2 and None not in dqs[:3]:
        found += _bias_scale(g, name, op, dqs[0], dqs[1], dqs[2])
    quantizes, problems = _output_quantizes(g, node)
    if op not in FLOAT_OUTPUT_OK:
        found += [f"[unit-output] {name} ({op}): {p}" for p in problems]
    activations = [dq for dq in dqs if dq is not None and not g.from_constant(dq)] + quantizes
    for qdq in activations:
        why = _fusable_type(g, qdq, g.params(qdq)[2])
        if why is not None:
            found.append(f"[unit-type] {name} ({op}): {g.label(qdq)} is {why}")
    return found


def _bias_scale(g: _Graph, name: str, op: str, data, weight, bias) -> list[str]:
    (s_in, _, _), (s_w, _, _), (s_b, _, b_type) = g.params(data), g.params(weight), g.params(bias)
    if b_type != TensorProto.INT32 or s_in is None or s_w is None or s_b is None:
        return []
    expected = np.float32(np.ravel(s_in)[0]) * np.ravel(s_w).astype(np.float32)
    actual = np.ravel(s_b).astype(np.float32)
    if actual.size in (1, expected.size) and np.allclose(actual, expected, rtol=1e-5, atol=0):
        return []
    return [f"[bias-scale] {name} ({op}): int32 bias scale {actual[:3]} is not input × weight scale {expected[:3]}"]


def _check_drop(g: _Graph, node: onnx.NodeProto) -> list[str]:
    dq = g.made_by(node.input[0], "DequantizeLinear") if node.input else None
    if dq is None or not node.output:
        return []
    before = g.params(dq)
    found = []
    for q in (c for c in g.consumers[node.output[0]] if c.op_type == "QuantizeLinear"):
        after = g.params(q)
        same = before[0] is not None and after[0] is not None and np.array_equal(np.ravel(before[0]), np.ravel(after[0])) \
            and np.array_equal(np.ravel(before[1] if before[1] is not None else 0),
                               np.ravel(after[1] if after[1] is not None else 0)) and before[2] == after[2]
        if not same:
            found.append(f"[drop-qdq] {g.label(node)} ({node.op_type}): DQ {g.label(dq)} and Q {g.label(q)} differ")
    return found


def check(model: onnx.ModelProto | str | Path) -> list[str]:
    """Every node-unit condition the model breaks, as `[tag] node: detail` strings (empty when clean)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    g = _Graph(model)
    found: list[str] = []
    for node in g.nodes:
        if node.op_type in QDQ:
            found += _check_qparams(g, node)
        elif node.op_type in UNIT_OPS:
            found += _check_unit(g, node)
        elif node.op_type in DROP_QDQ:
            found += _check_drop(g, node)
    return found


def tags(violations: list[str]) -> set[str]:
    """The `[tag]`s of a list of violations."""
    return {v[1:v.index("]")] for v in violations}
