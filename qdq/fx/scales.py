"""Scale feedback: write the scales of a fixed QDQ model back into the FX model it was exported from.

`qdq fix` moves scales to what the hardware accepts (powers of two, aligned Concat inputs, NPU
shift limits). Loading those scales into the fake-quant modules and freezing them lets QAT
continue with the hardware's scales, so the network learns around them; exporting again gives
the fixed model's scales.

Q/DQ nodes are matched to fake-quant modules by the exporter's node names (`qdq_scopes`); `qdq
fix` keeps node names even where it renames or replaces scale constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.ao.quantization import FakeQuantizeBase

from qdq.fx.export import qdq_scopes
from qdq.fx.tqt import TQTFakeQuantize
from qdq.graph.model import Model, load_model
from qdq.quant.index import QuantIndex
from qdq.quant.operands import BIAS, role
from qdq.support.errors import QdqError


@dataclass
class LoadReport:
    """What `load_scales` did: each loaded module, and everything it could not match or load."""

    loaded: dict[str, list[float]] = field(default_factory=dict)  # module name → scale written
    nodes: dict[str, list[str]] = field(default_factory=dict)  # module name → the Q/DQ nodes it came from
    unmatched_onnx: list[str] = field(default_factory=list)  # Q/DQ nodes with no fake-quant of this model
    unmatched_fx: list[str] = field(default_factory=list)  # fake-quant modules with no Q/DQ in the file
    problems: list[str] = field(default_factory=list)  # matched, but not loaded as is (one sentence each)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} fake-quant scale(s) from {sum(map(len, self.nodes.values()))} Q/DQ node(s)"]
        for title, items in (
            ("Q/DQ nodes with no fake-quant in this model", self.unmatched_onnx),
            ("fake-quant modules with no Q/DQ in the file", self.unmatched_fx),
            ("problems", self.problems),
        ):
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines.extend(f"  {item}" for item in items)
        return "\n".join(lines)


def load_scales(prepared: torch.nn.Module, fixed_onnx: str | Path | Model) -> LoadReport:
    """Write the Q/DQ scales and zero-points of `fixed_onnx` into `prepared`'s fake-quants and freeze them.

    Freezing: observers off (FakeQuantize keeps the written scale), and for `TQTFakeQuantize`
    the threshold t is set so its scale is the loaded one and stops learning. A fake-quant that
    FX shares among several tensors (Concat, MaxPool) takes the largest of their scales if the
    fix gave them different ones (reported: the model cannot express the difference).
    """
    model = fixed_onnx if isinstance(fixed_onnx, Model) else load_model(fixed_onnx)
    index = QuantIndex(model)
    if not index.has_qdq:
        raise QdqError(f"{model.path}: no QuantizeLinear/DequantizeLinear nodes, so no scales to load")
    scopes = qdq_scopes(prepared)
    if not scopes:
        raise QdqError("the FX model has no fake-quant modules: load_scales needs the model prepare_qat_fx returned")
    modules = dict(prepared.named_modules())
    report = LoadReport()
    found: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    for params in _one_per_tensor(index):
        name = params.node.name
        scope = name.lstrip("/").rpartition("/")[0]
        if scope not in scopes:
            if _looks_like_fake_quant(scope):
                raise QdqError(
                    f"{model.path}: {name} is a fake-quant this FX model does not have: the file comes from "
                    "another FX model; load scales into the model it was exported from"
                )
            report.unmatched_onnx.append(name)
            continue
        problem = _shape_mismatch(params, modules, scopes[scope])
        if problem:
            raise QdqError(f"{model.path}: {name} {problem}: the file comes from another FX model")
        if params.scale is None or params.zero_point is None:
            report.problems.append(f"{name}: scale or zero-point is computed at run time; not loaded")
            continue
        found.setdefault(scopes[scope], []).append((name, params.scale.ravel(), params.zero_point.ravel()))
    if not found:
        raise QdqError(
            f"{model.path}: none of its {len(index.quantizes) + len(index.dequantizes)} Q/DQ node names belongs "
            "to this FX model; load scales into the model the file was exported from"
        )
    for module_name, entries in found.items():
        _load(modules[module_name], module_name, entries, report)
    report.unmatched_fx = sorted(set(scopes.values()) - set(found))
    return report


def _one_per_tensor(index: QuantIndex):
    """The QParams of each Q, and of each DQ whose Q is gone (a stored int8 weight); the Q's DQ repeats it.

    Bias DQs (QDQ610's int32 biases for the NPU) are left out: FX keeps biases float, with no
    fake-quant to load into; the next export has them float again.
    """
    quantized_scopes = {q.name.rpartition("/")[0] for q in index.quantizes}
    for node in index.quantizes:
        yield index.params(node)
    for node in index.dequantizes:
        if node.name.rpartition("/")[0] not in quantized_scopes and role(index, index.qtensor_of(node)) != BIAS:
            yield index.params(node)


def _looks_like_fake_quant(scope: str) -> bool:
    """A scope the exporter gives FX fake-quants (`activation_post_process_3_1`, `conv/weight_fake_quant`)."""
    last = scope.rpartition("/")[2]
    return last.startswith("activation_post_process_") or last.startswith("weight_fake_quant")


def _shape_mismatch(params, modules: dict[str, torch.nn.Module], fake_quant: str) -> str | None:
    """For a weight fake-quant whose Q/DQ reads a constant: a sentence when its shape is not the layer's weight's."""
    owner, _, attribute = fake_quant.rpartition(".")
    weight = getattr(modules.get(owner), "weight", None) if attribute == "weight_fake_quant" else None
    data = params.node.inputs[0]
    shape = getattr(data, "shape", None)
    if weight is None or shape is None or not all(isinstance(d, int) for d in shape):
        return None
    if tuple(shape) != tuple(weight.shape):
        return f"quantizes a weight of shape {list(shape)}, but {owner}.weight has shape {list(weight.shape)}"
    return None


def _load(module: FakeQuantizeBase, name: str, entries: list[tuple[str, np.ndarray, np.ndarray]], report: LoadReport) -> None:
    scale, zero_point = entries[0][1], entries[0][2]
    if len(entries) > 1 and any(not np.array_equal(s, scale) or not np.array_equal(z, zero_point) for _, s, z in entries):
        largest = max(range(len(entries)), key=lambda i: float(np.max(entries[i][1])))
        scale, zero_point = entries[largest][1], entries[largest][2]
        values = ", ".join(f"{node}={s.tolist()}" for node, s, _ in entries)
        report.problems.append(f"{name} is shared by tensors the fix gave different scales ({values}); took {scale.tolist()}")
    problem = _write(module, scale, zero_point)
    if problem:
        report.problems.append(f"{name} ({entries[0][0]}): {problem}; not loaded")
        return
    report.loaded[name] = scale.astype(np.float32).tolist()
    report.nodes[name] = [node for node, _, _ in entries]


def _write(module: FakeQuantizeBase, scale: np.ndarray, zero_point: np.ndarray) -> str | None:
    """Write and freeze; a sentence saying why not when the module cannot hold these qparams."""
    if isinstance(module, TQTFakeQuantize):
        if scale.size != 1 or np.any(zero_point != 0):
            return "TQT fake-quant is per-tensor with zero-point 0"
        value = float(np.float32(scale[0]))
        if math.frexp(value)[0] != 0.5:
            return f"scale {value} is not a power of two (TQT learns only powers of two)"
        module.set_scale(value)
        module.log2_threshold.requires_grad_(False)
        module.disable_observer()
        return None
    current = getattr(module, "scale", None)
    if not isinstance(current, torch.Tensor):
        return f"{type(module).__name__} has no scale buffer"
    if scale.size != current.numel():
        return f"{scale.size} scale value(s) for a fake-quant with {current.numel()}"
    with torch.no_grad():
        module.scale.copy_(torch.from_numpy(scale.astype(np.float32)).reshape(current.shape))
        module.zero_point.copy_(torch.from_numpy(zero_point.astype(np.int64)).reshape(module.zero_point.shape))
    module.disable_observer()
    return None
