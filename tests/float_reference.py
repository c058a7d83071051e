"""How far a quantized corpus model is from the float model it was made from, on that model's samples.

`corpus/float/ARCH.onnx` is the float network and `ARCH.npz` its 16 calibration samples; every
quantized corpus file of that architecture was made from them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

FLOAT = Path(__file__).parent / "corpus" / "float"


def logits(path: Path, arch: str, outputs: list[str] | None = None) -> list[np.ndarray]:
    """Each requested output (default: the first) over every sample of ARCH.npz, one sample at a time,
    onnxruntime optimisations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # the float exports' unused initializers are not news
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = outputs or [session.get_outputs()[0].name]
    with np.load(FLOAT / f"{arch}.npz") as data:
        inputs = {i.name: data[i.name] for i in session.get_inputs()}
    count = len(next(iter(inputs.values())))
    runs = [session.run(names, {k: v[i:i + 1] for k, v in inputs.items()}) for i in range(count)]
    return [np.concatenate([run[j] for run in runs]) for j in range(len(names))]


def float_error(arch: str, model: Path) -> float:
    """Rel L2 of `model`'s logits against the float model's."""
    (got,), (want,) = logits(model, arch), logits(FLOAT / f"{arch}.onnx", arch)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))
