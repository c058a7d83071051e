"""Random inputs a model is meant to see: inputs its own quantizers' ranges cover.

Uniform noise over a graph input's quantizer range is not what a trained network sees: white
noise at full scale drives its activations far past the ranges calibration gave its quantizers,
so every clip point is hit and a fix that moves one looks catastrophic (a ResNet fixed for the NPU
read 9.6 dB on such inputs, and kept its top-1 on real data). The model says what it expects:
each activation QuantizeLinear's range is where calibration found the data. So the inputs are
smooth for image-like tensors (as pictures are) and drawn at the largest amplitude, halving from
the full input range, at which the activation quantizers of the float twin saturate on at most
`max_saturation` of their values on average. Without a twin, the input range is used whole.

An image-like input whose height and width are left open is drawn at the smallest square size on
which the network's deepest feature map still has a cell: its convolutions' and poolings'
strides multiplied along the way (PP-OCR's recognizer 48, its detector 32). One pixel, the size
an open dimension otherwise gets, leaves a text detector's map all zero and a recognizer's
softmax all 'blank': outputs that tell nothing about a fix.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from qdq.graph.float_types import FLOAT_TYPES
from qdq.support import progress
from qdq.support.errors import QdqError
from qdq.verification.pieces import PieceFailed, Pieces, joined
from qdq.verification.twin import Twin
from qdq.verification.verify import Quantizers, RandomInputs

log = logging.getLogger("qdq")

_AMPLITUDES = (1.0, 0.5, 0.25, 0.125, 0.0625)
# Quantized tensors watched for saturation: enough to see the network, few enough to keep memory small.
_MAX_WATCHED = 256
# Ops whose `strides` shrink the feature map; the smallest side an open image size gets.
_STRIDED = frozenset({"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool"})
_MIN_SIDE = 8


def meant_inputs(drawn: RandomInputs, twin: Twin, probe: Pieces | None, criterion, seed: int, shapes: dict | None
                 ) -> tuple[list[dict[str, np.ndarray]], str, dict[str, np.ndarray] | None]:
    """`criterion.samples` feeds drawn from the input model (`drawn`, given the user's `shapes`; its quantizers'
    ranges are what saturation is measured against), their label for the report, and the twin's outputs on
    them when it ran them (`probe`, the twin ready to run, chooses the amplitude and computes them: one twin
    run, not two)."""
    reference = drawn.model_path
    opened = {name: size for name, size in open_image_sizes(drawn.graph).items() if name not in (shapes or {})}
    drawn.shapes.update(opened)
    sized = "".join(f", {name} {'×'.join(map(str, size))}" for name, size in opened.items())

    def draw(amplitude: float, first: int, count: int) -> list[dict[str, np.ndarray]]:
        return [drawn.draw(first + i, amplitude, smooth=probe is not None) for i in range(count)]

    count = criterion.samples
    if probe is None or not twin.watched:
        return draw(1.0, seed, count), f"random (seed {seed}, {count} sample(s){sized})", None
    watched = twin.watched
    progress.step("choosing random inputs")
    # The input model's quantizers: in the twin a reduced range (Q → integer Clip → DQ) is gone with its Q.
    ranges = drawn.quantizers
    chosen = _AMPLITUDES[-1]
    for amplitude in _AMPLITUDES:
        progress.step(f"choosing random inputs: amplitude {amplitude:g}")
        saturation = _saturation(probe, reference, ranges, watched, draw(amplitude, seed, 1)[0])
        log.debug("random inputs at amplitude %g: %.2f%% of quantized values saturate", amplitude, 100 * saturation)
        if saturation <= criterion.max_saturation:
            chosen = amplitude
            break
    share = "the whole input range" if chosen == 1.0 else f"{chosen:g} of the input range"
    rarely = ("the model's quantizers saturate rarely" if saturation <= criterion.max_saturation else
              f"even so {100 * saturation:.1f} % of quantized values saturate")
    label = f"random (seed {seed}, {count} sample(s){sized}, smooth, over {share}: {rarely})"
    samples = draw(chosen, seed, count)
    return samples, label, _twin_outputs(probe, reference, twin.outputs, samples)


def open_image_sizes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Shapes for the image-like inputs (rank 4, float, channels known) whose height or width is open:
    batch 1, and each open side the network's total stride (at least `_MIN_SIDE`)."""
    initialized = {t.name for t in graph.initializer}
    sizes = {}
    for value in graph.input:
        kind = value.type.tensor_type
        dims = list(kind.shape.dim)
        if value.name in initialized or len(dims) != 4 or kind.elem_type not in FLOAT_TYPES:
            continue
        fixed = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 0 for d in dims]
        if not fixed[1] or all(fixed[2:]):
            continue
        side = max(_MIN_SIDE, *_total_strides(graph, value.name))
        sizes[value.name] = (fixed[0] or 1, fixed[1], fixed[2] or side, fixed[3] or side)
    return sizes


def _total_strides(graph: onnx.GraphProto, name: str) -> tuple[int, int]:
    """The largest product of 2-D strides on any path from `name`: how much the network shrinks the
    input's height and width (in graph order, which is topological)."""
    reached = {name: (1, 1)}
    for node in graph.node:
        seen = [reached[i] for i in node.input if i in reached]
        if not seen:
            continue
        height, width = max(s[0] for s in seen), max(s[1] for s in seen)
        strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [])
        if node.op_type in _STRIDED and len(strides) == 2:
            height, width = height * strides[0], width * strides[1]
        reached.update((o, (height, width)) for o in node.output if o)
    return max(h for h, _ in reached.values()), max(w for _, w in reached.values())


def watch(twin: Twin) -> None:
    """Add the tensors the twin's activation quantizers read (at most `_MAX_WATCHED`) to its outputs."""
    twin.watched = twin.quantized[:: max(1, len(twin.quantized) // _MAX_WATCHED)]
    declared = {o.name for o in twin.model.graph.output}
    for name, _ in twin.watched:
        if name not in declared:
            twin.model.graph.output.append(onnx.ValueInfoProto(name=name))
            declared.add(name)


def _twin_outputs(probe: Pieces, reference: Path, names: list[str], samples: list[dict[str, np.ndarray]]) -> dict:
    try:
        return joined(probe.run(samples, names, "the float twin"), names)
    except PieceFailed as exc:
        if exc.building:
            raise QdqError(f"onnxruntime cannot load the float twin of {reference}: {exc.detail}; "
                           "this is a bug in qdq") from None
        raise QdqError(f"onnxruntime cannot run the float twin of {reference}: {exc.detail}; give --inputs") from None


def _saturation(probe, reference: Path, ranges: Quantizers, watched: list[tuple[str, onnx.NodeProto]],
                feeds: dict[str, np.ndarray]) -> float:
    """The mean, over the watched quantizers, of the share of their input values past their range."""
    values = _twin_outputs(probe, reference, [name for name, _ in watched], [feeds])
    shares = []
    for name, q in watched:
        value = values[name]
        bounds = ranges.range_of_node(q, name, value.shape)
        if bounds is None or value.size == 0 or value.dtype.kind != "f":
            continue
        low, high = bounds
        shares.append(float(np.mean((value < low) | (value > high))))
    return float(np.mean(shares)) if shares else 0.0
