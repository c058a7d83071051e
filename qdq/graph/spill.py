"""Scratch external data for the large constants a fix computes.

A fix that re-quantizes the weights of a model with gigabytes of external data would otherwise
hold every new weight in memory until the model is saved. Instead each one is written to a
scratch data file as soon as it exists and the graph keeps only a reference to it, as it does
for the input's own weights. `save_model` copies the scratch file next to the output; the
folder is removed when the process ends.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from qdq.graph import ir


class Spill:
    """One append-only scratch data file; its locations are absolute, so they never resolve next to the input."""

    def __init__(self, stem: str):
        self._folder = tempfile.TemporaryDirectory(prefix="qdq-")
        self.path = Path(self._folder.name) / f"{stem}.data"
        self._size = 0

    def constant(self, name: str, values: np.ndarray) -> ir.Constant:
        """A graph constant whose values live in the scratch file, read back only when asked for."""
        values = np.ascontiguousarray(values)
        proto = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(values.dtype), dims=values.shape)
        with open(self.path, "ab") as handle:
            handle.write(values.data)
        for key, value in (("location", str(self.path)), ("offset", str(self._size)), ("length", str(values.nbytes))):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        proto.data_location = TensorProto.EXTERNAL
        self._size += values.nbytes
        return ir.Constant.stored(proto)
