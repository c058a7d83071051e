"""QDQ503 keeps the clip of a Relu that onnxruntime folded into a Q (zero-point at the type minimum).

onnxruntime's `quantize_static` drops a Relu before a Q and gives that Q zero-point -128 (int8)
or 0 (uint8), so the Q clips at 0. Making the grid symmetric without the Relu let negative values
through: on the corpus ResNet the npu and trt fixes moved the outputs rel L2 2.1-2.5 from the
input model and were not written. The outputs here are measured with onnxruntime directly, on
the 16 calibration samples of `tests/corpus/float/resnet.npz`.

The npu rule set puts back a Clip(0, top) (`keep_clip = "clip"`), TensorRT's a Relu: the NPU's
power-of-two scale is rounded up afterwards and would let values past the old grid's top through
(a hard-swish's folded Clip(0, 6): PP-OCR's detector lost 0.35 F1 that way).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import GraphBuilder
from cli_run import qdq
from conftest import run_ort
from onnx import TensorProto, helper, numpy_helper

from qdq.engine.fix import fix
from qdq.engine.ruleset import load_rules_file, load_target
from qdq.graph.model import load_model, save_model
from qdq.support.errors import RuleSetError

CORPUS = Path(__file__).resolve().parent / "corpus"
SAMPLES = CORPUS / "float" / "resnet.npz"

# Rel L2 of the fixed model's logits against the input model's, over the 16 samples.
# Measured: before this fix (HEAD 31081d6, with --keep-failed) 2.43 npu / 2.06 trt on
# resnet_default and 2.49 / 2.13 on resnet_u8_per_channel_reduce_range; with it 0.077 / 0.069
# and 0.173 / 0.024 (the npu 0.17 is the per-channel weights made per-tensor, QDQ502).
# resnet_u8_per_tensor is not used: onnxruntime's own U8S8 kernel already puts that input
# model rel L2 0.54 from the float model, so "close to the input" means nothing there.
BOUNDS = {
    ("resnet_default", "npu"): 0.1,
    ("resnet_default", "trt"): 0.1,
    ("resnet_u8_per_channel_reduce_range", "npu"): 0.25,
    ("resnet_u8_per_channel_reduce_range", "trt"): 0.05,
}
# onnxruntime's uint8 per-tensor default: checked for the Relus and the exit code only (see above).
STRUCTURE = [*BOUNDS, ("resnet_u8_per_tensor", "npu"), ("resnet_u8_per_tensor", "trt")]
# The op each rule set puts back (its QDQ503 `keep_clip`).
CLIP_OP = {"npu": "Clip", "trt": "Relu"}


def samples() -> np.ndarray:
    with np.load(SAMPLES) as archive:
        return archive["input"]


def logits(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": x[i : i + 1]})[0] for i in range(len(x))])


def zero_point_at_minimum(model: onnx.ModelProto) -> dict[str, str]:
    """Name of each Q whose zero-point is the type minimum → the float tensor it quantizes."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            zp = inits[node.input[2]]
            if zp.size == 1 and zp.ravel()[0] == np.iinfo(zp.dtype).min:
                found[node.name] = node.input[0]
    return found


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """Each corpus model fixed for each target, as a user runs it (first sample as --inputs)."""
    folder = tmp_path_factory.mktemp("folded_relu")
    first = folder / "first.npz"
    np.savez(first, input=samples()[:1])
    runs = {}
    for model, target in STRUCTURE:
        out, report = folder / f"{model}_{target}.onnx", folder / f"{model}_{target}.json"
        run = qdq("fix", CORPUS / "ort" / f"{model}.onnx", "--target", target, "-o", out, "--inputs", first,
                  "--report", report, "--keep-failed")
        runs[model, target] = (run, out, json.loads(report.read_text()))
    return runs


@pytest.mark.parametrize("model,target", list(BOUNDS))
def test_fix_keeps_outputs_close_to_the_input_model(fixed, model, target):
    run, out, report = fixed[model, target]
    # The verdict may refuse an NPU conversion of these float-scale models (the error of power-of-two
    # scales can be several times the model's own); written with --keep-failed, it must be lint-clean
    # and close to its input by this test's own measure.
    assert run.code in (0, 1) and out.exists(), run.out + run.err
    assert report["remaining"] == [] and report["verification"] is not None
    x = samples()
    before, after = logits(CORPUS / "ort" / f"{model}.onnx", x), logits(out, x)
    rel = np.linalg.norm(after - before) / np.linalg.norm(before)
    assert rel < BOUNDS[model, target]
    assert np.array_equal(after.argmax(1), before.argmax(1))


@pytest.mark.parametrize("model,target", STRUCTURE)
def test_every_folded_relu_is_back_and_only_there(fixed, model, target):
    run, out, report = fixed[model, target]
    assert run.code in (0, 1) and report["remaining"] == [], run.out + run.err
    source = onnx.load(str(CORPUS / "ort" / f"{model}.onnx"))
    result = onnx.load(str(out))
    clipped = zero_point_at_minimum(source)
    readers = {}
    for node in result.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    op = CLIP_OP[target]
    new_relus = [n for n in result.graph.node if n.op_type == op]
    # The float model has 7 Relus, all folded by onnxruntime; the Qs after the pool and Flatten
    # (also zero-point at the minimum) read values that are already non-negative and get none.
    float_relus = sum(n.op_type == "Relu" for n in onnx.load(str(CORPUS / "float" / "resnet.onnx")).graph.node)
    assert len(new_relus) == float_relus == 7
    for relu in new_relus:
        (reader,) = readers[relu.output[0]]
        assert reader.op_type == "QuantizeLinear" and reader.name in clipped  # right before a clipping Q
        assert relu.input[0] == clipped[reader.name]  # reading what that Q read
    reported = [c for c in report["changes"] if f"{op}" in c["description"] and "re-inserted" in c["description"]]
    assert len(reported) == 7 and all(c["code"] == "QDQ503" for c in reported)

    # No value a Q with the old zero-point clipped can be negative now: expose what each such Q
    # reads (for TensorRT the Q before the 10-class head is gone with the head's Q/DQ, QDQ808).
    probe = onnx.load(str(out))
    quantized = {n.name: n.input[0] for n in probe.graph.node if n.op_type == "QuantizeLinear"}
    names = sorted({quantized[q] for q in clipped if q in quantized})
    assert len(names) >= 7
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = samples()
    for i in range(len(x)):
        values = session.run(names, {"input": x[i : i + 1]})
        assert min(float(v.min()) for v in values) >= 0.0


# --- hand-built ------------------------------------------------------------------------------------


def folded(tmp_path: Path, producer: str = "Neg") -> Path:
    """x → {producer} → Q(zp -128) → DQ → y, and the same float tensor read unclipped by a Mul → z."""
    b = GraphBuilder()
    x = b.input("x", [2, 8])
    h = b.node(producer, [x], ["h"], name="producer")
    b.output(b.dq(b.q(h, scale=0.02, zero_point=-128, name="q"), scale=0.02, zero_point=-128, name="dq"), [2, 8])
    b.output(b.node("Mul", [h, b.init("two", np.float32(2.0))], ["z"], name="other_reader"), [2, 8])
    return b.save(tmp_path / f"{producer}.onnx")


def fix_503(path: Path, ruleset) -> tuple[list, Path]:
    model = load_model(path)
    changes = fix(model, ruleset.narrowed(select=["QDQ503"])).changes
    out = path.with_name(path.stem + "_fixed.onnx")
    save_model(model, out)
    return changes, out


@pytest.mark.parametrize("target", ["npu", "trt"])
def test_hand_built_clip_is_kept_on_the_q_path_only(tmp_path, target):
    path = folded(tmp_path)
    changes, out = fix_503(path, load_target(target))
    op = CLIP_OP[target]
    assert [c.new.split()[0] for c in changes] == [op, "0.0401575"]  # the clip, then 255·0.02/127
    assert f"{op}" in changes[0].description and "re-inserted" in changes[0].description
    feeds = {"x": np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)}
    (y0, z0), (y1, z1) = run_ort(path, feeds), run_ort(out, feeds)
    assert y1.min() >= 0 and np.all(y1[y0 == 0] == 0)  # what the old Q clipped stays 0
    assert np.max(np.abs(y1 - y0)) <= 0.0401575 / 2 + 1e-6  # the rest within half a new step
    assert np.array_equal(z1, z0) and z0.min() < 0  # the other reader of h is not clipped
    producer = {o: n for n in onnx.load(str(out)).graph.node for o in n.output}
    q = next(n for n in onnx.load(str(out)).graph.node if n.name == "q")
    assert producer[q.input[0]].op_type == op


def test_npu_keeps_the_old_top_when_the_scale_is_rounded_up(tmp_path):
    """The old grid clipped at 255·0.02 = 5.1 (a folded Clip(0, 6) stops short of 6 on calibration data);
    QDQ504 rounds 5.1/127 up to 2^-4, whose grid reaches 7.94: without the Clip, x in (5.1, 7.94] got
    through (a Relu alone kept only the bottom)."""
    path = folded(tmp_path)
    model = load_model(path)
    changes = fix(model, load_target("npu").narrowed(select=["QDQ503", "QDQ504"])).changes
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    assert any(c.new.startswith("Clip") and "5.1" in c.description for c in changes)
    feeds = {"x": np.linspace(-8, 8, 16, dtype=np.float32).reshape(2, 8)}
    (y0, _), (y1, _) = run_ort(path, feeds), run_ort(out, feeds)
    assert y0.max() == pytest.approx(5.1, abs=1e-6) and y1.max() <= 5.1 + 2**-4 / 2  # saturates where the input did
    assert np.max(np.abs(y1 - y0)) <= 2**-4 / 2 + 1e-6  # everywhere within half a step of the new grid


def test_hand_built_nonnegative_input_gets_no_relu(tmp_path):
    changes, out = fix_503(folded(tmp_path, "Sigmoid"), load_target("npu"))
    assert len(changes) == 1 and "Relu" not in changes[0].description
    assert sum(n.op_type == "Relu" for n in onnx.load(str(out)).graph.node) == 0


def test_keep_clip_off_and_bad_values(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('extends = "npu"\n[rules.QDQ503]\nkeep_clip = ""\n')
    changes, _ = fix_503(folded(tmp_path), load_rules_file(rules))
    assert len(changes) == 1 and "Relu" not in changes[0].description  # the old behaviour, on request
    rules.write_text('extends = "npu"\n[rules.QDQ503]\nkeep_clip = "relu6"\n')
    with pytest.raises(RuleSetError, match="keep_clip"):
        fix_503(folded(tmp_path), load_rules_file(rules))
