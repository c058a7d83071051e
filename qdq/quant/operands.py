"""The quantized operands of a compute op: which value each input reads and which value its output is.

Rules that relate scales across an op (Concat alignment, NPU shift limits, bias = input × weight)
ask here instead of walking Q/DQ chains. Where a compiler reads an op's output scale further
down (the NPU reads a Conv's output after a fused Relu, an AvgPool's after its DPU multiply),
the rule set names those ops in the `output_through` and `output_through_mul` parameters.
"""

from __future__ import annotations

import math
from typing import Iterable

from qdq.graph import ir
from qdq.quant import pow2
from qdq.quant.index import DEQUANTIZE, PER_TENSOR, QuantIndex, QTensor

# Which inputs of an op hold its weight and bias (ONNX semantics, not target knowledge). A
# normalization's scale and B are its weight and bias: onnxruntime's quantizer stores them as an
# int8 weight and an int32 bias at input × scale, which are not activations of any target.
_NORMALIZATIONS = ("BatchNormalization", "InstanceNormalization", "LayerNormalization")
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1} | dict.fromkeys(_NORMALIZATIONS, 1)
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2} | dict.fromkeys(_NORMALIZATIONS, 2)

ACTIVATION, WEIGHT, BIAS = "activation", "weight", "bias"


def input_value(index: QuantIndex, node: ir.Node, i: int) -> QTensor | None:
    """The quantized value input `i` of a node is dequantized from, if any."""
    if i >= len(node.inputs) or node.inputs[i] is None or node.inputs[i].name == "":
        return None
    dq = index.dequantize_feeding(node.inputs[i])
    return index.qtensor_of(dq) if dq is not None else None



def output_value(
    index: QuantIndex, node: ir.Node, through: Iterable[str] = (), through_mul: Iterable[str] = ()
) -> QTensor | None:
    """The quantized value of a node's first output: the Q reading it, or one step further down.

    With no Q on the output, a single consumer whose op is in `through` (a fused activation) is
    followed, and so is a single Mul after an op in `through_mul` (the DPU's pool multiply).
    """
    if not node.outputs:
        return None
    out = node.outputs[0]
    for consumer, _ in index.consumers_through(out):
        qt = index.qtensor_of(consumer) if consumer.op == "QuantizeLinear" else None
        if qt is not None and qt.quantize is consumer:
            return qt
    consumers = out.outputs
    if len(consumers) == 1 and not index.is_graph_output(out):
        follow = consumers[0]
        if follow.op in set(through) or (follow.op == "Mul" and node.op in set(through_mul)):
            return output_value(index, follow)
    return None


def role(index: QuantIndex, qt: QTensor) -> str:
    """Whether a value is a weight, a bias or an activation, from what reads it and where it comes from."""
    key = ("role", id(qt))
    if key not in index.memo:
        index.memo[key] = (qt, _role(index, qt))  # holding qt keeps its id from being reused
    return index.memo[key][1]


def _role(index: QuantIndex, qt: QTensor) -> str:
    if not qt.from_constant:
        return ACTIVATION
    for dq in qt.dequantizes + _behind_clips(index, qt):
        for tensor in dq.outputs:
            for consumer, _ in index.consumers_through(tensor):
                slot = [i for i, t in enumerate(consumer.inputs) if _reaches(t, tensor)]
                if BIAS_INPUT.get(consumer.op) in slot:
                    return BIAS
                if WEIGHT_INPUT.get(consumer.op) in slot:
                    return WEIGHT
    return ACTIVATION


def _behind_clips(index: QuantIndex, qt: QTensor) -> list[ir.Node]:
    """The DQs that read a Q's integers through integer Clips (Brevitas: weight → Q → Clip → DQ),
    so the Q's value has the role of what those DQs feed."""
    found, pending = [], [qt.integer] if qt.quantize is not None else []
    while pending:
        for reader, _ in index.consumers_through(pending.pop()):
            if reader.op == "Clip" and reader.outputs:
                pending.append(reader.outputs[0])
            elif reader.op == DEQUANTIZE and reader not in qt.dequantizes:
                found.append(reader)
    return found


def _reaches(tensor: ir.Tensor | None, source: ir.Tensor) -> bool:
    """True when `tensor` is `source` or is made from it by Identity/Cast only."""
    while tensor is not None:
        if tensor is source:
            return True
        if len(tensor.inputs) != 1 or tensor.inputs[0].op not in ("Identity", "Cast") or not tensor.inputs[0].inputs:
            return False
        tensor = tensor.inputs[0].inputs[0]
    return False


def scale_of(index: QuantIndex, qt: QTensor) -> float | None:
    """The single scale of a per-tensor value with constant parameters, else None."""
    params = index.params(qt.nodes[0])
    if params.dynamic:
        return None
    value = index.table.single_scale(params)  # the NPU rules ask for every operand: most are decoded
    if value is None:
        if params.granularity != PER_TENSOR or params.scale.size != 1:
            return None
        value = float(params.scale.ravel()[0])
    return value if value > 0 and math.isfinite(value) else None


def pos_of(index: QuantIndex, qt: QTensor | None) -> int | None:
    """The fix position of a per-tensor power-of-two value (scale = 2^-pos), else None."""
    scale = scale_of(index, qt) if qt is not None else None
    return pow2.exact_pos(scale) if scale is not None else None


def output_channel_axis(node: ir.Node, weight_rank: int) -> int:
    """The axis of a weight that indexes the op's output channels, where per-channel scales belong.

    Conv weights are [Cout, Cin/g, k...]; ConvTranspose [Cin, Cout/g, k...]; Gemm's B is [K, N]
    unless transB (PyTorch Linear exports [N, K] with transB=1); MatMul's B is [..., K, N].
    """
    if node.op == "ConvTranspose":
        return 1
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    if node.op == "MatMul":
        return weight_rank - 1
    return 0
