"""Synthetic QDQ models for the scale benchmark: many tiny nodes, or a few huge external weights.

`ladder` makes a model of about n nodes whose tensors are tiny (1x4x4x4), so node count is all
that grows: it shows how qdq's per-node costs scale. `external` makes a model whose int8 weights
(several GiB) sit in one external-data file, to show that lint never reads them and that a fix
re-quantizing them streams instead of holding them all. Both are built straight as protobuf with
a fixed seed, so every run measures the same models.

    python benchmarks/scale_models.py ladder N OUT.onnx    |    external GIB FOLDER

prints {"path": ..., "nodes": ...} as JSON (the scale benchmark generates in a separate process so
that its own memory stays small: a child's peak RSS starts from its parent's).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8  # opset 17's; newer onnx writes an IR version older onnxruntime builds refuse
CHANNELS = 4
ACTIVATION_SHAPE = [1, CHANNELS, 4, 4]
# Scales a QAT export might produce: powers of two (what the NPU wants) and others it must round.
POW2_SCALES = (2.0**-4, 2.0**-5, 2.0**-6)
OTHER_SCALES = (0.0123, 0.0371, 0.0208)


class NotEnoughDisk(RuntimeError):
    """The external-data model would not fit on the disk."""


class _Graph:
    """Nodes and initializers of one graph, with helpers for the Q/DQ patterns of an exported model."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def constant(self, prefix: str, value: np.ndarray) -> str:
        name = self.fresh(prefix)
        value = np.asarray(value)  # raw bytes: several times faster than numpy_helper at 100k tensors
        dtype = helper.np_dtype_to_tensor_dtype(value.dtype)
        self.initializers.append(TensorProto(name=name, dims=value.shape, data_type=dtype, raw_data=value.tobytes()))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        name = self.fresh(op.lower() + "_")
        output = name + "_out"
        node = onnx.NodeProto(op_type=op, name=name, input=inputs, output=[output])
        node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
        self.nodes.append(node)
        return output

    def qdq(self, x: str, scale: float) -> str:
        """Q then DQ of an activation, sharing one int8 scale and zero point as exporters do."""
        params = [self.constant("s", np.float32(scale)), self.constant("zp", np.int8(0))]
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, *params]), *params])

    def weight(self, shape: list[int], per_channel: bool, pow2: bool) -> tuple[str, np.ndarray]:
        """A DQ of stored int8 integers; returns its output and the weight scale (per channel or scalar)."""
        choices = POW2_SCALES if pow2 else OTHER_SCALES
        if per_channel:
            scale = self.rng.choice(choices, size=shape[0]).astype(np.float32)
            zero_point = np.zeros(shape[0], np.int8)
        else:
            scale, zero_point = np.float32(self.rng.choice(choices)), np.int8(0)
        stored = self.rng.integers(-127, 128, size=shape, dtype=np.int8)
        inputs = [self.constant("w", stored), self.constant("ws", scale), self.constant("wzp", zero_point)]
        return self.node("DequantizeLinear", inputs, **({"axis": 0} if per_channel else {})), scale

    def bias(self, scale: np.ndarray) -> str:
        """An int32 bias behind a DQ whose scale is input x weight scale, as the NPU expects."""
        stored = self.rng.integers(-64, 64, size=CHANNELS, dtype=np.int32)
        scale = np.broadcast_to(scale, (CHANNELS,)).astype(np.float32)
        inputs = [self.constant("b", stored), self.constant("bs", scale), self.constant("bzp", np.zeros(CHANNELS, np.int32))]
        return self.node("DequantizeLinear", inputs, axis=0)

    def model(self, name: str, x: str, y: str, shape: list[int]) -> onnx.ModelProto:
        """The graph as a model whose input x and output y have the same shape."""
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, shape)],
            self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qdq-scale-bench")
        model.ir_version = IR_VERSION
        return model


def ladder(n_nodes: int, seed: int = 0) -> onnx.ModelProto:
    """A QDQ model of about n_nodes nodes: a ladder of five block kinds, repeated until it is that big.

    Every activation has Q/DQ; weights are int8 behind DQ (per-channel or per-tensor, some scales
    not powers of two). The blocks: Conv+bias+Relu; MatMul with a residual Add; two branches
    (Conv, MaxPool) into a Concat, some with mismatched scales, then a 1x1 Conv; a no-op
    Q->DQ->Q->DQ pair with equal parameters before a MaxPool; a requantize chain before a MatMul.
    """
    g = _Graph(seed)
    x = "input"
    scale = POW2_SCALES[0]
    current = g.qdq(x, scale)
    block = 0
    gc.disable()  # the collector would rescan the growing lists of messages: half the time at 100k
    try:
        while len(g.nodes) < n_nodes - 14:  # the largest block has 14 nodes
            current, scale = _BLOCKS[block % len(_BLOCKS)](g, current, scale, block)
            block += 1
        return g.model("ladder", x, current, ACTIVATION_SHAPE)
    finally:
        gc.enable()


def _activation_scale(g: _Graph, block: int) -> float:
    return float(g.rng.choice(OTHER_SCALES if block % 3 == 0 else POW2_SCALES))


def _conv_block(g: _Graph, x: str, x_scale: float, block: int) -> tuple[str, float]:
    w, w_scale = g.weight([CHANNELS, CHANNELS, 3, 3], per_channel=block % 2 == 0, pow2=block % 4 != 0)
    y = g.node("Conv", [x, w, g.bias(x_scale * w_scale)], pads=[1, 1, 1, 1])
    scale = _activation_scale(g, block)
    y = g.qdq(g.node("Relu", [g.qdq(y, scale)]), scale)
    return y, scale


def _matmul_residual_block(g: _Graph, x: str, x_scale: float, block: int) -> tuple[str, float]:
    w, _ = g.weight([4, 4], per_channel=False, pow2=block % 3 != 0)
    y = g.qdq(g.node("MatMul", [x, w]), _activation_scale(g, block))
    scale = _activation_scale(g, block + 1)
    return g.qdq(g.node("Add", [y, x]), scale), scale


def _concat_block(g: _Graph, x: str, x_scale: float, block: int) -> tuple[str, float]:
    w, _ = g.weight([CHANNELS, CHANNELS, 3, 3], per_channel=True, pow2=True)
    concat_scale = _activation_scale(g, block)
    mismatched = block % 2 == 0
    conv = g.qdq(g.node("Conv", [x, w], pads=[1, 1, 1, 1]), concat_scale * (1.5 if mismatched else 1.0))
    pool = g.qdq(g.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), x_scale)
    joined = g.qdq(g.node("Concat", [conv, pool], axis=1), concat_scale)
    w, _ = g.weight([CHANNELS, 2 * CHANNELS, 1, 1], per_channel=False, pow2=block % 3 != 0)
    scale = _activation_scale(g, block + 1)
    return g.qdq(g.node("Conv", [joined, w]), scale), scale


def _noop_pair_block(g: _Graph, x: str, x_scale: float, block: int) -> tuple[str, float]:
    same = g.qdq(x, x_scale)  # DQ -> Q with equal parameters: removable without changing a bit
    return g.qdq(g.node("MaxPool", [same], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]), x_scale), x_scale


def _requantize_block(g: _Graph, x: str, x_scale: float, block: int) -> tuple[str, float]:
    requantized = g.qdq(x, x_scale * 2)  # DQ -> Q with another scale: a requantize chain
    return _matmul_residual_block(g, requantized, x_scale * 2, block)


_BLOCKS = (_conv_block, _matmul_residual_block, _concat_block, _noop_pair_block, _requantize_block)


def external(folder: Path, gib: float, tensor_mib: int = 256, name: str = "external") -> Path:
    """Write a MatMul chain with about gib GiB of int8 weights in one external file; return the model path.

    Each weight sits behind a DQ with a scale that is not a power of two, so `qdq fix --target npu`
    re-quantizes every one. The data file is written a chunk at a time, so generating 3 GiB needs
    little memory. Raises NotEnoughDisk when the data (and a fixed copy of it) would not fit.
    """
    folder = Path(folder)
    total = int(gib * 2**30)
    n_weights = max(1, math.ceil(total / (tensor_mib * 2**20)))
    dim = max(16, int(math.sqrt(total / n_weights)) // 16 * 16)
    data_bytes = n_weights * dim * dim
    needed = 2 * data_bytes + 2**28  # the weights, a re-quantized copy, and room to spare
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise NotEnoughDisk(f"{folder}: {free / 2**30:.1f} GiB free, the {gib:g} GiB external-data model "
                            f"and its fixed copy need {needed / 2**30:.1f} GiB")
    data_name = f"{name}.onnx.data"
    g = _Graph(seed=1)
    x = "input"
    current = g.qdq(x, OTHER_SCALES[0])
    with open(folder / data_name, "wb") as data:

        def append(tensor_name: str, dims: list[int], dtype: int, write) -> str:
            offset = data.tell()
            write(data)
            g.initializers.append(_external_tensor(tensor_name, dims, dtype, data_name, offset, data.tell() - offset))
            return tensor_name

        for index in range(n_weights):
            stored = append(g.fresh("w"), [dim, dim], TensorProto.INT8,
                            lambda out: _write_int8_weight(out, dim, seed=100 + index))
            params = [g.constant("ws", np.float32(OTHER_SCALES[index % 3] / 8)), g.constant("wzp", np.int8(0))]
            w = g.node("DequantizeLinear", [stored, *params])
            # A few float weights: a bias per layer, small next to the int8 matrices.
            bias = g.rng.standard_normal(dim).astype(np.float32)
            bias = append(g.fresh("bias"), [dim], TensorProto.FLOAT, lambda out: out.write(bias.tobytes()))
            y = g.node("Add", [g.node("MatMul", [current, w]), bias])
            current = g.qdq(y, OTHER_SCALES[(index + 1) % 3])
    model = g.model(name, x, current, [1, dim])
    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _write_int8_weight(data, dim: int, seed: int, chunk_rows: int = 1024) -> None:
    """Append one dim x dim int8 matrix: a block of seeded random rows, written again and again.

    Only the volume matters to the benchmark, and drawing 3 GiB of random numbers took a minute.
    """
    block = np.random.default_rng(seed).integers(-127, 128, size=(min(chunk_rows, dim), dim), dtype=np.int8)
    for start in range(0, dim, chunk_rows):
        data.write(block[: min(chunk_rows, dim - start)].tobytes())


def _external_tensor(name: str, dims: list[int], dtype: int, location: str, offset: int, length: int) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=name, dims=dims, data_type=dtype)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scale_models.py", description=__doc__.split("\n\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    ladder_ = kinds.add_parser("ladder", help="about N tiny nodes in one .onnx file")
    ladder_.add_argument("nodes", type=int, metavar="N")
    ladder_.add_argument("where", type=Path, metavar="OUT.onnx")
    external_ = kinds.add_parser("external", help="a model whose int8 weights (GIB GiB) are one external-data file")
    external_.add_argument("gib", type=float, metavar="GIB")
    external_.add_argument("where", type=Path, metavar="FOLDER")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.kind == "ladder":
            model = ladder(args.nodes)
            onnx.save(model, str(args.where))
            path, nodes = args.where, len(model.graph.node)
        else:
            path = external(args.where, args.gib)
            nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
    except NotEnoughDisk as exc:
        print(f"scale_models.py: error: not enough disk: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"path": str(path), "nodes": nodes}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
