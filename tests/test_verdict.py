"""The verdict: a change judged against the input model's float twin, one criterion in fix and verify.

Each model here is built so that the two old gates got it wrong: a fix that moves the outputs a
lot but brings them closer to the float computation (a clip point moved to where the data is),
and one that keeps 20 dB against the input while tripling the quantization error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import GraphBuilder
from cli_run import qdq
from onnx import TensorProto, helper, numpy_helper

from qdq.engine.ruleset import load_target
from qdq.verification.twin import float_twin

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float32)
COVERAGE = load_target("common").rules["QDQ006"].params


def conv_net(path: Path, x_scale: float, y_scale: float, clip: bool = False) -> Path:
    """x → Q/DQ(x_scale) → Conv(int8 weight) → Relu → Q/DQ(y_scale) → y (uint8 output grid)."""
    b = GraphBuilder(opset=13)
    x = b.input("x", [1, 4, 16, 16])
    params = b.qparams("x", x_scale, 0, np.int8)
    xq = b.node("QuantizeLinear", [x, *params], name="xq")
    if clip:  # PyTorch's reduced range: an integer Clip between Q and DQ
        xq = b.node("Clip", [xq, b.init("lo", np.int8(-64)), b.init("hi", np.int8(63))], name="clip")
    xd = b.node("DequantizeLinear", [xq, *params], name="xdq")
    conv = b.node("Conv", [xd, b.weight("w", W, 0.01)], name="conv", pads=[1, 1, 1, 1])
    relu = b.node("Relu", [conv], name="relu")
    b.node("Identity", [b.qdq(relu, y_scale, 0, np.uint8, name="y")], ["y"], name="out")
    b.output("y", [1, 8, 16, 16])
    return b.save(path)


def run(path_or_model, feeds):
    source = path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto) else str(path_or_model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


# --- the twin ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [False, True])
def test_the_twin_computes_in_float_with_the_dequantized_weights(tmp_path, clip):
    model = onnx.load(str(conv_net(tmp_path / "m.onnx", 0.02, 0.05, clip=clip)))
    twin = float_twin(model, COVERAGE)
    assert twin.reason is None and twin.pairs == 2
    ops = [n.op_type for n in twin.model.graph.node]
    assert ops.count("QuantizeLinear") == 0 and ops.count("DequantizeLinear") == 1 and "Clip" not in ops  # Relu feeds y's Q
    x = RNG.uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    w = np.clip(np.round(W / np.float32(0.01)), -127, 127).astype(np.float32) * np.float32(0.01)
    reference = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "float", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    np.testing.assert_allclose(run(twin.model, {"x": x}), run(reference, {"x": x}), rtol=1e-5, atol=1e-5)


def test_no_twin_without_activation_pairs_or_with_integer_kernels(tmp_path):
    b = GraphBuilder(opset=13)
    b.node("Conv", [b.input("x", [1, 4, 8, 8]), b.weight("w", W, 0.01)], ["y"], name="conv")
    b.output("y", [1, 8, 6, 6])
    assert "no activation" in float_twin(b.model(), COVERAGE).reason
    proto = onnx.load(str(Path(__file__).parent / "corpus" / "ort" / "resnet_qoperator.onnx"))
    assert "QLinearConv" in float_twin(proto, COVERAGE).reason


# --- the verdict ------------------------------------------------------------------------------------


def test_a_fix_closer_to_the_float_computation_passes_though_it_moves_the_outputs(tmp_path):
    """On these samples the input's output grid clips most of what the Conv writes (scale far too
    fine); the candidate's does not. Against the input the outputs moved a lot (SQNR under 10 dB),
    but the candidate is much closer to the float twin: the fix is kept."""
    clipped = conv_net(tmp_path / "clipped.onnx", 0.02, 0.002)
    roomy = conv_net(tmp_path / "roomy.onnx", 0.02, 0.05)
    np.savez(tmp_path / "x.npz", x=RNG.uniform(-2.5, 2.5, (4, 4, 16, 16)).astype(np.float32))
    run_ = qdq("verify", clipped, roomy, "--target", "npu", "--inputs", tmp_path / "x.npz", "--format", "json")
    document = run_.json()
    (o,) = document["outputs"]
    assert run_.code == 0 and o["passed"], document
    assert o["sqnr_db"] < 10 and o["candidate_to_twin"] < o["input_to_twin"] / 2
    assert document["twin"].startswith("float twin (2 activation")


def test_a_fix_that_triples_the_quantization_error_fails_though_it_keeps_20_db(tmp_path):
    fine = conv_net(tmp_path / "fine.onnx", 0.01, 0.02)
    coarse = conv_net(tmp_path / "coarse.onnx", 0.08, 0.16)
    run_ = qdq("verify", fine, coarse, "--target", "npu", "--format", "json")
    (o,) = run_.json()["outputs"]
    assert run_.code == 1 and not o["passed"]
    assert o["sqnr_db"] > 10  # the old gate would have passed it
    assert o["candidate_to_twin"] > o["allowed"] >= o["input_to_twin"]


def dead(path: Path, shift: float) -> Path:
    """Relu of a large negative constant: zero on every input."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 8]), 0.02)
    y = b.node("Relu", [b.node("Add", [x, b.init("shift", np.float32(shift))], name="add")], name="relu")
    b.node("Identity", [b.qdq(y, 0.02)], ["y"], name="out")
    b.output("y", [1, 8])
    return b.save(path)


def test_an_output_that_tells_nothing_is_no_evidence(tmp_path):
    """Identical candidate or not, no pass; and no distance is shown as if it judged anything: the row
    says why it tells nothing, the JSON keeps the distances from the twin apart, under `unjudged`."""
    reference, candidate = dead(tmp_path / "a.onnx", -100.0), dead(tmp_path / "b.onnx", -101.0)
    run_ = qdq("verify", reference, candidate, "--target", "trt")
    assert run_.code == 1, run_.out
    (row,) = [line for line in run_.out.splitlines() if line.startswith("y ")]
    assert row.split()[2:9] == ["-"] * 7 and row.endswith("no evidence: the input model writes 0 everywhere"), row
    assert run_.out.splitlines()[-1].startswith("INCONCLUSIVE: y carries no information on these inputs (the input "
                                                "model writes 0 everywhere)"), run_.out
    (o,) = qdq("verify", reference, candidate, "--target", "trt", "--format", "json").json()["outputs"]
    assert (o["input_to_twin"], o["candidate_to_twin"], o["allowed"]) == (None, None, None), o
    assert o["unjudged"] == {"input_to_twin": 0.0, "candidate_to_twin": 0.0} and not o["evidence"]
    assert o["no_evidence"] == "the input model writes 0 everywhere"


def test_fix_says_a_verdict_without_evidence_is_not_a_move_past_tolerance(tmp_path):
    """The fix report is verify's, and its last line does not claim the outputs moved."""
    run_ = qdq("fix", dead(tmp_path / "a.onnx", -100.0), "--target", "npu", "-o", tmp_path / "out.onnx")
    assert run_.code == 1 and not (tmp_path / "out.onnx").exists()
    assert "no evidence: the input model writes 0 everywhere" in run_.out, run_.out
    assert run_.out.rstrip().endswith("not written: no evidence on these inputs to judge the outputs by, give --inputs "
                                      "(use --keep-failed to write it anyway)"), run_.out


def test_inputs_on_which_the_twin_tells_nothing_are_not_run_through_the_other_models(tmp_path, monkeypatch):
    """The twin runs first on the random inputs; where its outputs say nothing, the input and fixed models
    run only on the next inputs tried (at 100k nodes, a whole model's pieces built for nothing)."""
    from qdq.verification import verdict
    from qdq.verification.verdict import Criterion, judge

    ran = []
    outputs = verdict._Runs.outputs
    monkeypatch.setattr(verdict._Runs, "outputs", lambda self, samples, label, *twin: ran.append(label)
                        or outputs(self, samples, label, *twin))
    ruleset = load_target("trt")
    result = judge(dead(tmp_path / "a.onnx", -100.0), dead(tmp_path / "b.onnx", -101.0), ruleset,
                   Criterion.of(ruleset))
    assert [o.evidence for o in result.outputs] == [False]
    assert len(ran) == 1 and ran[0] == result.inputs and "smooth" not in ran[0]  # the white noise tried second


def test_fix_and_verify_give_one_verdict(tmp_path):
    """`qdq verify X X_fixed` agrees with the `qdq fix` that wrote X_fixed: numbers, criterion, verdict."""
    model = conv_net(tmp_path / "m.onnx", 0.03, 0.07)
    out = tmp_path / "fixed.onnx"
    fix = qdq("fix", model, "--target", "npu", "-o", out, "--format", "json", "--isolated", "--keep-failed")
    verdict = fix.json()["verification"]
    again = qdq("verify", model, out, "--target", "npu", "--format", "json", "--isolated").json()
    assert again["outputs"] == verdict["outputs"] and again["criterion"] == verdict["criterion"]
    assert again["passed"] == verdict["passed"] and again["inputs"] == verdict["inputs"]


def weight_only_net(path: Path, w_scale: float) -> Path:
    """x → Conv(DQ of int8 weight) → Relu → y: no activation Q/DQ, so no twin and no deepest tensors read out."""
    b = GraphBuilder(opset=13)
    conv = b.node("Conv", [b.input("x", [1, 4, 16, 16]), b.weight("w", W, w_scale)], name="conv", pads=[1, 1, 1, 1])
    b.node("Relu", [conv], ["y"], name="relu")
    b.output("y", [1, 8, 16, 16])
    return b.save(path)


def test_the_fixed_model_runs_in_the_session_fix_built_to_check_it(tmp_path, monkeypatch):
    """`qdq fix` hands the verdict onnxruntime's session of the file it wrote: where the fix changed
    most of the model, the verdict runs it instead of building the model again, to the same numbers.
    Not where the verdict reads the network's deepest tensors out, which the file's session does not
    output: a model without activation Q/DQ has none."""
    from qdq.support.runtime import session
    from qdq.verification.pieces import Pieces
    from qdq.verification.verdict import Criterion, judge

    model, candidate = weight_only_net(tmp_path / "m.onnx", 0.01), weight_only_net(tmp_path / "c.onnx", 0.011)
    ruleset = load_target("npu")
    built = []
    source = Pieces._source
    monkeypatch.setattr(Pieces, "_source", lambda self, *args: built.append(self.model) or source(self, *args))
    opened = [session(candidate)]
    given = judge(model, candidate, ruleset, Criterion.of(ruleset), opened=opened).to_dict()
    sessions_given = len(built)
    alone = judge(model, candidate, ruleset, Criterion.of(ruleset)).to_dict()
    assert opened == [] and sessions_given == len(built) - sessions_given - 1
    assert given == alone
    built.clear()
    model, candidate = conv_net(tmp_path / "m2.onnx", 0.03, 0.07), conv_net(tmp_path / "c2.onnx", 0.04, 0.05)
    judge(model, candidate, ruleset, Criterion.of(ruleset), opened=[session(candidate)])
    with_deepest = len(built)
    judge(model, candidate, ruleset, Criterion.of(ruleset))
    assert with_deepest == len(built) - with_deepest  # the deepest tensors are read out: the region is built


def test_the_ort_target_judges_what_onnxruntime_runs_by_default(tmp_path):
    model = conv_net(tmp_path / "m.onnx", 0.03, 0.07)
    for target, runtime in (("ort", "onnxruntime, default optimisations"), ("npu", "onnxruntime, optimisations off")):
        document = qdq("verify", model, model, "--target", target, "--format", "json").json()
        assert document["runtime"] == runtime and document["identical"]


def test_twin_of_a_model_with_external_weights(tmp_path):
    """The twin reads the input's external data where it lies: nothing copied, nothing written beside the input."""
    proto = onnx.load(str(conv_net(tmp_path / "m.onnx", 0.03, 0.07)))
    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save(proto, str(folder / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    before = sorted(p.name for p in folder.iterdir())
    run_ = qdq("verify", folder / "m.onnx", folder / "m.onnx", "--target", "npu", "--format", "json")
    assert run_.code == 0 and run_.json()["twin"].startswith("float twin"), run_.err
    assert sorted(p.name for p in folder.iterdir()) == before


def test_random_inputs_stay_where_the_quantizers_saturate_rarely(tmp_path):
    """A conv whose output grid covers only a quarter of what full-range input drives it to: the
    inputs are drawn at a smaller amplitude, and the label says so."""
    model = conv_net(tmp_path / "m.onnx", 0.02, 0.002)
    label = qdq("verify", model, model, "--target", "npu", "--format", "json").json()["inputs"]
    assert "smooth" in label and "of the input range" in label and "whole" not in label, label


@pytest.mark.parametrize("table, expect", [
    ("margin = -1", "[verdict] margin must be a number >= 0"),
    ("deep_margin = -0.5", "[verdict] deep_margin must be a number >= 0"),
    ("deep_epsilon = \"wide\"", "[verdict] deep_epsilon must be a number >= 0"),
    ("deep_epsilon = true", "[verdict] deep_epsilon must be a number >= 0"),
    ("runtime = \"gpu\"", "[verdict] runtime must be \"exact\" or \"optimized\""),
    ("samples = 0", "[verdict] samples must be a whole number >= 1"),
    ("tolerance = 3", "[verdict] has unknown key(s) tolerance"),
])
def test_a_broken_verdict_table_is_one_line_exit_2(tmp_path, table, expect):
    model = conv_net(tmp_path / "m.onnx", 0.03, 0.07)
    rules = tmp_path / "mine.toml"
    rules.write_text(f'extends = "npu"\n[verdict]\n{table}\n')
    for command in (("verify", model, model), ("fix", model, "-o", tmp_path / "out.onnx")):
        run_ = qdq(*command, "--rules", rules)
        assert run_.code == 2 and expect in run_.err and len(run_.err.splitlines()) == 1, run_.err
    assert not (tmp_path / "out.onnx").exists()


def test_a_margin_in_your_rules_file_decides(tmp_path):
    """The same pair fails with the shipped margins and passes with wider ones from the user's file."""
    fine = conv_net(tmp_path / "fine.onnx", 0.01, 0.02)
    coarse = conv_net(tmp_path / "coarse.onnx", 0.08, 0.16)
    assert qdq("verify", fine, coarse, "--target", "npu").code == 1
    rules = tmp_path / "wide.toml"
    rules.write_text('extends = "npu"\n[verdict]\nmargin = 100\ndeep_margin = 100\n')
    assert qdq("verify", fine, coarse, "--rules", rules).code == 0


def test_a_q_that_stands_for_a_removed_relu_keeps_its_clip_in_the_twin(tmp_path):
    """onnxruntime's quantizer deletes `Relu → Q` when the Q's zero-point is the type minimum: the Q's
    saturation is the Relu. The twin keeps it, or it would compute another network."""
    b = GraphBuilder(opset=13)
    x = b.input("x", [1, 8])
    b.node("Identity", [b.qdq(x, 0.02, 0, np.uint8, name="a")], ["y"], name="out")  # range [0, 5.1]
    b.output("y", [1, 8])
    twin = float_twin(b.model(), COVERAGE)
    values = np.linspace(-3, 7, 8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_allclose(run(twin.model, {"x": values}), np.clip(values, 0, 255 * np.float32(0.02)), rtol=1e-6)
    symmetric = GraphBuilder(opset=13)
    symmetric.node("Identity", [symmetric.qdq(symmetric.input("x", [1, 8]), 0.02, 0, np.int8, name="a")], ["y"],
                   name="out")
    symmetric.output("y", [1, 8])
    np.testing.assert_array_equal(run(float_twin(symmetric.model(), COVERAGE).model, {"x": values}), values)


@pytest.mark.parametrize("between, clipped, reduced", [
    ("GlobalAveragePool", False, False),  # averages non-negative values: no Relu was removed before the last Q
    ("GlobalAveragePool", False, True),  # the first pair a reduced range, Q → Clip(0, 127) → DQ: the same
    ("Flatten", False, False),
    ("Neg", True, False),  # makes them negative: the last Q's saturation may be a removed Relu's work
])
def test_a_q_over_values_already_non_negative_does_not_clip_in_the_twin(tmp_path, between, clipped, reduced):
    """NNCF's ResNet: Relu → Q → DQ → GlobalAveragePool → Q(uint8, zero point 0). Nothing was removed
    before the last Q; clipping the twin at its top would copy the input's saturation into the reference."""
    b = GraphBuilder(opset=13)
    relu = b.node("Relu", [b.input("x", [1, 8, 4, 4])], name="relu")
    params = b.qparams("a", 0.1, 0, np.uint8)
    integers = b.node("QuantizeLinear", [relu, *params], name="aq")
    if reduced:
        integers = b.node("Clip", [integers, b.init("lo", np.uint8(0)), b.init("hi", np.uint8(127))], name="clip")
    mid = b.node(between, [b.node("DequantizeLinear", [integers, *params], name="adq")], name="between")
    b.node("Identity", [b.qdq(mid, 0.01, 0, np.uint8, name="b")], ["y"], name="out")  # range [0, 2.55]
    b.output("y", [1, 8, 1, 1] if between == "GlobalAveragePool" else [1, 128] if between == "Flatten" else [1, 8, 4, 4])
    twin = float_twin(b.model(), COVERAGE)
    values = np.linspace(-2, 9, 128, dtype=np.float32).reshape(1, 8, 4, 4)
    got = run(twin.model, {"x": values})
    unclipped = {"GlobalAveragePool": np.maximum(values, 0).mean(axis=(2, 3), keepdims=True),
                 "Flatten": np.maximum(values, 0).reshape(1, 128), "Neg": -np.maximum(values, 0)}[between]
    expected = np.clip(unclipped, 0, 255 * np.float32(0.01)) if clipped else unclipped
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert got.max() > 2.55 or clipped, "the twin clipped values the input model's quantizer saturates"


def test_samples_that_all_give_the_same_output_are_no_evidence(tmp_path):
    """An integer input that random draws leave at zero (bytes one-hot encoded by ops, as magika
    does) feeds every sample alike: four equal outputs are one observation, and prove nothing."""
    b = GraphBuilder(opset=13)
    codes = b.node("Cast", [b.input("bytes", [1, 8], TensorProto.INT32)], name="cast", to=TensorProto.FLOAT)
    y = b.node("Add", [b.qdq(codes, 0.02), b.init("bias", np.linspace(-1, 1, 8, dtype=np.float32))], name="add")
    b.node("Identity", [b.qdq(y, 0.02)], ["y"], name="out")
    b.output("y", [1, 8])
    path = b.save(tmp_path / "m.onnx")
    run_ = qdq("verify", path, path, "--target", "trt")
    assert run_.code == 1 and "no evidence" in run_.out, run_.out
    np.savez(tmp_path / "bytes.npz", bytes=RNG.integers(0, 50, (3, 8)).astype(np.int32))
    assert qdq("verify", path, path, "--target", "trt", "--inputs", tmp_path / "bytes.npz").code == 0


def test_the_label_says_when_no_amplitude_keeps_the_quantizers_from_saturating(tmp_path):
    """An output grid far too fine for anything the Conv writes: even the smallest amplitude saturates it."""
    model = conv_net(tmp_path / "m.onnx", 0.02, 1e-6)
    label = qdq("verify", model, model, "--target", "npu", "--format", "json").json()["inputs"]
    assert "0.0625 of the input range: even so" in label and "saturate rarely" not in label, label


# --- a change that claims to be exact --------------------------------------------------------------


def relu_net(path: Path, mid_zero_point: int, mid_type) -> Path:
    """x → Q/DQ → Q/DQ(0.05, mid) → Relu → y: the Relu hides what the middle quantizer does to negatives."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 8, 8]), 0.025, name="x")
    mid = b.qdq(x, 0.05, mid_zero_point, mid_type, name="mid")
    b.node("Relu", [mid], ["y"], name="relu")
    b.output("y", [1, 4, 8, 8])
    return b.save(path)


@pytest.mark.parametrize("zero_point, dtype, exact", [
    (128, np.uint8, True),  # int8 → uint8 with the zero point moved along: the same values, other integers
    (0, np.uint8, False),  # negatives clipped to 0: the Relu hides it from the outputs, not from the integers
])
def test_an_exact_claim_is_held_to_the_integers_not_only_to_the_outputs(tmp_path, zero_point, dtype, exact):
    from qdq.verification.verdict import Criterion, judge

    reference = relu_net(tmp_path / "a.onnx", 0, np.int8)
    candidate = relu_net(tmp_path / "b.onnx", zero_point, dtype)
    ruleset = load_target("npu")
    result = judge(reference, candidate, ruleset, Criterion.of(ruleset), exact=True)
    assert result.identical and all(o.evidence for o in result.outputs)  # the outputs alone would pass
    assert result.integers == ["mid_q_out"]
    assert result.passed is exact and (result.integers_differing == []) is exact


# --- what the outputs cannot see -----------------------------------------------------------------


def quiet_head(path: Path, hidden_scale: float) -> Path:
    """x → Q/DQ → Conv → Relu → Q/DQ(hidden_scale) → pool → a softmax whose bias makes class 0 certain:
    on any input the output is almost [1, 0, 0], as a recognizer's is 'blank' on noise."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 16, 16]), 0.02)
    relu = b.node("Relu", [b.node("Conv", [x, b.weight("w", W, 0.01)], name="conv", pads=[1, 1, 1, 1])], name="relu")
    hidden = b.qdq(relu, hidden_scale, 0, np.uint8, name="h")
    pooled = b.node("Flatten", [b.node("GlobalAveragePool", [hidden], name="pool")], name="flat")
    head = (RNG.standard_normal((8, 3)) * 0.5).astype(np.float32)
    logits = b.node("Add", [b.node("MatMul", [pooled, b.init("head", head)], name="mm"),
                            b.init("bias", np.array([9.0, 0.0, 0.0], np.float32))], name="logits")
    b.node("Softmax", [logits], ["y"], name="softmax", axis=1)
    b.output("y", [1, 3])
    return b.save(path)


def test_a_nearly_constant_output_does_not_hide_a_broken_layer(tmp_path):
    """A hidden quantizer 64 times coarser barely moves a certain softmax (within epsilon of the twin),
    and leaves the layer it quantizes far from its float computation: the deepest tensors refuse it."""
    fine, coarse = quiet_head(tmp_path / "fine.onnx", 0.02), quiet_head(tmp_path / "coarse.onnx", 1.28)
    run_ = qdq("verify", fine, coarse, "--target", "npu", "--format", "json")
    document = run_.json()
    (o,) = document["outputs"]
    network = document["network"]
    assert o["passed"] and o["candidate_to_twin"] < 0.03, o  # the output alone would pass it
    assert not network["passed"] and network["candidate_to_twin"] > network["allowed"], network
    assert network["name"] == "deepest 2 quantized tensors"
    assert run_.code == 1 and not document["passed"]
    same = qdq("verify", fine, fine, "--target", "npu", "--format", "json").json()
    assert same["passed"] and same["network"]["candidate_to_twin"] == same["network"]["input_to_twin"]


def test_the_deepest_tensors_are_held_to_their_own_allowance(tmp_path):
    """`deep_margin`/`deep_epsilon` decide the deepest tensors' row, `margin`/`epsilon` the outputs': widening
    the outputs' margin leaves the broken layer refused, widening the deep row's lets it pass."""
    fine, coarse = quiet_head(tmp_path / "fine.onnx", 0.02), quiet_head(tmp_path / "coarse.onnx", 0.32)

    def verify(table: str) -> dict:
        rules = tmp_path / "mine.toml"
        rules.write_text(f'extends = "npu"\n[verdict]\n{table}\n')
        return qdq("verify", fine, coarse, "--rules", rules, "--format", "json").json()

    wide_outputs = verify("margin = 100\ndeep_margin = 0.5\ndeep_epsilon = 0.01")
    network = wide_outputs["network"]
    assert not wide_outputs["passed"] and not network["passed"]
    assert network["allowed"] == pytest.approx(network["input_to_twin"] * 1.5 + 0.01)
    assert "× 101 + 0.03 per output, × 1.5 + 0.01 for the deepest quantized tensors" in wide_outputs["criterion"]
    wide_deep = verify("margin = 0.5\ndeep_margin = 100")
    assert wide_deep["passed"] and wide_deep["network"]["passed"]
    assert wide_deep["outputs"][0]["allowed"] == pytest.approx(wide_deep["outputs"][0]["input_to_twin"] * 1.5 + 0.03)


def test_open_image_sides_get_the_networks_stride(tmp_path):
    """Two stride-4 convolutions shrink a side 16 times: an open height and width become 16, not 1."""
    from qdq.verification.meant_inputs import open_image_sizes

    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 16, 16]), 0.02)
    w = b.weight("w", W[:4], 0.01)
    y = b.node("Conv", [b.node("Conv", [x, w], name="c1", strides=[4, 4]), w], name="c2", strides=[4, 4])
    b.node("Identity", [b.node("Conv", [y, w], name="c3", strides=[1, 1])], ["y"], name="out")
    b.output("y", [1, 4, 1, 1])
    path = b.save(tmp_path / "m.onnx")
    model = onnx.load(str(path))
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_param = "side"
    assert open_image_sizes(model.graph) == {"x": (1, 4, 16, 16)}
    assert open_image_sizes(onnx.load(str(path)).graph) == {}  # a fixed size is the model's own


def test_a_one_hot_input_is_drawn_over_its_classes(tmp_path):
    """An integer input a one-hot compares with 0..256 (magika's bytes): drawn over those, not all zero."""
    from qdq.verification.verify import RandomInputs

    b = GraphBuilder(opset=13)
    codes = b.node("Reshape", [b.input("bytes", [1, 64], TensorProto.INT32), b.init("shape", np.array([1, 64, 1]))],
                   name="reshape")
    hot = b.node("Equal", [codes, b.init("classes", np.arange(257, dtype=np.int32).reshape(1, 1, 257))], name="eq")
    b.node("Cast", [hot], ["y"], name="cast", to=TensorProto.FLOAT)
    b.output("y", [1, 64, 257])
    drawn = RandomInputs(b.save(tmp_path / "m.onnx")).draw(0)["bytes"]
    assert drawn.min() >= 0 and drawn.max() <= 256 and len(np.unique(drawn)) > 32


def reduced_range_net(path: Path, top: int | None) -> Path:
    """x → Q/DQ → Conv → Relu → Q(uint8, 0.01) → [integer Clip(0, top)] → DQ → y: PyTorch FX QAT's
    quant_max below the type's, exported as Q → Clip → DQ."""
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 16, 16]), 0.02, name="x")
    relu = b.node("Relu", [b.node("Conv", [x, b.weight("w", W, 0.01)], name="conv", pads=[1, 1, 1, 1])], name="relu")
    params = b.qparams("y", 0.01, 0, np.uint8)
    yq = b.node("QuantizeLinear", [relu, *params], name="yq")
    if top is not None:
        yq = b.node("Clip", [yq, b.init("lo", np.uint8(0)), b.init("hi", np.uint8(top))], name="clip")
    b.node("DequantizeLinear", [yq, *params], ["y"], name="ydq")
    b.output("y", [1, 8, 16, 16])
    return b.save(path)


def test_random_inputs_read_saturation_at_the_reduced_range_of_the_input_model(tmp_path):
    """The twin has no Q → Clip → DQ left to read the narrower range from: saturation is measured
    against the input model's quantizers, so the Clip at 15 of 255 makes the inputs smaller."""
    labels = [qdq("verify", model, model, "--target", "npu", "--format", "json").json()["inputs"]
              for model in (reduced_range_net(tmp_path / "full.onnx", None),
                            reduced_range_net(tmp_path / "reduced.onnx", 15))]
    assert "over the whole input range" in labels[0], labels[0]
    assert "of the input range" in labels[1] and "whole" not in labels[1], labels[1]


def test_a_reduced_range_that_starts_at_zero_clips_in_both_twins():
    """Q(int8, zero point 0) → Clip(0, 127) → DQ after a Conv: the integer Clip is a Relu the exporter folded into
    the integers, so the pair's range [0, 127·s] starts at zero and the twin keeps that clipping. qdq's twin and
    the one built from the documented definition (tests/independent_twin.py) agree on it."""
    import independent_twin

    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4, 8, 8]), 0.02, name="x")
    conv = b.node("Conv", [x, b.weight("w", W, 0.01)], name="conv", pads=[1, 1, 1, 1])
    params = b.qparams("y", 0.01, 0, np.int8)
    integers = b.node("Clip", [b.node("QuantizeLinear", [conv, *params], name="yq"), b.init("lo", np.int8(0)),
                               b.init("hi", np.int8(127))], name="clip")
    b.node("DequantizeLinear", [integers, *params], ["y"], name="ydq")
    b.output("y", [1, 8, 8, 8])
    model = b.model()
    feeds = {"x": np.random.default_rng(0).uniform(-2, 2, (1, 4, 8, 8)).astype(np.float32)}
    ours = independent_twin.run(float_twin(model, load_target("npu").params_of("QDQ006")).model, feeds)["y"]
    theirs = independent_twin.run(independent_twin.float_twin(model), feeds)["y"]
    assert ours.min() == 0.0 and ours.max() > 0.5  # the conv's negative values clipped at zero, the rest kept
    np.testing.assert_array_equal(ours, theirs)
