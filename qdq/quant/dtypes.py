"""The integer and low-precision float types a Q/DQ pair can quantize to.

qdq recognises every type the ONNX spec allows for QuantizeLinear / DequantizeLinear;
whether a target accepts a type is decided by its rule set, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto


@dataclass(frozen=True)
class QuantType:
    """One quantized element type: its ONNX enum, name and representable integer range."""

    onnx_type: int
    name: str
    bits: int
    is_float: bool
    qmin: float
    qmax: float

    @property
    def signed(self) -> bool:
        return self.qmin < 0


def _int(onnx_type: int, name: str, bits: int, signed: bool) -> QuantType:
    if signed:
        return QuantType(onnx_type, name, bits, False, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return QuantType(onnx_type, name, bits, False, 0, 2**bits - 1)


def _float(onnx_type: int, name: str, bits: int, largest: float) -> QuantType:
    return QuantType(onnx_type, name, bits, True, -largest, largest)


_KNOWN = [
    _int(TensorProto.INT8, "int8", 8, True),
    _int(TensorProto.UINT8, "uint8", 8, False),
    _int(TensorProto.INT16, "int16", 16, True),
    _int(TensorProto.UINT16, "uint16", 16, False),
    _int(TensorProto.INT32, "int32", 32, True),
    _int(TensorProto.INT4, "int4", 4, True),
    _int(TensorProto.UINT4, "uint4", 4, False),
    _float(TensorProto.FLOAT8E4M3FN, "float8e4m3fn", 8, 448.0),
    _float(TensorProto.FLOAT8E4M3FNUZ, "float8e4m3fnuz", 8, 240.0),
    _float(TensorProto.FLOAT8E5M2, "float8e5m2", 8, 57344.0),
    _float(TensorProto.FLOAT8E5M2FNUZ, "float8e5m2fnuz", 8, 57344.0),
]
# Types only recent onnx releases define: recognised when the installed onnx knows them.
for _name, _bits, _signed in (("INT2", 2, True), ("UINT2", 2, False)):
    if hasattr(TensorProto, _name):
        _KNOWN.append(_int(getattr(TensorProto, _name), _name.lower(), _bits, _signed))
if hasattr(TensorProto, "FLOAT4E2M1"):
    _KNOWN.append(_float(TensorProto.FLOAT4E2M1, "float4e2m1", 4, 6.0))

QUANT_TYPES: dict[int, QuantType] = {t.onnx_type: t for t in _KNOWN}
QUANT_TYPES_BY_NAME: dict[str, QuantType] = {t.name: t for t in _KNOWN}

# QuantizeLinear may not produce int32; only DequantizeLinear reads it (int32 bias).
DEQUANTIZE_ONLY = {TensorProto.INT32}


def quant_type(onnx_type: int) -> QuantType | None:
    """The QuantType for an ONNX element type, or None if it is not a quantized type."""
    return QUANT_TYPES.get(onnx_type)


def type_name(onnx_type: int) -> str:
    known = QUANT_TYPES.get(onnx_type)
    if known:
        return known.name
    try:
        return TensorProto.DataType.Name(onnx_type).lower()
    except ValueError:
        return f"type{onnx_type}"
