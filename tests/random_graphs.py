"""Hypothesis strategies for random, valid QDQ models: the inputs of the property tests.

A model is a small DAG of Conv, Gemm, MatMul, Add, Mul, Concat, MaxPool, AveragePool, Relu,
Resize and Reshape on NCHW activations. Each op reads dequantized values and its output usually
goes through Q → DQ, as exporters write it; the strategy varies what rules care about: int8 or
uint8, per-tensor or per-channel weights, power-of-two or arbitrary scales, zero-points, scale
initializers shared between Q/DQ pairs, redundant Q/DQ pairs and float gaps (no Q/DQ at all).
Every drawn model passes `onnx.checker` (full check) and loads in onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from builders import GraphBuilder
from hypothesis import strategies as st

OPS = ("Conv", "MatMul", "Add", "Mul", "Concat", "MaxPool", "AveragePool", "Relu", "Resize", "Reshape")
MAX_SIDE = 16


@dataclass
class Value:
    """An activation the next op may read: its tensor name and NCHW shape."""

    name: str
    shape: tuple[int, int, int, int]


@dataclass
class _Draw:
    """The state of one drawn model: the builder, the values so far, and what may be shared."""

    draw: st.DrawFn
    builder: GraphBuilder
    dtype: type
    values: list[Value] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)
    shared_qparams: list[tuple[list[str], type]] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def scale(self) -> float:
        if self.draw(st.booleans()):
            return float(2.0 ** -self.draw(st.integers(2, 9)))
        return float(np.float32(self.draw(st.floats(1e-3, 0.2))))

    def zero_point(self, dtype: type) -> int:
        if self.draw(st.integers(0, 3)) == 0:  # mostly symmetric, sometimes not
            return self.draw(st.integers(-20, 20)) + (128 if dtype is np.uint8 else 0)
        return 128 if dtype is np.uint8 else 0

    def qparams(self) -> list[str]:
        """A scale/zero-point pair: a fresh one, or (sometimes) one another Q/DQ already uses."""
        if self.shared_qparams and self.draw(st.integers(0, 4)) == 0:
            params, dtype = self.draw(st.sampled_from(self.shared_qparams))
            return params
        dtype = self.dtype if self.draw(st.integers(0, 5)) else self.draw(st.sampled_from([np.int8, np.uint8]))
        params = self.builder.qparams("act", self.scale(), self.zero_point(dtype), dtype)
        self.shared_qparams.append((params, dtype))
        return params

    def quantize(self, name: str) -> str:
        """Q → DQ after a value (the common case), none (a float gap), or two pairs (redundant)."""
        kind = self.draw(st.sampled_from(["qdq"] * 6 + ["float", "twice"]))
        if kind == "float":
            return name
        for _ in range(2 if kind == "twice" else 1):
            params = self.qparams()
            q = self.builder.node("QuantizeLinear", [name, *params])
            name = self.builder.node("DequantizeLinear", [q, *params])
        return name

    def weight(self, shape: tuple[int, ...], axis: int) -> str:
        """An int8 weight behind a DQ, per-tensor or per-channel along `axis`, any kind of scale."""
        values = self.rng.standard_normal(shape).astype(np.float32) * 0.3
        if self.draw(st.booleans()):
            scale = np.asarray([self.scale() for _ in range(shape[axis])], dtype=np.float32)
            return self.builder.weight(self.builder._name("w"), values, scale, axis=axis)
        return self.builder.weight(self.builder._name("w"), values, self.scale())

    def pick(self, *, same_as: Value | None = None) -> Value | None:
        pool = [v for v in self.values if same_as is None or v.shape == same_as.shape]
        if not pool:
            return None
        value = self.draw(st.sampled_from(pool))
        self.consumed.add(value.name)
        return value

    def add(self, name: str, shape: tuple[int, int, int, int]) -> None:
        self.values.append(Value(self.quantize(name), shape))


def _conv(d: _Draw, x: Value) -> None:
    n, c, h, w = x.shape
    out = d.draw(st.sampled_from([2, 4]))
    kernel = d.draw(st.sampled_from([1, 3]))
    weight = d.weight((out, c, kernel, kernel), axis=0)
    inputs = [x.name, weight]
    bias = d.draw(st.sampled_from(["none", "float", "int32"]))
    if bias == "float":
        inputs.append(d.builder.init(d.builder._name("b"), d.rng.standard_normal(out).astype(np.float32)))
    elif bias == "int32":
        bias_q = d.builder.init(d.builder._name("bq"), d.rng.integers(-500, 500, out).astype(np.int32))
        inputs.append(d.builder.node("DequantizeLinear", [bias_q, *d.builder.qparams("b", d.scale(), 0, np.int32)]))
    y = d.builder.node("Conv", inputs, pads=[kernel // 2] * 4, kernel_shape=[kernel, kernel])
    d.add(y, (n, out, h, w))


def _matmul(d: _Draw, x: Value) -> None:
    weight = d.weight((x.shape[3], x.shape[3]), axis=1)
    d.add(d.builder.node("MatMul", [x.name, weight]), x.shape)


def _binary(op: str):
    def build(d: _Draw, x: Value) -> None:
        other = d.pick(same_as=x)
        d.add(d.builder.node(op, [x.name, other.name]), x.shape)

    return build


def _concat(d: _Draw, x: Value) -> None:
    pool = [v for v in d.values if v.shape[2:] == x.shape[2:] and v.shape[1] + x.shape[1] <= 8]
    if not pool:
        return d.add(d.builder.node("Relu", [x.name]), x.shape)
    other = d.draw(st.sampled_from(pool))
    d.consumed.add(other.name)
    y = d.builder.node("Concat", [x.name, other.name], axis=1)
    d.add(y, (x.shape[0], x.shape[1] + other.shape[1], *x.shape[2:]))


def _pool(op: str):
    def build(d: _Draw, x: Value) -> None:
        n, c, h, w = x.shape
        if h >= 4 and d.draw(st.booleans()):
            y = d.builder.node(op, [x.name], kernel_shape=[2, 2], strides=[2, 2])
            return d.add(y, (n, c, h // 2, w // 2))
        d.add(d.builder.node(op, [x.name], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), x.shape)

    return build


def _relu(d: _Draw, x: Value) -> None:
    d.add(d.builder.node("Relu", [x.name]), x.shape)


def _resize(d: _Draw, x: Value) -> None:
    n, c, h, w = x.shape
    factor = 2 if h * 2 <= MAX_SIDE else 1
    scales = d.builder.init(d.builder._name("scales"), np.asarray([1, 1, factor, factor], dtype=np.float32))
    d.add(d.builder.node("Resize", [x.name, "", scales], mode="nearest"), (n, c, h * factor, w * factor))


def _reshape(d: _Draw, x: Value) -> None:
    n, c, h, w = x.shape
    shape = (n, c * 2, h // 2, w) if h % 2 == 0 and c * 2 <= 8 else (n, c, w, h)
    target = d.builder.init(d.builder._name("shape"), np.asarray(shape, dtype=np.int64))
    d.add(d.builder.node("Reshape", [x.name, target]), shape)


BUILDERS = {
    "Conv": _conv, "MatMul": _matmul, "Add": _binary("Add"), "Mul": _binary("Mul"), "Concat": _concat,
    "MaxPool": _pool("MaxPool"), "AveragePool": _pool("AveragePool"), "Relu": _relu, "Resize": _resize,
    "Reshape": _reshape,
}


def _gemm_head(d: _Draw, x: Value) -> str:
    """Flatten a value with a Reshape and end in a quantized Gemm: the classifier of a CNN."""
    n, c, h, w = x.shape
    flat = d.builder.node("Reshape", [x.name, d.builder.init(d.builder._name("flat"), np.asarray([n, -1], np.int64))])
    flat = d.quantize(flat)
    trans_b = d.draw(st.booleans())
    shape = (5, c * h * w) if trans_b else (c * h * w, 5)
    weight = d.weight(shape, axis=0 if trans_b else 1)
    bias = d.builder.init(d.builder._name("gb"), d.rng.standard_normal(5).astype(np.float32))
    y = d.builder.node("Gemm", [flat, weight, bias], transB=int(trans_b))
    return d.quantize(y)


@st.composite
def qdq_models(draw: st.DrawFn, max_ops: int = 6) -> onnx.ModelProto:
    """A valid random QDQ model with one NCHW float input and every unread value as an output."""
    dtype = draw(st.sampled_from([np.int8, np.uint8]))
    d = _Draw(draw, GraphBuilder(opset=draw(st.sampled_from([13, 17]))), dtype,
              rng=np.random.default_rng(draw(st.integers(0, 2**16))))
    channels = draw(st.sampled_from([2, 4]))
    x = d.builder.input("x", [1, channels, 8, 8])
    d.values.append(Value(d.quantize(x), (1, channels, 8, 8)))
    for op in draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=max_ops)):
        BUILDERS[op](d, d.pick())
    outputs = [v for v in d.values if v.name not in d.consumed and v.name != x]
    if not outputs or draw(st.booleans()):
        head = d.pick()
        outputs = [v for v in outputs if v is not head]
        d.builder.output(_gemm_head(d, head), [1, 5])
    for value in outputs:
        d.builder.output(value.name, list(value.shape))
    return d.builder.model()
