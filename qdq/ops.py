"""The operators qdq rewrites, and the domains it reads them in.

Its own module so that loading and saving (`qdq.model`) can name them without importing the
quantization view of a graph (`qdq.quant_index`), which is built on a loaded model.
"""

QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"
QDQ_OPS = (QUANTIZE, DEQUANTIZE)
# onnxruntime's contrib Q/DQ (com.microsoft) has the same semantics, for int16 and int4 before opset 21.
QDQ_DOMAINS = (None, "", "ai.onnx", "com.microsoft")
# QuantizeLinear/DequantizeLinear take per-axis scales (and an `axis` attribute) from opset 13 on.
PER_AXIS_OPSET = 13


# Ops that compute on integers with scales and zero-points of their own (the QOperator format of
# ONNX and onnxruntime, weight-only int4/int8 kernels); besides these, any op named Q-Linear or
# Q-Ordered, or with "quantize" in its name.
INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "MatMulIntegerToFloat", "QGemm", "QAttention",
                         "QEmbedLayerNormalization", "MatMulNBits", "MatMulBnb4"})


def is_unread_quantizer(op: str, domain: str | None) -> bool:
    """A quantization op qdq does not read: a vendor's own (AMD Quark's ExtendedQuantizeLinear or
    BFPQuantizeDequantize, Vitis AI's VitisQuantizeLinear), dynamic quantization, or an op that
    computes on integers (QLinearConv, QGemm, MatMulInteger). Lint names them, so that a model
    quantized only with them never reads as having nothing to check."""
    if op in QDQ_OPS and domain in QDQ_DOMAINS:
        return False
    return "quantize" in op.lower() or op.startswith(("QLinear", "QOrdered")) or op in INTEGER_OPS
