"""Export a prepared FX QAT model to QDQ ONNX, and the names its Q/DQ nodes get.

Of torch 2.13's exporters only the TorchScript one (`dynamo=False`) takes FakeQuantize modules
as they are: each `fake_quantize_per_tensor_affine` becomes a QuantizeLinear → DequantizeLinear
pair. The traps on the way (observers traced into the graph, fused fake-quant, ranges ONNX
rejects, PTQ observers, a backend config that quantized nothing) are checked here and end in a
one-line `QdqError` instead of an exporter stack trace.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
from torch.ao.quantization import FakeQuantizeBase, FusedMovingAvgObsFakeQuantize, ObserverBase

from qdq.support.errors import QdqError

# The (quant_min, quant_max) pairs the ONNX symbolic of fake_quantize accepts.
EXPORTABLE_RANGES = {(-128, 127), (0, 255), (0, 127)}


def export(
    model: torch.nn.Module,
    example_inputs: tuple,
    path: str | Path,
    opset: int = 13,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
) -> Path:
    """Write `model` (from `prepare_qat_fx`) as QDQ ONNX; observers off (else `aten::copy` fails), fake-quant on.

    Leaves the model in eval mode with observers disabled: call `.train()` to go on training
    (scales stay where they are; re-enable observers with
    `model.apply(torch.ao.quantization.enable_observer)`).
    """
    _check_exportable(model)
    model.eval()
    model.apply(torch.ao.quantization.disable_observer)
    model.apply(torch.ao.quantization.enable_fake_quant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            model, example_inputs, str(path), dynamo=False, opset_version=opset,
            input_names=input_names, output_names=output_names, do_constant_folding=True,
        )
    if not any(node.op_type == "QuantizeLinear" for node in onnx.load(str(path), load_external_data=False).graph.node):
        raise QdqError(
            f"{path}: the export has no QuantizeLinear: the backend config quantized nothing "
            "(torch's native config accepts only quint8; prepare with qdq.fx.int8_backend_config())"
        )
    return Path(path)


def _check_exportable(model: torch.nn.Module) -> None:
    fake_quants = [(name, m) for name, m in model.named_modules() if isinstance(m, FakeQuantizeBase)]
    if not fake_quants:
        raise QdqError(
            "the model has no fake-quant modules: prepare it with prepare_qat_fx and a qdq.fx QConfig mapping"
        )
    inner = {id(getattr(m, "activation_post_process", None)) for _, m in fake_quants}
    for name, module in model.named_modules():
        if isinstance(module, ObserverBase) and id(module) not in inner:
            raise QdqError(
                f"{name} is an observer, not a fake-quant (a prepare_fx model): use prepare_qat_fx to export QDQ"
            )
    for name, module in fake_quants:
        if isinstance(module, FusedMovingAvgObsFakeQuantize):
            raise QdqError(
                f"{name} is a FusedMovingAvgObsFakeQuantize (torch's default QAT qconfigs), which ONNX cannot "
                "export: use qdq.fx.symmetric_int8_qconfig_mapping()"
            )
        qrange = (int(module.quant_min), int(module.quant_max))
        if qrange not in EXPORTABLE_RANGES:
            raise QdqError(
                f"{name} quantizes to {list(qrange)}; ONNX export allows only [-128, 127], [0, 255] and [0, 127]"
            )


def qdq_scopes(model: torch.nn.Module) -> dict[str, str]:
    """The ONNX name scope of every fake-quant call in an exported FX model → the fake-quant's module name.

    The TorchScript exporter names a node `/<scope>/<Op>`. A scope part is the module's
    qualified name from its last non-numeric atom on (`blocks.0.branch.0` → `branch.0`), and a
    scope seen before gets `_1`, `_2`, … in call order. So two blocks' convs both export as
    `branch.0/weight_fake_quant`, the second with `_1`, and a fake-quant that FX shares among
    several tensors (Concat, MaxPool) gets one scope per call. FX GraphModules call every module
    from the top level in graph order, which gives the call order without running the model.
    """
    names = {}
    for name, module in model.named_modules():
        names.setdefault(id(module), name)  # the exporter knows a shared module by its first name
    calls: list[tuple[str, str]] = []
    for node in model.graph.nodes:
        if node.op != "call_module":
            continue
        module = model.get_submodule(node.target)
        if isinstance(module, FakeQuantizeBase):
            calls.append((_unqualified(names[id(module)]), names[id(module)]))
            continue
        for child in module.children():
            if isinstance(child, FakeQuantizeBase):  # a QAT module's weight_fake_quant
                scope = f"{_unqualified(names[id(module)])}/{_unqualified(names[id(child)])}"
                calls.append((scope, names[id(child)]))
    seen: Counter[str] = Counter()
    scopes = {}
    for scope, name in calls:
        count = seen[scope]
        seen[scope] += 1
        scopes[f"{scope}_{count}" if count else scope] = name
    return scopes


def _unqualified(qualified: str) -> str:
    atoms = qualified.split(".")
    for i in range(len(atoms) - 1, -1, -1):
        if not atoms[i].isnumeric():
            return ".".join(atoms[i:])
    return qualified
