"""QDQ507's zero-points at one-sided activations' bounds and QDQ508's narrowed weights on real exports.

QDQ507 keeps every grid point, so with graph optimisations off the fixed model gives bit-identical
outputs on inputs whose activations stay inside the old grids (corpus files of PyTorch and onnxruntime). After
the whole `ort` fix no adjacent weight pair can saturate onnxruntime's 16-bit pair sums (u8×s8
without VNNI) for any input, as the benchmark's simulator counts them from the file with onnx and
numpy alone; and on a CPU that saturates, the fused model agrees with the unfused one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import ort_session, run_ort, saturation_not_shown
from optional import torch_or_skip

from qdq.engine.fix import fix
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model, save_model

ORT = load_target("ort")
CORPUS = Path(__file__).resolve().parent / "corpus"
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "ort_speed.py"


def samples(arch: str) -> np.ndarray:
    return np.load(CORPUS / "float" / f"{arch}.npz")["input"].astype(np.float32)


def saturation(path: Path, x: np.ndarray) -> dict[str, int]:
    torch_or_skip()  # the simulator is benchmarks/ort_speed.py's, which builds its networks in PyTorch
    spec = importlib.util.spec_from_file_location("ort_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.saturation(path, x)


def silu_graph() -> GraphBuilder:
    """x → Q/DQ → Sigmoid → Q/DQ(1/256, zp 0) → Mul(x, ·) → Q(0.05, zp 128 uint8) → DQ → y, as FX exports SiLU."""
    b = GraphBuilder()
    x = b.input("x", [1, 1, 4, 8])

    def qdq(t, name, scale, zp):
        params = [b.init(f"{name}_s", np.float32(scale)), b.init(f"{name}_zp", np.uint8(zp))]
        q = b.node("QuantizeLinear", [t, *params], [f"{name}_int"], name=f"{name}_q")
        return b.node("DequantizeLinear", [q, *params], [f"{name}_deq"], name=f"{name}_dq")

    xd = qdq(x, "x", 0.04, 128)
    gate = qdq(b.node("Sigmoid", [xd], ["sig"], name="sigmoid"), "g", 1 / 256, 0)
    b.output(qdq(b.node("Mul", [xd, gate], ["silu"], name="mul"), "y", 0.05, 128), [1, 1, 4, 8])
    return b


def test_silu_zero_point_moves_to_its_bound_and_keeps_the_grid(tmp_path):
    path = silu_graph().save(tmp_path / "silu.onnx")
    model = load_model(path)
    [finding] = [f for f in lint(model, ORT.narrowed(select=["QDQ507"])).findings]
    # The least x · sigmoid~(x) on the 1/256 grid lies a little below -0.27846: round(0.279 / 0.05) = 6.
    assert finding.values["op"] == "Mul(x, Sigmoid(x))" and -0.29 < finding.values["bound"] < -0.2784
    assert finding.values["zero_point"] == 128 and finding.values["expected"] == 6
    fix(model, ORT.narrowed(select=["QDQ507"]))
    save_model(model, tmp_path / "fixed.onnx")
    x = np.linspace(-5.1, 5.1, 32, dtype=np.float32).reshape(1, 1, 4, 8)  # SiLU stays below 127 · 0.05
    (before,), (after,) = run_ort(path, {"x": x}), run_ort(tmp_path / "fixed.onnx", {"x": x})
    assert np.array_equal(before, after) and before.min() < -0.25


# Corpus files in which QDQ507 moves zero-points, with the architecture of their samples.
MOVED = {"torch/yolo_fx_qat_qnnpack.onnx": "yolo", "torch/resnet_fx_qat_pow2_qdq.onnx": "resnet",
         "ort/resnet_s8_symmetric_per_channel.onnx": "resnet", "ort/yolo_u8_per_tensor.onnx": "yolo"}


@pytest.mark.parametrize("name", MOVED)
def test_zero_points_keep_outputs_bit_identical_inside_the_old_grids(name, tmp_path):
    """The file with only QDQ505 (exact) and with QDQ505 + QDQ507 applied, unfused, on the samples whose
    activations in the moved groups all stay below the old representable maximum."""
    exact, moved = load_model(CORPUS / name), load_model(CORPUS / name)
    fix(exact, ORT.narrowed(select=["QDQ505"]))
    result = fix(moved, ORT.narrowed(select=["QDQ505", "QDQ507"]))
    changes = [c for c in result.changes if c.code == "QDQ507"]
    assert changes
    save_model(exact, tmp_path / "exact.onnx")
    save_model(moved, tmp_path / "moved.onnx")
    probe = onnx.load(str(tmp_path / "exact.onnx"))
    watched = {c.tensor: c.values["old_max"] for c in changes}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in watched)
    onnx.save(probe, str(tmp_path / "probe.onnx"))
    input_name = probe.graph.input[0].name
    probed, exact_run, moved_run = (ort_session(tmp_path / f) for f in ("probe.onnx", "exact.onnx", "moved.onnx"))
    compared = 0
    for row in samples(MOVED[name]):
        feeds = {input_name: row[None]}
        values = probed.run(None, feeds)[-len(watched):]
        if any(np.max(v) > old_max for v, old_max in zip(values, watched.values())):
            continue  # the old grid saturated here; the new one represents it
        before, after = exact_run.run(None, feeds), moved_run.run(None, feeds)
        assert all(np.array_equal(a, b) for a, b in zip(before, after))
        compared += 1
    assert compared >= 4


@pytest.mark.parametrize(("source", "arch"), [
    ("torch/yolo_fx_qat_qnnpack.onnx", "yolo"),
    ("torch/resnet_fx_qat_qnnpack.onnx", "resnet"),
    ("ort/transformer_default.onnx", "transformer"),  # onnxruntime's own PTQ: its MatMuls saturate too
])
def test_no_pair_can_saturate_after_the_fix(source, arch, tmp_path):
    source = CORPUS / source
    x = samples(arch)
    unchecked, model = load_model(source), load_model(source)
    fix(unchecked, ORT.narrowed(ignore=["QDQ508"]))
    assert fix(model, ORT).converged
    save_model(unchecked, tmp_path / "unchecked.onnx")
    save_model(model, tmp_path / "fixed.onnx")
    before, after = saturation(tmp_path / "unchecked.onnx", x), saturation(tmp_path / "fixed.onnx", x)
    assert any(worst for _, worst in before.values())  # without QDQ508 some pairs can
    # (a Conv reading one channel now has uint8 weights and runs u8×u8: it drops out of the count)
    assert after and set(after) <= set(before) and not any(worst for _, worst in after.values())
    reason = saturation_not_shown()
    if reason:
        pytest.skip(reason)
    # On this CPU the fused kernels saturate: the fused model drifts from the unfused one without QDQ508, not with it.
    gap = {}
    for name in ("unchecked.onnx", "fixed.onnx"):
        plain, optimized = ort_session(tmp_path / name), ort_session(tmp_path / name, optimized=True)
        unfused = np.concatenate([plain.run(None, {"input": row[None]})[0] for row in x])
        fused = np.concatenate([optimized.run(None, {"input": row[None]})[0] for row in x])
        gap[name] = sqnr(unfused, fused)
    assert gap["fixed.onnx"] > 30 and gap["fixed.onnx"] > gap["unchecked.onnx"] + 10, gap


def sqnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    noise = np.sum((reference.astype(np.float64) - candidate) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / noise))


def test_zero_points_an_integer_clip_reads_stay(tmp_path):
    """PyTorch x86 exports clip an activation's integers (Q → Clip(0, 127) → DQ), pt2e a weight's (Clip(-127, 127)):
    a moved zero-point would make those Clips cut other values, so QDQ507 leaves them."""
    name = "torch/yolo_fx_qat_x86.onnx"
    exact, moved = load_model(CORPUS / name), load_model(CORPUS / name)
    fix(exact, ORT.narrowed(select=["QDQ505", "QDQ805"]))
    fix(moved, ORT.narrowed(select=["QDQ505", "QDQ805", "QDQ507"]))  # QDQ805's Sigmoid Qs bound more SiLUs
    save_model(exact, tmp_path / "exact.onnx")
    save_model(moved, tmp_path / "moved.onnx")
    exact_run, moved_run = ort_session(tmp_path / "exact.onnx"), ort_session(tmp_path / "moved.onnx")
    for row in samples("yolo")[:4]:
        feeds = {"input": row[None]}
        assert all(np.array_equal(a, b) for a, b in zip(exact_run.run(None, feeds), moved_run.run(None, feeds)))
    pt2e = load_model(CORPUS / "torch/yolo_pt2e_xnnpack_unfolded.onnx")
    result = fix(pt2e, ORT.narrowed(select=["QDQ505", "QDQ805", "QDQ507"]))
    moved_tensors = {c.tensor for c in result.changes if c.code == "QDQ507"}
    assert moved_tensors and not any(t.endswith("weight") for t in moved_tensors)
