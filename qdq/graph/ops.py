"""The operators qdq rewrites, and the domains it reads them in.

Its own module so that loading and saving (`qdq.graph.model`) can name them without importing the
quantization view of a graph (`qdq.quant.index`), which is built on a loaded model.
"""

QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"
QDQ_OPS = (QUANTIZE, DEQUANTIZE)
# onnxruntime's contrib Q/DQ (com.microsoft) has the same semantics, for int16 and int4 before opset 21.
QDQ_DOMAINS = (None, "", "ai.onnx", "com.microsoft")
# QuantizeLinear/DequantizeLinear take per-axis scales (and an `axis` attribute) from opset 13 on.
PER_AXIS_OPSET = 13

