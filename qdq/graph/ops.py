"""The operators qdq rewrites, and the domains it reads them in.

Its own module so that loading and saving (`qdq.graph.model`) can name them without importing the
quantization view of a graph (`qdq.quant.index`), which is built on a loaded model.
"""

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"
QDQ_OPS = (QUANTIZE, DEQUANTIZE)
# onnxruntime's contrib Q/DQ (com.microsoft) has the same semantics, for int16 and int4 before opset 21.
QDQ_DOMAINS = (None, "", "ai.onnx", "com.microsoft")
# QuantizeLinear/DequantizeLinear take per-axis scales (and an `axis` attribute) from opset 13 on.
PER_AXIS_OPSET = 13


# Ops whose output is never negative (ONNX semantics): a Relu after them, or a quantizer's clip at
# zero, changes nothing. QDQ503 and the float twin ask the same question with them.
NON_NEGATIVE_OPS = ("Relu", "Sigmoid", "HardSigmoid", "Softmax", "Abs", "Exp")
# Ops whose every output value is one of their data input's values or an average of them, so a
# non-negative input stays non-negative. Not Resize (cubic interpolation overshoots) nor Pad (its
# constant may be negative).
SIGN_KEEPING_OPS = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Reshape", "Flatten",
                    "Transpose", "Squeeze", "Unsqueeze", "Slice", "Concat", "Identity", "Gather", "Expand",
                    "Tile", "Split")


def sign_carrying(op: str, inputs: Sequence[T]) -> Sequence[T]:
    """The inputs whose values a sign-keeping op passes on: every input of a Concat, the data input (the
    first) of the others; their shape, index and axis inputs do not reach the output's values."""
    return inputs if op == "Concat" else inputs[:1]
