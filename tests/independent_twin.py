"""An independent float twin, for tests: the reference the verdict judges by, built without qdq.

The verdict (docs/verification.md) judges a fix by its distance from the input's float twin: the
same graph with each activation QuantizeLinear → DequantizeLinear pair (and an integer Clip
between them) replaced by the Q's float input in the DQ's float type, the weights'
DequantizeLinears kept. A pair whose integer range (the Clip's, where one narrows it) starts or
ends at exactly zero keeps its whole clipping as a Clip (quantizers delete the Relu or Clip it
makes redundant), unless its input
is already one-sided: made by Relu, Clip, Sigmoid, HardSigmoid, Softmax or Abs, by a pair whose
range starts at zero, or by an op that only moves or averages such values
(docs/verification.md, "What a change is judged against").

This module builds that twin from the definition with onnx and numpy only, sharing no code with
`qdq/verification/twin.py`, so a test can recompute the distances a report prints and check the
verdict against them rather than against qdq's own arithmetic.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

INTEGER_RANGES = {
    onnx.TensorProto.INT8: (-128, 127), onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT16: (-32768, 32767), onnx.TensorProto.UINT16: (0, 65535),
    onnx.TensorProto.INT4: (-8, 7), onnx.TensorProto.UINT4: (0, 15),
}


def _constants(graph: onnx.GraphProto) -> set[str]:
    """Tensors computed from initializers and Constant nodes alone (weights, however stored)."""
    known = {t.name for t in graph.initializer}
    for node in graph.node:  # graph order is topological
        if node.op_type == "Constant" or (node.input and all(not n or n in known for n in node.input)):
            known.update(o for o in node.output if o)
    return known


def _range(q: onnx.NodeProto, values: dict[str, np.ndarray], types: dict[str, int],
           clip: onnx.NodeProto | None = None) -> tuple[float, float] | None:
    """The floats a per-tensor Q can represent, [(qmin - zp)·s, (qmax - zp)·s], its integers narrowed by the
    integer `clip` between it and its DQ (a reduced range); None when not constant."""
    scale = values.get(q.input[1])
    if scale is None or scale.size != 1:
        return None
    if len(q.input) < 3 or not q.input[2]:
        zero_point, (low, high) = 0, INTEGER_RANGES[onnx.TensorProto.UINT8]
    elif q.input[2] in values and values[q.input[2]].size == 1 and types[q.input[2]] in INTEGER_RANGES:
        zero_point, (low, high) = int(values[q.input[2]].item()), INTEGER_RANGES[types[q.input[2]]]
    else:
        return None
    if clip is not None:
        bounds = [values.get(name) for name in clip.input[1:3]]
        low = max(low, int(bounds[0].item())) if len(bounds) > 0 and bounds[0] is not None else low
        high = min(high, int(bounds[1].item())) if len(bounds) > 1 and bounds[1] is not None else high
    step = float(scale.item())
    return (low - zero_point) * step, (high - zero_point) * step


# From docs/verification.md: what makes a Q's input one-sided already.
BOUNDING = {"Clip", "Relu", "Sigmoid", "HardSigmoid", "Softmax", "Abs"}
MOVING_OR_AVERAGING = {"MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool", "Reshape", "Flatten",
                       "Transpose", "Squeeze", "Unsqueeze", "Slice", "Identity", "Gather", "Expand", "Tile",
                       "Split", "Concat"}


def float_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The twin of `model` (a copy; the model is not modified)."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    constant = _constants(graph)
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    types = {t.name: t.data_type for t in graph.initializer}
    for node in graph.node:  # constants, and what Identity and Cast make of them (exporters' scales)
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            types[node.output[0]] = node.attribute[0].t.data_type
        elif node.op_type in ("Identity", "Cast") and node.input and node.input[0] in values:
            to = next((a.i for a in node.attribute if a.name == "to"), types[node.input[0]])
            values[node.output[0]] = values[node.input[0]].astype(helper.tensor_dtype_to_np_dtype(to))
            types[node.output[0]] = to
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.value_info if v.type.tensor_type.elem_type})
    producer = {o: n for n in graph.node for o in n.output}

    def quantizer_of(dq: onnx.NodeProto) -> onnx.NodeProto | None:
        source = producer.get(dq.input[0])
        if source is not None and source.op_type == "Clip":
            source = producer.get(source.input[0])
        if source is None or source.op_type != "QuantizeLinear" or source.input[0] in constant:
            return None
        return source

    def pair_range(dq: onnx.NodeProto, q: onnx.NodeProto) -> tuple[float, float] | None:
        between = producer.get(dq.input[0])
        return _range(q, values, types, between if between is not q else None)

    def one_sided(name: str) -> bool:
        node = producer.get(name)
        if node is None:
            return False
        if node.op_type in BOUNDING:
            return True
        if node.op_type == "DequantizeLinear":
            q = quantizer_of(node)
            bounds = pair_range(node, q) if q is not None else None
            return bounds is not None and bounds[0] == 0.0
        if node.op_type not in MOVING_OR_AVERAGING:
            return False
        return all(one_sided(x) for x in (node.input if node.op_type == "Concat" else node.input[:1]) if x)

    rename: dict[str, str] = {}
    added: list[onnx.NodeProto] = []
    for node in graph.node:
        q = quantizer_of(node) if node.op_type == "DequantizeLinear" else None
        if q is None:
            continue
        float_type = types.get(node.output[0]) or types.get(node.input[1])
        if float_type is None:
            continue  # a scale computed at run time: the pair stays
        name = f"{node.output[0]}__twin"
        added.append(helper.make_node("Cast", [rename.get(q.input[0], q.input[0])], [name], to=float_type))
        bounds = pair_range(node, q)
        if bounds is not None and 0.0 in bounds and not one_sided(q.input[0]):
            limits = [f"{name}_low", f"{name}_high"]
            dtype = helper.tensor_dtype_to_np_dtype(float_type)
            for bound, limit in zip(bounds, limits):
                graph.initializer.append(numpy_helper.from_array(np.asarray(bound, dtype), limit))
            added.append(helper.make_node("Clip", [name, *limits], [f"{name}_clipped"]))
            name = f"{name}_clipped"
        rename[node.output[0]] = name
    kept = [n for n in graph.node if not (n.output and n.output[0] in rename)]
    for node in kept:
        node.input[:] = [rename.get(name, name) for name in node.input]
    outputs = {o.name for o in graph.output}
    identities = [helper.make_node("Identity", [rename[o]], [o]) for o in outputs if o in rename]
    ordered = _in_order(added + kept + identities)
    needed, live = {o.name for o in graph.output}, []  # the bypassed Qs go: the twin computes no integers
    for node in reversed(ordered):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(live))
    onnx.checker.check_model(twin)
    return twin


def _in_order(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes in an order where every tensor is computed before it is read (Kahn's, earliest first)."""
    made = {o: i for i, n in enumerate(nodes) for o in n.output}
    waiting = {i: {made[x] for x in n.input if x in made} for i, n in enumerate(nodes)}
    readers: dict[int, list[int]] = {}
    for i, deps in waiting.items():
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for r in readers.get(i, []):
            waiting[r].discard(i)
            if not waiting[r]:
                heapq.heappush(ready, r)
    assert len(order) == len(nodes), "the twin has a cycle"
    return order


def run(model: onnx.ModelProto | Path | str, feeds: dict[str, np.ndarray], optimized: bool = False) -> dict[str, np.ndarray]:
    """Every graph output of `model` on `feeds`, in onnxruntime (default optimisations or none)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def relative_l2(reference: np.ndarray, other: np.ndarray) -> float:
    """‖other − reference‖ / ‖reference‖ in float64 (inf when the reference is all zero and other is not)."""
    a, b = np.asarray(reference, np.float64), np.asarray(other, np.float64)
    norm, error = float(np.linalg.norm(a)), float(np.linalg.norm(b - a))
    if norm == 0:
        return 0.0 if error == 0 else float("inf")
    return error / norm
