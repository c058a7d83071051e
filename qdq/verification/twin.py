"""The float twin of a Q/DQ model: the float computation its quantization approximates.

Every Q/DQ model carries its own float reference. Remove each activation's QuantizeLinear →
DequantizeLinear pair (and an integer Clip between them) and keep the weights' and biases' DQs:
what is left computes in float with the weights at their dequantized values. The quantization
error the user already accepted is the model's distance from its twin; a fix is judged by how
far it moves the model from that twin (`qdq.verification.verdict`), not by how far it moves it from itself.

A Q whose range starts or ends at exactly zero keeps its clipping (a Clip in the twin): quantizers
delete a Relu or Clip that such a Q makes redundant. The twin is built on the ONNX protobuf,
external weights left where they are. It cannot be built
for a model without activation Q/DQ pairs, or with quantization in ops whose float form qdq does
not know (QDQ006's quantizers and integer kernels); `Twin.reason` says why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdq.checks.coverage import describe, unread_ops
from qdq.graph.ops import DEQUANTIZE, NON_NEGATIVE_OPS, QDQ_DOMAINS, QUANTIZE, SIGN_KEEPING_OPS, sign_carrying
from qdq.support import progress
from qdq.verification.verify import Quantizers


@dataclass
class Twin:
    """The twin model (None when it cannot be built, with the reason) and what it took."""

    model: onnx.ModelProto | None
    pairs: int  # activation Q → DQ pairs replaced by their float input
    reason: str | None = None
    # Activation tensors that a QuantizeLinear reads, with that Q: what the quantizers' ranges cover.
    quantized: list[tuple[str, onnx.NodeProto]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # the model's own outputs, before any watched one
    # Those of them the twin also outputs, to see how often random inputs saturate them (`qdq.verification.meant_inputs`).
    watched: list[tuple[str, onnx.NodeProto]] = field(default_factory=list)
    # The replaced pairs' DequantizeLinear outputs, in graph order: tensors the model computes quantized and
    # the twin in float, under the same name (the verdict judges the deepest of them).
    dequantized: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _OpView:
    """What QDQ006's lists match a node by."""

    op: str
    domain: str


def float_twin(model: onnx.ModelProto, coverage: dict[str, Any], folder: Path | str = ".") -> Twin:
    """The twin of `model` (not modified); `coverage` is QDQ006's parameters (the ops qdq does not read);
    `folder` the model's, where its external data lies."""
    graph = model.graph
    progress.step("building the float twin")  # each walk over a 100k-node graph below takes a second or so
    quantizers, integers = unread_ops([_OpView(n.op_type, n.domain) for n in graph.node], coverage)
    if quantizers or integers:
        return Twin(None, 0, f"it quantizes in ops whose float form qdq does not know ({describe({**quantizers, **integers})})")
    constant = _constant_names(graph)
    progress.tick()
    producers = {name: node for node in progress.each(graph.node, None) for name in node.output if name}
    quantized = [(node.input[0], node) for node in progress.each(graph.node, None)
                 if _is(node, QUANTIZE) and node.input[0] not in constant]
    replaced: dict[int, list[onnx.NodeProto]] = {}
    progress.tick()
    ranges = Quantizers(graph, folder)
    constants: list[onnx.TensorProto] = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    for position, node in enumerate(progress.each(graph.node, "building the float twin")):
        if not _is(node, DEQUANTIZE) or len(node.input) < 2:
            continue
        source = _quantizer_of(node, producers)
        if source is None or source.input[0] in constant:
            continue
        to = _output_type(node, ranges)
        if to is None:
            continue  # a scale computed at run time: the DQ's float type is unknown, keep the pair
        replaced[position] = _float_form(source, node, to, ranges, constants, opset, producers)
    if not replaced:
        return Twin(None, 0, "it has no activation QuantizeLinear → DequantizeLinear pair", quantized)
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    del twin.graph.node[:]
    twin.graph.node.extend(made for i, node in enumerate(progress.each(graph.node, None))
                           for made in replaced.get(i, [node]))
    twin.graph.initializer.extend(constants)
    _drop_dead_nodes(twin.graph)
    dequantized = [graph.node[i].output[0] for i in sorted(replaced)]
    return Twin(twin, len(replaced), None, quantized, [o.name for o in graph.output], dequantized=dequantized)


def _float_form(q: onnx.NodeProto, dq: onnx.NodeProto, to: int, ranges: Quantizers, constants: list,
                opset: int, producers: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """What stands for Q → DQ in the twin: the Q's float input, in the DQ's type.

    A Q whose range starts or ends at exactly zero may stand for a Relu or Clip the quantizer
    removed because the Q's saturation does its work (onnxruntime's quantizer deletes `Relu → Q`
    and `Clip → Q` so, `IsClipMadeRedundantByQ`): such a Q keeps its clipping in the twin, or the
    twin would compute a different network (a hard-swish without its Clip grows without bound).
    Where the Q's input is already one-sided, nothing was removed, and the twin does not clip (or
    it would bake the input's saturation at the top of the range into the reference).
    """
    name = dq.name or dq.output[0]
    cast = helper.make_node("Cast", [q.input[0]], [dq.output[0]], name=f"{name}_twin", to=to)
    bounds = ranges.range_of_node(q, q.input[0], ())
    if bounds is None or not (float(bounds[0]) == 0.0 or float(bounds[1]) == 0.0) or _one_sided(q.input[0], producers, ranges):
        return [cast]
    low, high = (float(b) for b in bounds)
    cast.output[0] = f"{dq.output[0]}_twin_unclipped"
    if opset < 11:
        return [cast, helper.make_node("Clip", [cast.output[0]], [dq.output[0]], name=f"{name}_twin_clip",
                                       min=low, max=high)]
    dtype = helper.tensor_dtype_to_np_dtype(to)
    names = [f"{dq.output[0]}_twin_min", f"{dq.output[0]}_twin_max"]
    constants += [numpy_helper.from_array(np.asarray(value, dtype=dtype), n) for value, n in zip((low, high), names)]
    return [cast, helper.make_node("Clip", [cast.output[0], *names], [dq.output[0]], name=f"{name}_twin_clip")]


# Ops after which a Q with a zero end stood for no removed Relu or Clip. Not Exp, though never negative:
# the Q after it is where a model's growth is bounded (NNCF's magika: its twin without that clip wrote
# 4.6e5 where the input model writes at most 1).
_BOUNDED = (frozenset(NON_NEGATIVE_OPS) - {"Exp"}) | {"Clip"}


def _one_sided(name: str, producers: dict[str, onnx.NodeProto], ranges: Quantizers, depth: int = 0) -> bool:
    """Whether `name` is already one-sided in the twin: made by a bounding op, by a pair whose range
    starts at zero (the twin clips it or its input is one-sided), or by a sign-keeping op over such
    tensors (NNCF's Relu → Q → DQ → GlobalAveragePool → Q: no Relu was removed before the last Q)."""
    node = producers.get(name)
    if node is None or depth > 64:
        return False
    if node.op_type in _BOUNDED:
        return True
    if _is(node, DEQUANTIZE):
        q = _quantizer_of(node, producers)
        bounds = ranges.range_of_node(q, q.input[0], ()) if q is not None else None
        return bounds is not None and float(bounds[0]) == 0.0
    if node.op_type not in SIGN_KEEPING_OPS:
        return False
    return all(_one_sided(x, producers, ranges, depth + 1) for x in sign_carrying(node.op_type, node.input) if x)


def _quantizer_of(dq: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> onnx.NodeProto | None:
    """The QuantizeLinear whose integers a DequantizeLinear reads, directly or through an integer Clip
    (a reduced range: Brevitas QCDQ, PyTorch FX QAT with quant_max below the type's); None if none."""
    source = producers.get(dq.input[0])
    if source is not None and source.op_type == "Clip" and source.domain in ("", "ai.onnx"):
        source = producers.get(source.input[0])
    return source if source is not None and _is(source, QUANTIZE) else None


def _is(node: onnx.NodeProto, op: str) -> bool:
    return node.op_type == op and node.domain in QDQ_DOMAINS


def _constant_names(graph: onnx.GraphProto) -> set[str]:
    """Tensors only constants make: initializers, Constant nodes, and nodes all of whose inputs are such."""
    known = {t.name for t in graph.initializer}
    for node in progress.each(graph.node, None):  # the graph is in topological order
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in known for name in inputs)):
            known.update(name for name in node.output if name)
    return known


def _output_type(dq: onnx.NodeProto, ranges: Quantizers) -> int | None:
    """The float type a DequantizeLinear writes: its `output_dtype` (opset 23), else its scale's type."""
    declared = next((a.i for a in dq.attribute if a.name == "output_dtype"), 0)
    scale = ranges.constant(dq.input[1]) if not declared else None
    return declared or (scale[1] if scale is not None else None)


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes nothing reads any more (the bypassed Qs and Clips), so the twin computes no integers.

    A node goes when no graph output and no remaining node reads any of its outputs; dropping it may
    leave the nodes it read unread in turn. Each node's reads are counted once, not the graph walked per drop.
    """
    progress.step("building the float twin")
    nodes = list(graph.node)
    reads = [set(node.input) | {name for attr in node.attribute for sub in _subgraphs(attr) for name in _outer_names(sub)}
             for node in progress.each(nodes, None)]
    readers = Counter(name for names in reads for name in names)
    read_outside = {o.name for o in graph.output}
    producers: dict[str, list[int]] = {}
    for i, node in enumerate(progress.each(nodes, None)):
        for name in node.output:
            if name:
                producers.setdefault(name, []).append(i)

    def unread(i: int) -> bool:
        return not any(name in read_outside or readers[name] for name in nodes[i].output if name)

    dropped = [False] * len(nodes)
    pending = [i for i in range(len(nodes)) if unread(i)]
    while pending:
        i = pending.pop()
        if dropped[i]:
            continue
        dropped[i] = True
        for name in reads[i]:
            readers[name] -= 1
            if not readers[name]:
                pending += [j for j in producers.get(name, ()) if not dropped[j] and unread(j)]
    if any(dropped):
        del graph.node[:]
        graph.node.extend(node for node, gone in zip(progress.each(nodes, None), dropped) if not gone)


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    return [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads (some from the graph around it)."""
    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                names |= _outer_names(sub)
    return names
