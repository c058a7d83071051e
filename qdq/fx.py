"""PyTorch FX QAT helpers that export to QDQ ONNX (needs torch: `pip install qdq[torch]`).

Stock FX QAT configs do not export (fused fake-quant ops, (-127, 127) ranges, observers traced
into the graph, qint8 activations silently left unquantized by the native backend config). These
helpers encode the path that works with torch 2.13: symmetric int8 `FakeQuantize` on a backend
config built for qint8, observers disabled, the TorchScript exporter.

    model = prepare_qat_fx(model, symmetric_int8_qconfig_mapping(), (x,), backend_config=int8_backend_config())
    ...train...
    export_onnx(model, (x,), "model.onnx")
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver, QConfig, QConfigMapping
from torch.ao.quantization.backend_config import BackendConfig, DTypeConfig

# Private torch API (torch.ao's own pattern lists); kept in one place so a torch move breaks here only.
from torch.ao.quantization.backend_config._common_operator_config_utils import (
    _get_binary_op_configs,
    _get_bn_configs,
    _get_cat_config,
    _get_conv_configs,
    _get_default_op_configs,
    _get_fixed_qparams_op_configs,
    _get_linear_configs,
    _get_share_qparams_op_configs,
    _get_tensor_info_op_configs,
)


def int8_backend_config() -> BackendConfig:
    """FX's native op patterns with qint8 dtype configs (the stock config accepts only quint8)."""
    weighted = DTypeConfig(
        input_dtype=torch.qint8, output_dtype=torch.qint8, weight_dtype=torch.qint8, bias_dtype=torch.float
    )
    plain = DTypeConfig(input_dtype=torch.qint8, output_dtype=torch.qint8)
    config = BackendConfig("qdq_int8_symmetric")
    config.set_backend_pattern_config(_get_cat_config([plain]))
    for patterns in (
        _get_conv_configs([weighted]),
        _get_linear_configs([weighted]),
        _get_binary_op_configs([plain]),
        _get_default_op_configs([plain]),
        _get_fixed_qparams_op_configs([plain]),
        _get_share_qparams_op_configs([plain]),
        _get_tensor_info_op_configs([plain]),
        _get_bn_configs([plain]),
    ):
        config.set_backend_pattern_configs(patterns)
    return config


def symmetric_int8_qconfig_mapping() -> QConfigMapping:
    """Per-tensor symmetric int8 for activations and weights, with the exportable FakeQuantize.

    Not the Fused* fake-quant (no ONNX symbolic) and not (-127, 127), which ONNX export rejects.
    """
    fake_quant = FakeQuantize.with_args(
        observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
        dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, eps=2**-12,
    )
    return QConfigMapping().set_global(QConfig(activation=fake_quant, weight=fake_quant))


def export_onnx(
    model: torch.nn.Module,
    example_inputs: tuple,
    path: str | Path,
    opset: int = 13,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
) -> Path:
    """Export a prepared FX QAT model to QDQ ONNX: observers off (else `aten::copy` fails), fake-quant on."""
    model.eval()
    model.apply(torch.ao.quantization.disable_observer)
    model.apply(torch.ao.quantization.enable_fake_quant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            model, example_inputs, str(path), dynamo=False, opset_version=opset,
            input_names=input_names, output_names=output_names, do_constant_folding=True,
        )
    return Path(path)
