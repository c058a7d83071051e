"""PyTorch FX QAT that exports to QDQ ONNX, and scale feedback from `qdq fix` (needs `pip install qdq[torch]`).

    model = prepare_qat_fx(model, symmetric_int8_qconfig_mapping(), (x,), backend_config=int8_backend_config())
    ...train...
    export(model, (x,), "model.onnx")
    # qdq fix model.onnx --target npu -o fixed.onnx
    print(load_scales(model, "fixed.onnx"))   # the fixed scales, frozen; train on, export again

For NPU targets `pow2_int8_qconfig_mapping()` gives power-of-two scales from min/max observers
and `tqt_pow2_qconfig_mapping()` learns power-of-two thresholds (TQT).

May import: support, graph, quant.
"""

try:
    import torch
except ImportError:
    # `from None`: the user needs the one line that says what to install, not torch's own import error.
    raise ImportError("qdq.fx needs PyTorch, which is not installed: pip install 'qdq[torch]' (CPU-only build: "
                      "add --extra-index-url https://download.pytorch.org/whl/cpu)", name="torch") from None
del torch  # imported only to fail early with the line above; the submodules import it themselves

from qdq.fx.export import export, qdq_scopes
from qdq.fx.qconfigs import (
    Pow2MovingAverageMinMaxObserver,
    Pow2MovingAveragePerChannelMinMaxObserver,
    int8_backend_config,
    pow2_int8_qconfig_mapping,
    pow2_scale,
    symmetric_int8_qconfig_mapping,
    tqt_pow2_qconfig_mapping,
)
from qdq.fx.scales import LoadReport, load_scales
from qdq.fx.tqt import TQTFakeQuantize

__all__ = [
    "LoadReport",
    "Pow2MovingAverageMinMaxObserver",
    "Pow2MovingAveragePerChannelMinMaxObserver",
    "TQTFakeQuantize",
    "export",
    "int8_backend_config",
    "load_scales",
    "pow2_int8_qconfig_mapping",
    "pow2_scale",
    "qdq_scopes",
    "symmetric_int8_qconfig_mapping",
    "tqt_pow2_qconfig_mapping",
]
