"""An independent checker of the AMD NPU (XINT8, power-of-two) constraints, for tests.

It reads the ONNX protobuf directly, with onnx and numpy only, and shares no code with qdq's
rules (qdq/checks, qdq/quant/operands.py, qdq/quant/index.py), so a test that runs `qdq fix` and then this
checker is not grading qdq with its own arithmetic. The rules and bounds are those of the NPU
catalogue (../shared/reference/npu-pow2-constraints.md, sections 1 and 5):

- every QuantizeLinear/DequantizeLinear: constant per-tensor scale that is an exact power of two
  (`np.frexp` mantissa 0.5), int8 with zero-point 0 or uint8 with 128 (int32 with 0 for biases);
  the DQs reading a Q's output use the Q's scale and zero-point;
- Concat: every input pos == output pos;
- MaxPool, AveragePool, GlobalAveragePool, Pad, Slice, Resize, Reshape, Transpose, Squeeze,
  Unsqueeze, Flatten: input pos == output pos;
- Add/Sub: `max(ipos) - min(ipos) <= 7`, `min(ipos) - opos` in [-7, 25];
- Mul whose inputs all come from DQs: `sum(ipos) - opos` in [0, 32];
- Conv, Gemm, ConvTranspose, MatMul: `shift_cut = wpos + ipos - opos` in [0, 16];
- int8 bias: `shift_bias = wpos + ipos - bpos` in [min(0, sc - 16), 15], lower bound 0 when the op
  feeds a LeakyRelu (directly, or through one Q→DQ pair); int32 bias: `bpos == ipos + wpos`;
- HardSigmoid with alpha 1/6 and beta 0.5: ipos in [0, 15], opos >= 7, `14 + ipos - opos` in [0, 31];
- the swish Mul x·HardSigmoid(x): `ipos0 + ipos1 - opos` in [0, 15];
- LeakyRelu: alpha a multiple of 1/256, the slope the DPU computes (section 7).

`pos = -log2(scale)`. An op's input pos is read from the DequantizeLinear producing the input; its
output pos from the QuantizeLinear reading its output, or (when there is none) after a single
following Relu/Clip/LeakyRelu/PRelu, or after the DPU Mul that follows AvgPool/GAP/HardSigmoid.
Relations whose operands are not all known power-of-two positions are skipped: the per-Q/DQ
checks already report those values.

`check(model)` returns human-readable violation strings, each starting with a `[tag]`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QDQ = ("QuantizeLinear", "DequantizeLinear")
SAME_POS_OPS = (
    "MaxPool", "AveragePool", "GlobalAveragePool", "Pad", "Slice", "Resize", "Reshape", "Transpose",
    "Squeeze", "Unsqueeze", "Flatten",
)
WEIGHTED_OPS = ("Conv", "Gemm", "ConvTranspose", "MatMul")
BIASED_OPS = ("Conv", "Gemm", "ConvTranspose")
OUTPUT_THROUGH = ("Relu", "Clip", "LeakyRelu", "PRelu")
OUTPUT_THROUGH_MUL = ("AveragePool", "GlobalAveragePool", "HardSigmoid")

ADD_MAX_GAP = 7
ADD_WRITE = (-7, 25)
MUL_WRITE = (0, 32)
SHIFT_CUT = (0, 16)
SHIFT_BIAS_MAX = 15
ACCUMULATOR_BITS, OUTPUT_BITS = 24, 8
HSIG_INPUT = (0, 15)
HSIG_OUTPUT_MIN = 7
HSIG_OFFSET, HSIG_SHIFT_MAX = 14, 31
SWISH = (0, 15)
LEAKY_RELU_DENOMINATOR = 256


def pos_of_scale(scale: np.ndarray | float | None) -> int | None:
    """`-log2(scale)` when the scale is one finite positive exact power of two, else None."""
    if scale is None:
        return None
    values = np.asarray(scale, dtype=np.float64).ravel()
    if values.size != 1 or not np.isfinite(values[0]) or values[0] <= 0:
        return None
    mantissa, exponent = np.frexp(values[0])
    if mantissa != 0.5:
        return None
    return int(1 - exponent)  # scale = 0.5 * 2^e = 2^(e-1)


def _dtype_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type).lower()


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.inits = {t.name: t for t in graph.initializer}
        self.producer = {out: n for n in graph.node for out in n.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in set(node.input):
                if name:
                    self.consumers[name].append(node)
        self.graph_outputs = {o.name for o in graph.output}
        self.types: dict[str, int] = {}
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.type.HasField("tensor_type"):
                self.types[value.name] = value.type.tensor_type.elem_type
        for name, tensor in self.inits.items():
            self.types[name] = tensor.data_type
        self.labels = {id(n): n.name or f"{n.op_type}#{i}" for i, n in enumerate(graph.node)}

    def label(self, node: onnx.NodeProto) -> str:
        return self.labels[id(node)]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant node, through Identity chains; None if computed."""
        seen = 0
        while name not in self.inits:
            node = self.producer.get(name)
            if node is None or seen > 100:
                return None
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value":
                        return numpy_helper.to_array(attr.t)
                return None
            if node.op_type != "Identity":
                return None
            name, seen = node.input[0], seen + 1
        return numpy_helper.to_array(self.inits[name])

    def qparams(self, node: onnx.NodeProto) -> tuple[np.ndarray | None, np.ndarray | None, int | None]:
        """(scale, zero-point or None, integer element type) of a Q or DQ."""
        scale = self.constant(node.input[1]) if len(node.input) > 1 else None
        zp_name = node.input[2] if len(node.input) > 2 else ""
        zp = self.constant(zp_name) if zp_name else None
        if zp is not None:
            elem = helper.np_dtype_to_tensor_dtype(zp.dtype)
        elif node.op_type == "QuantizeLinear":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            elem = attrs.get("output_dtype") or TensorProto.UINT8
        else:
            elem = self._integer_type(node.input[0])
        return scale, zp, elem

    def _integer_type(self, name: str) -> int | None:
        if name in self.types:
            return self.types[name]
        producer = self.producer.get(name)
        if producer is not None and producer.op_type == "QuantizeLinear":
            return self.qparams(producer)[2]
        value = self.constant(name)
        return helper.np_dtype_to_tensor_dtype(value.dtype) if value is not None else None

    def qdq_pos(self, node: onnx.NodeProto) -> int | None:
        return pos_of_scale(self.qparams(node)[0])

    def input_dq(self, node: onnx.NodeProto, i: int) -> onnx.NodeProto | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        producer = self.producer.get(node.input[i])
        return producer if producer is not None and producer.op_type == "DequantizeLinear" else None

    def input_pos(self, node: onnx.NodeProto, i: int) -> int | None:
        dq = self.input_dq(node, i)
        return self.qdq_pos(dq) if dq is not None else None

    def output_positions(self, node: onnx.NodeProto) -> list[int]:
        """The distinct known positions of the Q(s) the NPU reads `node`'s output from."""
        if not node.output or not node.output[0]:
            return []
        out = node.output[0]
        quantizes = [c for c in self.consumers[out] if c.op_type == "QuantizeLinear" and c.input[0] == out]
        if quantizes:
            return sorted({p for p in (self.qdq_pos(q) for q in quantizes) if p is not None})
        consumers = self.consumers[out]
        if len(consumers) == 1 and out not in self.graph_outputs:
            follow = consumers[0]
            if follow.op_type in OUTPUT_THROUGH or (follow.op_type == "Mul" and node.op_type in OUTPUT_THROUGH_MUL):
                return self._direct_q_positions(follow)
        return []

    def _direct_q_positions(self, node: onnx.NodeProto) -> list[int]:
        if not node.output:
            return []
        out = node.output[0]
        quantizes = [c for c in self.consumers[out] if c.op_type == "QuantizeLinear" and c.input[0] == out]
        return sorted({p for p in (self.qdq_pos(q) for q in quantizes) if p is not None})

    def float_source(self, name: str) -> str:
        """The float tensor a value was quantized from (back through DQ and its Q), else the name itself."""
        producer = self.producer.get(name)
        if producer is None or producer.op_type != "DequantizeLinear":
            return name
        integer = producer.input[0]
        q = self.producer.get(integer)
        return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else integer

    def feeds_leaky_relu(self, node: onnx.NodeProto) -> bool:
        if not node.output:
            return False
        for consumer in self.consumers[node.output[0]]:
            if consumer.op_type == "LeakyRelu":
                return True
            if consumer.op_type == "QuantizeLinear":
                for dq in self.consumers[consumer.output[0]]:
                    if dq.op_type == "DequantizeLinear" and any(
                        c.op_type == "LeakyRelu" for c in self.consumers[dq.output[0]]
                    ):
                        return True
        return False


def _qualifying_hard_sigmoid(node: onnx.NodeProto | None) -> bool:
    if node is None or node.op_type != "HardSigmoid":
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return abs(float(attrs.get("alpha", 0.2)) - 1 / 6) < 1e-6 and abs(float(attrs.get("beta", 0.5)) - 0.5) < 1e-6


def _is_swish(g: _Graph, mul: onnx.NodeProto) -> bool:
    if len(mul.input) != 2:
        return False
    sources = [g.float_source(name) for name in mul.input]
    for this, other in (sources, sources[::-1]):
        producer = g.producer.get(this)
        if _qualifying_hard_sigmoid(producer) and g.float_source(producer.input[0]) == other:
            return True
    return False


def _check_qdq(g: _Graph, node: onnx.NodeProto) -> list[str]:
    name = g.label(node)
    scale, zp, elem = g.qparams(node)
    found = []
    if scale is None:
        return [f"[scale] {name}: the scale is not a constant"]
    flat = np.asarray(scale, dtype=np.float64).ravel()
    if flat.size != 1:
        found.append(f"[per-tensor] {name}: {flat.size} scales (per-axis); the NPU needs one")
    elif pos_of_scale(flat) is None:
        found.append(f"[pow2] {name}: scale {flat[0]!r} is not an exact power of two")
    zps = np.zeros(1) if zp is None else np.asarray(zp, dtype=np.float64).ravel()
    if elem == TensorProto.INT8:
        if np.any(zps != 0):
            found.append(f"[zero-point] {name}: int8 zero-point {sorted(set(zps.tolist()))}, must be 0")
    elif elem == TensorProto.UINT8:
        if np.any(zps != 128):
            found.append(f"[zero-point] {name}: uint8 zero-point {sorted(set(zps.tolist()))}, must be 128")
    elif elem == TensorProto.INT32 and node.op_type == "DequantizeLinear":
        if np.any(zps != 0):
            found.append(f"[zero-point] {name}: int32 zero-point {sorted(set(zps.tolist()))}, must be 0")
    else:
        label = _dtype_name(elem) if elem is not None else "unknown"
        found.append(f"[type] {name}: quantized type {label}; the NPU takes int8 (uint8 with 128, int32 biases)")
    if node.op_type == "QuantizeLinear":
        for dq in g.consumers[node.output[0]]:
            if dq.op_type != "DequantizeLinear" or dq.input[0] != node.output[0]:
                continue
            d_scale, d_zp, d_elem = g.qparams(dq)
            d_zps = np.zeros(1) if d_zp is None else np.asarray(d_zp, dtype=np.float64).ravel()
            same_scale = d_scale is not None and np.array_equal(np.asarray(d_scale, np.float64).ravel(), flat)
            if not same_scale or not np.array_equal(d_zps, zps) or d_elem != elem:
                found.append(f"[qdq-agree] {name} and {g.label(dq)}: Q and DQ of one tensor have different parameters")
    return found


def _within(value: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= value <= bounds[1]


def _check_op(g: _Graph, node: onnx.NodeProto) -> list[str]:
    op, name = node.op_type, g.label(node)
    found: list[str] = []
    if op == "Concat":
        ipos = [g.input_pos(node, i) for i in range(len(node.input))]
        positions = {p for p in ipos if p is not None} | set(g.output_positions(node))
        if len(positions) > 1:
            found.append(f"[concat] {name}: input positions {ipos}, output {g.output_positions(node)} differ")
    elif op in SAME_POS_OPS:
        ipos = g.input_pos(node, 0)
        for opos in g.output_positions(node):
            if ipos is not None and ipos != opos:
                found.append(f"[in-out] {name} ({op}): input pos {ipos} != output pos {opos}")
    elif op in ("Add", "Sub"):
        ipos = [g.input_pos(node, i) for i in range(len(node.input))]
        if ipos and None not in ipos:
            if max(ipos) - min(ipos) > ADD_MAX_GAP:
                gap = max(ipos) - min(ipos)
                found.append(f"[shift-read] {name}: input positions {ipos}, gap {gap} > {ADD_MAX_GAP}")
            for opos in g.output_positions(node):
                if not _within(min(ipos) - opos, ADD_WRITE):
                    found.append(f"[shift-write-add] {name}: min(ipos) {min(ipos)} - opos {opos} = "
                                 f"{min(ipos) - opos} outside {list(ADD_WRITE)}")
    elif op == "Mul":
        dqs = [g.input_dq(node, i) for i in range(len(node.input))]
        ipos = [g.input_pos(node, i) for i in range(len(node.input))]
        if dqs and None not in dqs and None not in ipos:
            swish = _is_swish(g, node)
            for opos in g.output_positions(node):
                shift = sum(ipos) - opos
                if not _within(shift, MUL_WRITE):
                    found.append(f"[shift-write-mul] {name}: sum(ipos) {sum(ipos)} - opos {opos} = {shift} "
                                 f"outside {list(MUL_WRITE)}")
                if swish and not _within(shift, SWISH):
                    found.append(f"[swish] {name}: ipos0 + ipos1 - opos = {shift} outside {list(SWISH)}")
    elif op in WEIGHTED_OPS:
        ipos, wpos = g.input_pos(node, 0), g.input_pos(node, 1)
        opos_list = g.output_positions(node)
        cuts = []
        if ipos is not None and wpos is not None:
            for opos in opos_list:
                sc = wpos + ipos - opos
                cuts.append(sc)
                if not _within(sc, SHIFT_CUT):
                    found.append(f"[shift-cut] {name}: wpos {wpos} + ipos {ipos} - opos {opos} = {sc} "
                                 f"outside {list(SHIFT_CUT)}")
        bias_dq = g.input_dq(node, 2) if op in BIASED_OPS else None
        if bias_dq is not None and ipos is not None and wpos is not None:
            bpos = g.qdq_pos(bias_dq)
            elem = g.qparams(bias_dq)[2]
            if bpos is not None and elem == TensorProto.INT32 and bpos != ipos + wpos:
                found.append(f"[bias-int32] {name}: int32 bias pos {bpos} != ipos {ipos} + wpos {wpos}")
            elif bpos is not None and elem == TensorProto.INT8:
                sb = wpos + ipos - bpos
                if sb > SHIFT_BIAS_MAX:
                    found.append(f"[shift-bias] {name}: shift_bias {sb} > {SHIFT_BIAS_MAX}")
                for sc in cuts:
                    low = 0 if g.feeds_leaky_relu(node) else min(0, sc + OUTPUT_BITS - ACCUMULATOR_BITS)
                    if sb < low:
                        found.append(f"[shift-bias] {name}: shift_bias {sb} < {low} (shift_cut {sc})")
    elif op == "LeakyRelu":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        steps = float(attrs.get("alpha", 0.01)) * LEAKY_RELU_DENOMINATOR
        if steps != round(steps):
            found.append(f"[leaky-relu] {name}: alpha {attrs.get('alpha', 0.01)!r} is not a multiple of "
                         f"1/{LEAKY_RELU_DENOMINATOR}, the DPU's slope")
    elif op == "HardSigmoid" and _qualifying_hard_sigmoid(node):
        ipos = g.input_pos(node, 0)
        if ipos is not None and not _within(ipos, HSIG_INPUT):
            found.append(f"[hard-sigmoid] {name}: input pos {ipos} outside {list(HSIG_INPUT)}")
        for opos in g.output_positions(node):
            if opos < HSIG_OUTPUT_MIN:
                found.append(f"[hard-sigmoid] {name}: output pos {opos} < {HSIG_OUTPUT_MIN}")
            if ipos is not None and not _within(HSIG_OFFSET + ipos - opos, (0, HSIG_SHIFT_MAX)):
                found.append(f"[hard-sigmoid] {name}: {HSIG_OFFSET} + ipos {ipos} - opos {opos} outside "
                             f"[0, {HSIG_SHIFT_MAX}]")
    return found


def check(model: onnx.ModelProto | str | Path) -> list[str]:
    """Every NPU constraint the model breaks, as `[tag] node: detail` strings (empty when clean)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    g = _Graph(model)
    found: list[str] = []
    for node in g.nodes:
        if node.op_type in QDQ:
            found += _check_qdq(g, node)
        else:
            found += _check_op(g, node)
    return found


def tags(violations: list[str]) -> set[str]:
    """The `[tag]`s of a list of violations, e.g. {"concat", "pow2"}."""
    return {v[1:v.index("]")] for v in violations}
