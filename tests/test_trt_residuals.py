"""`qdq fix --target trt` on the corpus's YOLO (Conv→SiLU→Add bottlenecks) and ResNet files: no Q/DQ
between a conv and its activation, and every residual Add after an activation in the rule set's
mode, checked by tests/trt_placement.py's plain-onnx walk rather than by qdq's rule code.

Default (ModelOpt): the activated conv input float, the residual dequantized. `residual_after_activation
= "shared"` (NVIDIA's yolov7 QAT rules): both inputs dequantized on one scale. The fix must stay within
its own verification (first calibration sample), and `qdq inspect --target trt` must predict no more
conversion layers for the output than for the input (inspect has no `--rules`, so only for the default).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from cli_run import qdq
from test_conformance import CORPUS, ENTRIES, onnxruntime_loads, sample_feeds
from trt_placement import conv_activation_qdq, residual_modes

# PyTorch's x86 FX QAT files fail fix's verification for trt with or without these rules (the
# conformance matrix's "not written (verification)"): nothing to check on them here.
UNVERIFIED = {"torch/resnet_fx_qat_x86.onnx", "torch/yolo_fx_qat_x86.onnx"}
# Files in the QOperator format (QLinearConv) have no Q/DQ around their convs to place.
CASES = [e for e in ENTRIES if e.architecture in ("yolo", "resnet") and "float" not in e.path.parts
         and e.name not in UNVERIFIED and onnxruntime_loads(e.path)
         and any(n.op_type == "Conv" for n in onnx.load(str(e.path)).graph.node)]
# Files whose SiLUs are Sigmoid+Mul (Quark's xint8 and pow2 configs write HardSigmoid, not an activation here).
SILU = {e.name for e in CASES if any(n.op_type == "Sigmoid" for n in onnx.load(str(e.path)).graph.node)}


def fixed(entry, tmp_path, *rules: str):
    """Fix `entry` with `rules` and the architecture's first calibration sample: (output, report)."""
    out, inputs = tmp_path / "out.onnx", []
    feeds = sample_feeds(entry.path, entry)
    if feeds is not None:
        np.savez(tmp_path / "sample.npz", **feeds)
        inputs = ["--inputs", tmp_path / "sample.npz"]
    # Placement is what is checked here; the verdict may refuse a trt conversion whose symmetric
    # int8 costs more than the model's own error, so the file is written regardless.
    run = qdq("fix", entry.path, *rules, "-o", out, "--format", "json", "--keep-failed", *inputs)
    assert run.code in (0, 1), run.err
    assert run.json()["verification"] is not None and out.exists()
    return out, run.json()


def conversion_layers(path) -> int:
    run = qdq("inspect", path, "--target", "trt", "--format", "json")
    assert run.code == 0, run.err
    return run.json()["predicted"]["conversion_layers"]


def test_the_corpus_has_residuals_after_an_activation():
    assert len(SILU) >= 8 and sum(e.architecture == "resnet" for e in CASES) >= 10
    before = [residual_modes(onnx.load(str(CORPUS / "ort" / "yolo_u8_per_tensor.onnx")))]
    assert sorted(before[0].values()) == ["different-scales"] * 3  # the placement the issue reports
    assert len(conv_activation_qdq(onnx.load(str(CORPUS / "ort" / "yolo_u8_per_tensor.onnx")))) == 54


@pytest.mark.parametrize("entry", CASES, ids=lambda e: e.name)
def test_default_mode_keeps_the_activated_branch_float(entry, tmp_path):
    out, _ = fixed(entry, tmp_path, "--target", "trt")
    model = onnx.load(str(out))
    assert conv_activation_qdq(model) == []
    modes = residual_modes(model)
    assert set(modes.values()) <= {"float-branch"}, modes
    if entry.name in SILU:
        assert len(modes) == 3  # the three C3 bottleneck Adds
    assert conversion_layers(out) <= conversion_layers(entry.path)


@pytest.mark.parametrize("entry", [e for e in CASES if e.name in SILU], ids=lambda e: e.name)
def test_shared_mode_puts_both_inputs_on_one_scale(entry, tmp_path):
    rules = tmp_path / "shared.toml"
    rules.write_text('extends = "trt"\n[params]\nresidual_after_activation = "shared"\n')
    out, report = fixed(entry, tmp_path, "--rules", rules)
    model = onnx.load(str(out))
    assert conv_activation_qdq(model) == []
    assert sorted(residual_modes(model).values()) == ["shared"] * 3
    assert not [f for f in report["remaining"] if f["code"] in ("QDQ803", "QDQ806", "QDQ807")]
