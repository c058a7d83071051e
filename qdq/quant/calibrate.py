"""Measure the range of every float tensor by running the model in onnxruntime on given inputs.

Some placement fixes need a scale that exists nowhere in the graph (a residual branch that was
never quantized). `qdq fix --calibrate FILE.npz` runs the input model once on those inputs and
hands the measured (min, max) per tensor to the fixes; without it they report that they need data.
The values each QuantizeLinear reads are also counted in a histogram, from which QDQ504 chooses an
activation's power-of-two position by least squared error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from qdq.graph.float_types import FLOAT_TYPES
from qdq.graph.ops import QUANTIZE
from qdq.quant.histogram import Histogram, bins_for
from qdq.support.errors import QdqError

log = logging.getLogger("qdq")


class Measured(dict):
    """(min, max) per tensor name, as a dict; and, for feature maps (rank 3 and more, channels on
    axis 1), each channel's mean (`channel_mean`) and largest |value| (`channel_peak`), which
    equalization and bias correction (QDQ510, QDQ511) read; and a `histogram` of each tensor named
    in `quantized` (what a QuantizeLinear reads), which QDQ504 reads. A dict, so every fix that
    reads ranges takes it as it is."""

    def __init__(self, quantized: Iterable[str] = ()) -> None:
        super().__init__()
        quantized = set(quantized)
        self.histogram: dict[str, Histogram] = {name: Histogram(bins_for(len(quantized))) for name in quantized}
        self.channel_mean: dict[str, np.ndarray] = {}
        self.channel_peak: dict[str, np.ndarray] = {}
        self._sums: dict[str, np.ndarray] = {}
        self._counts: dict[str, int] = {}

    def add(self, name: str, value: np.ndarray) -> None:
        low, high = _range(value)
        old = self.get(name, (low, high))
        self[name] = (min(old[0], low), max(old[1], high))
        if name in self.histogram:
            self.histogram[name].add(value)
        if value.ndim >= 3 and value.dtype.kind == "f":
            axes = tuple(a for a in range(value.ndim) if a != 1)
            peak = np.abs(value).max(axis=axes).astype(np.float64)
            mean = value.mean(axis=axes, dtype=np.float64)
            self.channel_peak[name] = np.maximum(self.channel_peak.get(name, peak), peak)
            self._sums[name] = self._sums.get(name, 0) + mean
            self._counts[name] = self._counts.get(name, 0) + 1
            self.channel_mean[name] = self._sums[name] / self._counts[name]


def tensor_ranges(model_path: Path, *samples: dict[str, np.ndarray]) -> Measured:
    """The (min, max) over `samples` (feeds) of the graph's float inputs and every float tensor its nodes
    compute, with per-channel statistics of the feature maps (`Measured`)."""
    from qdq.support.runtime import session as new_session  # imported here: linting never needs onnxruntime

    proto = onnx.load(str(model_path))
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(proto).graph.value_info}
    declared = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            value = typed.get(name)
            if value is not None and name not in declared and value.type.tensor_type.elem_type in FLOAT_TYPES:
                proto.graph.output.append(value)
    ranges = Measured(n.input[0] for n in proto.graph.node if n.op_type == QUANTIZE and n.input and n.input[0])
    try:
        session = new_session(proto.SerializeToString())
        names = [o.name for o in session.get_outputs()]
        for feeds in samples:  # one at a time: only the ranges are kept
            results = session.run(names, {i.name: feeds[i.name] for i in session.get_inputs()})
            for name, value in [*feeds.items(), *zip(names, results)]:
                if isinstance(value, np.ndarray) and value.dtype.kind in "fiu" and value.size:
                    ranges.add(name, value)
    except ValueError as exc:  # protobuf refuses to serialise a model over 2 GiB
        raise QdqError(f"{model_path}: cannot calibrate: {exc}") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise QdqError(f"{model_path}: onnxruntime failed to run the model for calibration: {first}") from None
    log.info("calibration: measured %d tensors", len(ranges))
    return ranges


def _range(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    if finite.size == 0:
        return 0.0, 0.0
    return float(finite.min()), float(finite.max())
