"""The element type of every tensor of a graph, from ONNX's own operator schemas.

Why: a strongly typed TensorRT 11 network runs each layer in the type of its ONNX tensors, so
whether the float parts of a Q/DQ model are FP32 or FP16 decides what the engine computes in.
Exporters declare the types of graph inputs and outputs but rarely of every intermediate tensor,
so the types are carried forward here the way ONNX's type constraints say: an output whose type
variable is an input's (`T` in, `T` out) has that input's type; an output whose constraint allows
no float type (Shape's int64, Equal's bool) is not float; a DequantizeLinear outputs its scale's
type (or `output_dtype`), a Cast its `to`, a Constant its value's. No op list is kept: the schemas hold the knowledge.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import onnx
from onnx import TensorProto, helper

from qdq.graph import ir
from qdq.graph.ops import DEQUANTIZE, QDQ_DOMAINS

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
_FLOAT_TYPE_STRS = frozenset(f"tensor({t})" for t in ("float", "float16", "bfloat16", "double"))


def element_type(dtype: object) -> int | None:
    """The ONNX element type of an `ir` dtype (numpy's, or the ONNX enum for types numpy lacks)."""
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return dtype
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return None


def infer(graph: ir.Graph, opset: int) -> dict[str, int]:
    """Tensor name → ONNX element type, for every tensor whose type is declared or follows from its inputs."""
    types: dict[str, int] = {}
    for tensor in graph.inputs:
        if (known := element_type(tensor.dtype)) is not None:
            types[tensor.name] = known
    for node in graph.nodes:  # the graph is in topological order
        for tensor in node.inputs:
            if tensor.name not in types and (known := element_type(_declared(tensor))) is not None:
                types[tensor.name] = known
        for slot, tensor in enumerate(node.outputs):
            known = element_type(_declared(tensor))
            if known is None:
                known = _output_type(node, slot, types, opset)
            if known is not None and tensor.name:
                types[tensor.name] = known
    return types


def _declared(tensor: ir.Tensor) -> object:
    return tensor.dtype if isinstance(tensor, (ir.Constant, ir.Variable)) else None


def _output_type(node: ir.Node, slot: int, types: dict[str, int], opset: int) -> int | None:
    inputs = [types.get(t.name) if t.name else None for t in node.inputs]
    if node.op == DEQUANTIZE and node.domain in QDQ_DOMAINS:
        return node.attrs.get("output_dtype") or (inputs[1] if len(inputs) > 1 else None)
    if node.op == "Cast" and "to" in node.attrs:
        return int(node.attrs["to"])
    if node.op == "CastLike" and len(inputs) > 1:
        return inputs[1]
    if node.op == "Constant":
        value = node.attrs.get("value")
        if isinstance(value, ir.Constant):
            return element_type(value.dtype)
        return TensorProto.FLOAT if {"value_float", "value_floats"} & set(node.attrs) else TensorProto.UNDEFINED
    found = schema(node.op, node.domain or "", opset)
    if found is None or not found.outputs:
        return None
    formal = found.outputs[min(slot, len(found.outputs) - 1)].type_str
    allowed = _allowed(found, formal)
    if allowed and not allowed & _FLOAT_TYPE_STRS:
        return TensorProto.UNDEFINED  # not a float, whatever it is
    for position, known in enumerate(inputs):
        parameter = found.inputs[min(position, len(found.inputs) - 1)] if found.inputs else None
        if known is not None and parameter is not None and parameter.type_str == formal:
            return known
    return None


def _allowed(schema: onnx.defs.OpSchema, type_str: str) -> frozenset[str]:
    for constraint in schema.type_constraints:
        if constraint.type_param_str == type_str:
            return frozenset(constraint.allowed_type_strs)
    return frozenset({type_str}) if type_str.startswith("tensor(") else frozenset()


@cache
def schema(op: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    """The ai.onnx schema of `op` at `opset`; None for other domains and unknown ops."""
    if domain not in ("", "ai.onnx"):
        return None
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None
