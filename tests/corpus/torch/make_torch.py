"""PyTorch 2.13 quantization exports of the corpus's networks, as the PyTorch exporters write them.

Rebuilds the float networks of `../float/make_float.py` (same seeds, same training), quantizes them
along the routes PyTorch users take, and writes `ARCH_ROUTE.onnx` next to this script, plus
`manifest.json`:

- FX QAT fake-quant (`prepare_qat_fx` with torch's stock `get_default_qat_qconfig_mapping(backend,
  version=0)`, a few QAT steps, observers disabled) → TorchScript exporter (`dynamo=False`);
- qdq's own FX route, `examples/networks.py fx_qat_export(qconfig="pow2")` (power-of-two scales);
- FX `convert_fx` (quantized ops) and `convert_to_reference_fx` (reference model) → TorchScript exporter;
- PT2E (torchao's `prepare_pt2e` / `prepare_qat_pt2e` with the XNNPACK and X86Inductor quantizers,
  `convert_pt2e`) → dynamo exporter (`dynamo=True`).

Routes that fail in torch 2.13 are run too (`fails=True` below) and their errors printed; they
write no file. The exported files are not edited. Each produced file is checked with an
onnxruntime session (default options) run on the 16 samples of `../float/ARCH.npz`; a file
onnxruntime rejects is kept (it is what the exporter writes) and its manifest note says so.

    pip install -c constraints.txt onnxscript          # the dynamo exporter
    pip install --no-deps torchao==0.18.0              # PT2E (moved out of torch); declares no torch pin
    python tests/corpus/torch/make_torch.py

Everything is seeded; a re-run on the same torch build writes the same files.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from torch.ao.quantization import disable_observer
from torch.ao.quantization.qconfig_mapping import get_default_qat_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, convert_to_reference_fx, prepare_qat_fx

HERE = Path(__file__).resolve().parent
FLOAT = HERE.parent / "float"
sys.path.insert(0, str(FLOAT))
import make_float  # noqa: E402  (../float/make_float.py; it puts examples/ on sys.path)
from make_float import networks  # noqa: E402

SEED = 0
QAT_STEPS = 40
QAT_LR = 1e-4
OPSET = 17  # TorchScript exporter; the dynamo exporter uses its own default
CALIBRATION_BATCHES = 4  # PT2E post-training calibration: this many training batches of 32


# --------------------------------------------------------------------------- FX (torch.ao.quantization)


def fx_qat(model: torch.nn.Module, data: networks.Data, qconfig_mapping) -> torch.fx.GraphModule:
    """prepare_qat_fx (native backend config), QAT_STEPS Adam steps, then eval mode with observers off.

    Observers must be off for the TorchScript exporter: their update code does not export
    ("Exporting the operator 'aten::copy' to ONNX ... is not supported").
    """
    torch.manual_seed(SEED)
    prepared = prepare_qat_fx(copy.deepcopy(model).train(), qconfig_mapping, (data[0][:1],))
    networks.train(prepared, data, epochs=1, lr=QAT_LR, seed=SEED, max_steps=QAT_STEPS)
    prepared.apply(disable_observer)
    return prepared.eval()


def export_torchscript(model: torch.nn.Module, data: networks.Data, path: Path) -> None:
    """The TorchScript exporter, static batch 1, opset OPSET."""
    torch.onnx.export(model, (data[0][:1],), str(path), dynamo=False, opset_version=OPSET,
                      input_names=["input"], output_names=["logits"])


def fx_fake_quant(backend: str) -> Callable:
    """FX QAT with torch's stock QAT qconfig mapping for `backend`, version 0 (plain FakeQuantize)."""
    def make(model, data, path):
        export_torchscript(fx_qat(model, data, get_default_qat_qconfig_mapping(backend, version=0)), data, path)
    return make


def fx_fake_quant_fused(model, data, path) -> None:
    """FX QAT with the default mapping (version 1: FusedMovingAvgObsFakeQuantize), as torch's docs show it."""
    export_torchscript(fx_qat(model, data, get_default_qat_qconfig_mapping("x86")), data, path)


def fx_fake_quant_dynamo(model, data, path) -> None:
    """FX QAT fake-quant model straight into the dynamo exporter."""
    prepared = fx_qat(model, data, get_default_qat_qconfig_mapping("qnnpack", version=0))
    torch.onnx.export(prepared, (data[0][:1],), dynamo=True, input_names=["input"],
                      output_names=["logits"]).save(str(path))


def fx_convert(model, data, path) -> None:
    """FX QAT (x86, version 0), `convert_fx` to quantized ops on the x86 engine, TorchScript exporter."""
    torch.backends.quantized.engine = "x86"
    converted = convert_fx(fx_qat(model, data, get_default_qat_qconfig_mapping("x86", version=0)))
    export_torchscript(converted, data, path)


def fx_reference(patched: bool) -> Callable:
    """FX QAT (qnnpack, version 0), `convert_to_reference_fx`, TorchScript exporter.

    Unpatched, torch 2.13 fails: the reference modules keep `torch.qscheme`/`torch.dtype` entries in
    their state_dict and `torch.jit._unique_state_dict` calls `.detach()` on them. `patched` swaps in a
    `_unique_state_dict` that skips non-tensors for the export, the workaround users apply.
    """
    def make(model, data, path):
        reference = convert_to_reference_fx(
            fx_qat(model, data, get_default_qat_qconfig_mapping("qnnpack", version=0)))
        if not patched:
            export_torchscript(reference, data, path)
            return
        original = torch.jit._unique_state_dict
        torch.jit._unique_state_dict = torch.jit._trace._unique_state_dict = _tensor_state_dict
        try:
            export_torchscript(reference, data, path)
        finally:
            torch.jit._unique_state_dict = torch.jit._trace._unique_state_dict = original
    return make


def _tensor_state_dict(module: torch.nn.Module, keep_vars: bool = False) -> dict[str, torch.Tensor]:
    """`torch.jit._unique_state_dict` without the non-tensor entries (each tensor once)."""
    tensors, seen = {}, set()
    for name, value in module.state_dict(keep_vars=True).items():
        if isinstance(value, torch.Tensor) and id(value) not in seen:
            seen.add(id(value))
            tensors[name] = value if keep_vars else value.detach()
    return tensors


def qdq_pow2(model, data, path) -> None:
    """qdq's FX route: symmetric int8 with power-of-two scales, `qdq.fx.export`."""
    networks.fx_qat_export(model, data, path, steps=QAT_STEPS, qconfig="pow2", lr=QAT_LR, seed=SEED)


# --------------------------------------------------------------------------- PT2E (torchao)


def xnnpack(per_channel: bool, qat: bool):
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel, is_qat=qat))


def x86_inductor(qat: bool):
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config(is_qat=qat))


def pt2e(quantizer: Callable, qat: bool, fold_quantize: bool = True) -> Callable:
    """torch.export → prepare_(qat_)pt2e → QAT_STEPS steps or CALIBRATION_BATCHES batches → convert_pt2e → dynamo.

    The capture uses a batch of 2 with a dynamic batch axis, so that training batches fit
    (a batch-1 capture specialises the batch to 1).
    """
    def make(model, data, path):
        from torchao.quantization.pt2e import allow_exported_model_train_eval
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

        torch.manual_seed(SEED)
        batch = torch.export.Dim("batch", min=1, max=64)
        captured = torch.export.export(copy.deepcopy(model), (data[0][:2],), dynamic_shapes=({0: batch},)).module()
        if qat:
            prepared = prepare_qat_pt2e(captured, quantizer(qat=True))
            allow_exported_model_train_eval(prepared)  # .train()/.eval() → move_exported_model_to_train/eval
            networks.train(prepared, data, epochs=1, lr=QAT_LR, seed=SEED, max_steps=QAT_STEPS)
        else:
            prepared = prepare_pt2e(captured, quantizer(qat=False))
            with torch.no_grad():
                for images in data[0][:32 * CALIBRATION_BATCHES].split(32):
                    prepared(images)
        converted = convert_pt2e(prepared, fold_quantize=fold_quantize)
        torch.onnx.export(converted, (data[0][:1],), dynamo=True, input_names=["input"],
                          output_names=["logits"]).save(str(path))
    return make


# --------------------------------------------------------------------------- the routes


@dataclass
class Route:
    stem: str
    arch: str
    make: Callable[[torch.nn.Module, networks.Data, Path], None]
    tool: str
    settings: dict
    note: str = ""
    fails: bool = False  # fails in torch 2.13: run, error printed, no file


FX_SETTINGS = {"exporter": "torch.onnx.export(dynamo=False)", "opset_version": OPSET, "qat_steps": QAT_STEPS,
               "observers": "disabled before export"}
X86_V0 = {"qconfig_mapping": "get_default_qat_qconfig_mapping('x86', version=0)",
          "activations": "quint8 [0, 127] (reduce_range)", "weights": "qint8 per-channel symmetric"}
QNNPACK_V0 = {"qconfig_mapping": "get_default_qat_qconfig_mapping('qnnpack', version=0)",
              "activations": "quint8 [0, 255]", "weights": "qint8 per-tensor symmetric"}
PT2E_SETTINGS = {"exporter": "torch.onnx.export(dynamo=True)", "capture": "torch.export.export, dynamic batch"}
XNNPACK_TOOL = "torchao.quantization.pt2e + XNNPACKQuantizer (torchao.testing.pt2e._xnnpack_quantizer)"
X86_TOOL = "torchao.quantization.pt2e + X86InductorQuantizer"

ROUTES = [
    Route("resnet_fx_qat_x86", "resnet", fx_fake_quant("x86"), "torch.ao.quantization.prepare_qat_fx",
          {**FX_SETTINGS, **X86_V0}),
    Route("resnet_fx_qat_qnnpack", "resnet", fx_fake_quant("qnnpack"), "torch.ao.quantization.prepare_qat_fx",
          {**FX_SETTINGS, **QNNPACK_V0}),
    Route("yolo_fx_qat_x86", "yolo", fx_fake_quant("x86"), "torch.ao.quantization.prepare_qat_fx",
          {**FX_SETTINGS, **X86_V0}),
    Route("yolo_fx_qat_qnnpack", "yolo", fx_fake_quant("qnnpack"), "torch.ao.quantization.prepare_qat_fx",
          {**FX_SETTINGS, **QNNPACK_V0}),
    Route("mobilenetv2_fx_qat_qnnpack", "mobilenetv2", fx_fake_quant("qnnpack"),
          "torch.ao.quantization.prepare_qat_fx", {**FX_SETTINGS, **QNNPACK_V0}),
    Route("resnet_fx_qat_pow2_qdq", "resnet", qdq_pow2, "qdq.fx (examples/networks.py fx_qat_export)",
          {"qconfig": "pow2", "qat_steps": QAT_STEPS, "opset_version": networks.OPSET,
           "activations": "qint8 symmetric, power-of-two scales", "weights": "qint8 symmetric, power-of-two scales"},
          "qdq's own exporter (qdq.fx.export), not torch.onnx.export"),
    Route("transformer_fx_qat_qnnpack", "transformer", fx_fake_quant("qnnpack"),
          "torch.ao.quantization.prepare_qat_fx", {**FX_SETTINGS, **QNNPACK_V0}),
    Route("resnet_fx_convert_x86", "resnet", fx_convert, "torch.ao.quantization.convert_fx",
          {**FX_SETTINGS, **X86_V0, "quantized_engine": "x86"}),
    Route("yolo_fx_convert_x86", "yolo", fx_convert, "torch.ao.quantization.convert_fx",
          {**FX_SETTINGS, **X86_V0, "quantized_engine": "x86"}),
    Route("resnet_fx_reference_qnnpack", "resnet", fx_reference(patched=True),
          "torch.ao.quantization.convert_to_reference_fx", {**FX_SETTINGS, **QNNPACK_V0},
          "exported with torch.jit._unique_state_dict patched to skip non-tensor state_dict entries; "
          "unpatched, torch 2.13 raises AttributeError: 'torch.qscheme' object has no attribute 'detach'"),
    Route("resnet_pt2e_xnnpack_qat", "resnet", pt2e(functools.partial(xnnpack, False), qat=True), XNNPACK_TOOL,
          {**PT2E_SETTINGS, "quantizer": "get_symmetric_quantization_config(is_per_channel=False, is_qat=True)",
           "qat_steps": QAT_STEPS}),
    Route("resnet_pt2e_x86_inductor_qat", "resnet", pt2e(x86_inductor, qat=True), X86_TOOL,
          {**PT2E_SETTINGS, "quantizer": "get_default_x86_inductor_quantization_config(is_qat=True)",
           "qat_steps": QAT_STEPS}),
    Route("yolo_pt2e_xnnpack_unfolded", "yolo", pt2e(functools.partial(xnnpack, True), qat=False,
                                                      fold_quantize=False), XNNPACK_TOOL,
          {**PT2E_SETTINGS, "quantizer": "get_symmetric_quantization_config(is_per_channel=True)",
           "calibration_batches": CALIBRATION_BATCHES, "convert_pt2e": {"fold_quantize": False}},
          "float weights → QuantizeLinear → DequantizeLinear (fold_quantize=False)"),
    Route("transformer_pt2e_xnnpack_ptq", "transformer", pt2e(functools.partial(xnnpack, True), qat=False),
          XNNPACK_TOOL,
          {**PT2E_SETTINGS, "quantizer": "get_symmetric_quantization_config(is_per_channel=True)",
           "calibration_batches": CALIBRATION_BATCHES}),
    Route("transformer_pt2e_x86_inductor_ptq", "transformer", pt2e(x86_inductor, qat=False), X86_TOOL,
          {**PT2E_SETTINGS, "quantizer": "get_default_x86_inductor_quantization_config()",
           "calibration_batches": CALIBRATION_BATCHES}),
    Route("transformer_pt2e_xnnpack_qat", "transformer", pt2e(functools.partial(xnnpack, False), qat=True),
          XNNPACK_TOOL,
          {**PT2E_SETTINGS, "quantizer": "get_symmetric_quantization_config(is_per_channel=False, is_qat=True)",
           "qat_steps": QAT_STEPS}),
    # Routes that fail in torch 2.13.
    Route("resnet_fx_qat_x86_fused", "resnet", fx_fake_quant_fused, "torch.ao.quantization.prepare_qat_fx",
          {}, fails=True),
    Route("resnet_fx_qat_dynamo", "resnet", fx_fake_quant_dynamo, "torch.ao.quantization.prepare_qat_fx",
          {}, fails=True),
    Route("resnet_fx_reference_unpatched", "resnet", fx_reference(patched=False),
          "torch.ao.quantization.convert_to_reference_fx", {}, fails=True),
]


# --------------------------------------------------------------------------- building and checking


@functools.cache
def float_network(arch: str) -> tuple[torch.nn.Module, networks.Data]:
    """make_float's trained network of `arch` and its data (built once per run)."""
    data = make_float.data_for(arch)
    return make_float.build(arch, data), data


def run_samples(path: Path, arch: str, optimize: bool = True) -> np.ndarray:
    """Logits of the 16 samples of ARCH.npz, one at a time, from an onnxruntime session.

    `optimize=False` disables onnxruntime's graph optimizations (the file runs as written).
    """
    options = onnxruntime.SessionOptions()
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    with np.load(FLOAT / f"{arch}.npz") as samples:
        images = samples["input"]
    return np.concatenate([session.run(None, {"input": images[i:i + 1]})[0] for i in range(len(images))])


def check(path: Path, arch: str) -> str:
    """'' when a default onnxruntime session runs the file, else a note that says why it cannot.

    A file the default session rejects is tried once more with graph optimizations disabled,
    which tells a broken file from one that only trips an onnxruntime fusion.
    """
    expected = run_samples(FLOAT / f"{arch}.onnx", arch).argmax(1)
    try:
        agreement = (run_samples(path, arch).argmax(1) == expected).mean()
        print(f"    top-1 agreement with the float model: {agreement:.2f}")
        return ""
    except Exception as error:  # noqa: BLE001  (any onnxruntime failure is recorded, not raised)
        note = f"a default onnxruntime {onnxruntime.__version__} session rejects this file: {error}"
    try:
        agreement = (run_samples(path, arch, optimize=False).argmax(1) == expected).mean()
        note += f"; it runs with graph optimizations disabled (ORT_DISABLE_ALL, top-1 agreement {agreement:.2f})"
    except Exception as error:  # noqa: BLE001
        note += f"; with graph optimizations disabled too: {error}"
    print(f"    {note}")
    return note


def main() -> None:
    warnings.simplefilter("ignore")  # torch.ao / TorchScript exporter deprecation notices
    logging.disable(logging.WARNING)  # the dynamo exporter's progress messages
    onnxruntime.set_default_logger_severity(3)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as make_float; quantized resize has no such kernel
    manifest, surprises = [], []
    for route in ROUTES:
        path = HERE / f"{route.stem}.onnx"
        model, data = float_network(route.arch)
        print(f"{route.stem}", flush=True)
        try:
            route.make(model, data, path)
        except Exception as error:  # noqa: BLE001
            path.unlink(missing_ok=True)
            print(f"    FAILED: {type(error).__name__}: {str(error).strip()[:2000]}", flush=True)
            if not route.fails:
                traceback.print_exc()
                surprises.append(route.stem)
            continue
        if route.fails:
            surprises.append(route.stem)
        size = path.stat().st_size
        print(f"    {size / 1024:.0f} KiB, opset {_opset(path)}", flush=True)
        notes = [note for note in (route.note, check(path, route.arch)) if note]
        manifest.append({"file": path.name, "architecture": route.arch, "tool": route.tool,
                         "version": _versions(route.tool), "settings": route.settings,
                         "made_by": "make_torch.py", "note": "; ".join(notes)})
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    if surprises:
        sys.exit(f"routes whose outcome changed (fails=True must fail, others must succeed): {surprises}")


def _opset(path: Path) -> int:
    return next(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx"))


def _versions(tool: str) -> str:
    if tool.startswith("torchao"):
        import torchao

        return f"torch {torch.__version__}, torchao {torchao.__version__}"
    if tool.startswith("qdq"):
        import qdq

        return f"torch {torch.__version__}, qdq {qdq.__version__}"
    return torch.__version__


if __name__ == "__main__":
    main()
