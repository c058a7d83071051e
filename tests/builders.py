"""A small builder for hand-made QDQ test graphs, so each rule test reads like the pattern it checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Build an ONNX model node by node; `q`, `dq` and `qdq` add Q/DQ with their own initializers."""

    def __init__(self, opset: int = 17):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, name: str, shape: list[int], elem_type: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, shape: list[int | str], elem_type: int = TensorProto.FLOAT) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def init(self, name: str, value) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: int | list[str] = 1, name: str | None = None, **attrs) -> str:
        """Add a node; returns its (first) output name."""
        name = name or self._name(op.lower() + "_")
        if isinstance(outputs, int):
            outputs = [f"{name}_out{i}" if outputs > 1 else f"{name}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def qparams(self, prefix: str, scale, zero_point=0, dtype=np.int8, zero_point_used: bool = True) -> list[str]:
        scale_name = self.init(self._name(f"{prefix}_scale"), np.asarray(scale, dtype=np.float32))
        if not zero_point_used:
            return [scale_name]
        zp = np.asarray(zero_point, dtype=dtype)
        if zp.shape != np.asarray(scale).shape and zp.ndim == 0:
            zp = np.full(np.asarray(scale).shape, zero_point, dtype=dtype)
        return [scale_name, self.init(self._name(f"{prefix}_zp"), zp)]

    def q(self, x: str, scale=0.05, zero_point=0, dtype=np.int8, name: str | None = None, **attrs) -> str:
        name = name or self._name("q_")
        return self.node("QuantizeLinear", [x, *self.qparams(name, scale, zero_point, dtype)], name=name, **attrs)

    def dq(self, xq: str, scale=0.05, zero_point=0, dtype=np.int8, name: str | None = None, **attrs) -> str:
        name = name or self._name("dq_")
        return self.node("DequantizeLinear", [xq, *self.qparams(name, scale, zero_point, dtype)], name=name, **attrs)

    def qdq(self, x: str, scale=0.05, zero_point=0, dtype=np.int8, name: str | None = None) -> str:
        """Q then DQ sharing one scale/zero-point pair of initializers (as quantizers write them)."""
        name = name or self._name("qdq_")
        params = self.qparams(name, scale, zero_point, dtype)
        xq = self.node("QuantizeLinear", [x, *params], name=f"{name}_q")
        return self.node("DequantizeLinear", [xq, *params], name=f"{name}_dq")

    def weight(self, name: str, values: np.ndarray, scale=0.02, axis: int | None = None) -> str:
        """An int8 weight initializer behind a DequantizeLinear (per-axis when `axis` is given)."""
        scale = np.asarray(scale, dtype=np.float32)
        if axis is not None and scale.ndim:
            broadcast = [1] * values.ndim
            broadcast[axis] = -1
            q = np.clip(np.round(values / scale.reshape(broadcast)), -127, 127)
        else:
            q = np.clip(np.round(values / scale), -127, 127)
        self.init(name + "_q", q.astype(np.int8))
        attrs = {"axis": axis} if axis is not None else {}
        params = self.qparams(name, scale, 0, np.int8)
        return self.node("DequantizeLinear", [name + "_q", *params], name=name + "_dq", **attrs)

    def model(self, ir_version: int = 8) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "test", self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = ir_version
        return model

    def save(self, path: Path, check: bool = True) -> Path:
        model = self.model()
        if check:
            onnx.checker.check_model(model)
        onnx.save(model, str(path))
        return Path(path)
