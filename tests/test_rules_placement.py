"""The placement rules (QDQ801-803) on tiny hand-built residual blocks, their fixes run in
onnxruntime, the engine predictions the `trt` set attaches, and `--calibrate`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import apply_fix, findings_of, run_ort

import cli
from qdq.engine.fix import fix
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_rules_file, load_target
from qdq.graph.model import load_model, save_model
from qdq.quant.calibrate import tensor_ranges
from qdq.reports.text import render
from qdq.rewrite.rule import Severity
from qdq.support.errors import RuleSetError

RNG = np.random.default_rng(0)
FEEDS = {"x": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)}


def conv(b: GraphBuilder, x: str, name: str, cin: int = 4, cout: int = 4, quantized_weight: bool = True) -> str:
    w = (RNG.standard_normal((cout, cin, 3, 3)) * 0.2).astype(np.float32)
    weight = b.weight(f"{name}_w", w, scale=0.01) if quantized_weight else b.init(f"{name}_w", w)
    return b.node("Conv", [x, weight, b.init(f"{name}_b", np.zeros(cout, np.float32))], name=name, pads=[1, 1, 1, 1])


def basic_block(residual_qdq: bool = False, qdq_before_add: bool = False, downsample: bool = False,
                cast_residual: bool = False) -> GraphBuilder:
    """x → Q/DQ → conv1 → Relu → Q/DQ → conv2 → [Q/DQ] → Add(·, residual) → Relu → Q/DQ → y.

    The residual is x itself (float unless `residual_qdq`; through a float → float Cast when
    `cast_residual`, as ModelOpt exports a quantizer's other readers), or a downsample conv of it.
    """
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    xq = b.q(x, 0.03, name="x_q")
    xdq = b.dq(xq, 0.03, name="x_dq")
    h = b.node("Relu", [conv(b, xdq, "conv1")], name="relu1")
    h = conv(b, b.qdq(h, 0.02, name="h"), "conv2")
    if qdq_before_add:
        h = b.qdq(h, 0.04, name="branch")
    residual = x
    if downsample:
        residual = b.node("Conv", [xdq, b.weight("ds_w", (RNG.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32)),
                                   b.init("ds_b", np.zeros(4, np.float32))], name="ds_conv")
    elif residual_qdq:
        residual = b.dq(xq, 0.03, name="x_dq_residual")
    elif cast_residual:
        residual = b.node("Cast", [x], name="x_cast", to=onnx.TensorProto.FLOAT)
    y = b.node("Relu", [b.node("Add", [h, residual], name="add")], name="relu_out")
    b.node("DequantizeLinear", [b.q(y, 0.05, name="y_q"), *b.qparams("y_dq", 0.05)], outputs=["y"], name="y_dq")
    b.output("y", [1, 4, 6, 6])
    return b


def load(b: GraphBuilder, tmp_path: Path, name: str = "m.onnx"):
    path = b.save(tmp_path / name)
    return load_model(path), path


def fixed_outputs(model, tmp_path: Path):
    out = tmp_path / "fixed.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    return run_ort(out, FEEDS)


# --- QDQ802 float-residual ------------------------------------------------------------------------


def test_float_residual_reuses_the_q_the_tensor_already_has(tmp_path):
    model, path = load(basic_block(), tmp_path)
    [finding] = findings_of(model, "QDQ802", "trt")
    assert finding.node == "add" and finding.tensors == ("x",)
    assert "x_q" in finding.message and finding.values["conv"] == "conv2"
    changes = apply_fix(model, "QDQ802", "trt")
    assert [c.tensor for c in changes] == ["x"]
    add = next(n for n in model.graph.nodes if n.name == "add")
    assert add.inputs[1].inputs[0].op == "DequantizeLinear"
    assert add.inputs[1].inputs[0].inputs[0].inputs[0].name == "x_q"
    assert not findings_of(model, "QDQ802", "trt")
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    # The residual now reads x rounded to the 0.03 grid: at most half a step of difference
    # before the output Q, so at most one output step after it.
    assert np.max(np.abs(before[0] - after[0])) <= 0.05 + 1e-6


def test_float_residual_behind_a_float_cast_reuses_the_q(tmp_path):
    """Issue 39: ModelOpt's PyTorch export reads a quantized tensor's other consumers through a
    float → float Cast; the residual Add read Cast(x) and QDQ802 asked for calibration data,
    though x_q quantizes the very values. A DQ of x_q gives the Add the Cast's type and values."""
    model, path = load(basic_block(cast_residual=True), tmp_path)
    [finding] = findings_of(model, "QDQ802", "trt")
    assert finding.fix is not None and "x_q" in finding.message
    apply_fix(model, "QDQ802", "trt")
    add = next(n for n in model.graph.nodes if n.name == "add")
    assert add.inputs[1].inputs[0].inputs[0].inputs[0].name == "x_q"
    assert not findings_of(model, "QDQ802", "trt")
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.05 + 1e-6


def concat_residual_block() -> GraphBuilder:
    """Concat(DQ(a), DQ(b)) → Q/DQ → conv2 → SiLU → Add(·, the Concat's float output): NNCF's placement."""
    b = GraphBuilder()
    x = b.qdq(b.input("x", [1, 4, 6, 6]), 0.03, name="x")
    halves = [b.qdq(conv(b, x, f"half{i}", cout=2), 0.05, name=f"half{i}") for i in range(2)]
    cat = b.node("Concat", halves, ["cat"], name="cat", axis=1)
    h = conv(b, b.qdq(cat, 0.05, name="cat"), "conv2")
    silu = b.node("Mul", [h, b.node("Sigmoid", [h], name="sigmoid")], name="silu")
    b.node("Add", [cat, silu], ["y"], name="add")
    b.output("y", [1, 4, 6, 6])
    return b


def test_concat_residual_reads_the_q_it_already_has(tmp_path):
    """Issue 39: integers reach the Add through the Concat, but the Add read its float output while
    the Concat's own Q/DQ fed conv2; reading that Q (on the inputs' grid) costs nothing."""
    model, path = load(concat_residual_block(), tmp_path)
    [finding] = findings_of(model, "QDQ802", "trt")
    assert finding.tensors == ("cat",) and "cat_q" in finding.message
    apply_fix(model, "QDQ802", "trt")
    add = next(n for n in model.graph.nodes if n.name == "add")
    assert add.inputs[0].inputs[0].inputs[0].inputs[0].name == "cat_q"
    assert np.array_equal(run_ort(path, FEEDS)[0], fixed_outputs(model, tmp_path)[0])


def test_a_bias_added_after_the_conv_is_no_residual(tmp_path):
    """PaddlePaddle writes a conv's bias as Add(Conv, Reshape(Constant, Constant)): computed from
    constants, not an activation, so QDQ802 has no float residual to quantize there."""
    b = GraphBuilder()
    x = b.qdq(b.input("x", [1, 4, 6, 6]), 0.03, name="x")
    bias = b.node("Reshape", [b.node("Constant", [], name="bias_values", value=onnx.numpy_helper.from_array(
        np.arange(4, dtype=np.float32), "bias_values")), b.init("bias_shape", np.array([1, 4, 1, 1], np.int64))],
        name="bias")
    y = b.node("Add", [conv(b, x, "conv"), bias], name="add")
    b.node("DequantizeLinear", [b.q(y, 0.05, name="y_q"), *b.qparams("y_dq", 0.05)], outputs=["y"], name="y_dq")
    b.output("y", [1, 4, 6, 6])
    model, _ = load(b, tmp_path)
    assert not findings_of(model, "QDQ802", "trt")
    model, _ = load(basic_block(), tmp_path, "float_residual.onnx")  # a float activation still is one
    assert findings_of(model, "QDQ802", "trt")


def test_quantized_residual_is_clean(tmp_path):
    model, _ = load(basic_block(residual_qdq=True), tmp_path)
    assert not findings_of(model, "QDQ802", "trt")
    assert not findings_of(model, "QDQ803", "trt")


def test_deeper_conv_is_the_fused_branch_and_a_new_scale_needs_data(tmp_path):
    model, path = load(basic_block(downsample=True), tmp_path)
    [finding] = findings_of(model, "QDQ802", "trt")
    assert finding.values["conv"] == "conv2" and finding.tensors == ("ds_conv_out",)
    assert finding.fix is None and "--calibrate" in finding.message
    assert not apply_fix(model, "QDQ802", "trt")

    ranges = tensor_ranges(path, FEEDS)
    result = fix(model, load_target("trt").narrowed(select=["QDQ802"]), max_rounds=1, ranges=ranges)
    [change] = result.changes
    assert "calibration" in change.description
    assert not result.result.findings
    low, high = ranges["ds_conv_out"]
    new_q = next(n for n in model.graph.nodes if n.op == "QuantizeLinear" and n.inputs[0].name == "ds_conv_out")
    assert new_q.inputs[1].values == pytest.approx(max(-low, high) / 127)
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.05 + 1e-6


def test_graph_output_residual_branch_is_not_a_fused_branch(tmp_path):
    b = basic_block()
    b.output("conv2_out", [1, 4, 6, 6])  # conv2's output is also read outside the Add: no fusion
    model, _ = load(b, tmp_path)
    assert not findings_of(model, "QDQ802", "trt")


# --- QDQ803 qdq-in-fused-branch -------------------------------------------------------------------


def test_qdq_between_conv_and_add_is_removed(tmp_path):
    model, path = load(basic_block(residual_qdq=True, qdq_before_add=True), tmp_path)
    [finding] = findings_of(model, "QDQ803", "trt")
    assert finding.values == {"quantize": "branch_q", "conv": "conv2", "standalone": ["branch_q"]}
    changes = apply_fix(model, "QDQ803", "trt")
    assert [(c.old, c.new) for c in changes] == [("Q/DQ (0.04)", "float")]
    add = next(n for n in model.graph.nodes if n.name == "add")
    assert add.inputs[0].inputs[0].name == "conv2"
    assert not any(n.name.startswith("branch") for n in model.graph.nodes)
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.05 + 1e-6


def test_qdq_with_another_reader_stays(tmp_path):
    b = basic_block(residual_qdq=True, qdq_before_add=True)
    b.node("Identity", ["branch_q_out"], outputs=["side"], name="side")  # the Q's integers are read elsewhere too
    b.output("side", [1, 4, 6, 6], onnx.TensorProto.INT8)
    model, _ = load(b, tmp_path)
    assert not findings_of(model, "QDQ803", "trt")


# --- QDQ801 float-input ---------------------------------------------------------------------------


def float_input_model(weight_quantized: bool = True, other_q: bool = True, head_output: bool = False) -> GraphBuilder:
    """x → Q/DQ → conv1; and conv2 reads x directly (float); `other_q` False drops conv1's Q/DQ."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    first = conv(b, b.qdq(x, 0.03, name="x") if other_q else x, "conv1")
    second = conv(b, x, "conv2", quantized_weight=weight_quantized)
    total = b.node("Add", [first, second], name="sum")
    if head_output:
        b.output(second, [1, 4, 6, 6])
    b.node("Identity", [total], outputs=["y"], name="out")
    b.output("y", [1, 4, 6, 6])
    return b


def test_float_input_reads_the_existing_dq(tmp_path):
    model, path = load(float_input_model(), tmp_path)
    [finding] = findings_of(model, "QDQ801", "trt")
    assert (finding.node, finding.values["kind"], finding.tensors) == ("conv2", "data", ("x",))
    apply_fix(model, "QDQ801", "trt")
    conv2 = next(n for n in model.graph.nodes if n.name == "conv2")
    assert conv2.inputs[0].inputs[0].name == "x_dq"  # the DQ conv1 reads, shared
    assert not findings_of(model, "QDQ801", "trt")


def test_float_weight_is_quantized_per_output_channel(tmp_path):
    model, path = load(float_input_model(weight_quantized=False), tmp_path)
    kinds = sorted(f.values["kind"] for f in findings_of(model, "QDQ801", "trt"))
    assert kinds == ["data", "weight"]
    changes = apply_fix(model, "QDQ801", "trt")
    weight_change = next(c for c in changes if c.tensor == "conv2_w")
    assert weight_change.new == "int8 per-channel (axis 0)" and weight_change.values["sqnr_db"] > 35
    conv2 = next(n for n in model.graph.nodes if n.name == "conv2")
    dq = conv2.inputs[1].inputs[0]
    assert dq.op == "DequantizeLinear" and dq.attrs["axis"] == 0 and dq.inputs[1].values.shape == (4,)
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) < 0.1


def test_float_input_without_any_q_needs_data(tmp_path):
    model, _ = load(float_input_model(other_q=False), tmp_path)
    findings = findings_of(model, "QDQ801", "trt")
    assert {f.node for f in findings} == {"conv1", "conv2"}
    assert all(f.fix is None and "--calibrate" in f.message for f in findings)


def test_graph_output_convs_are_skipped_unless_configured(tmp_path):
    model, _ = load(float_input_model(head_output=True), tmp_path)
    assert not findings_of(model, "QDQ801", "trt")
    path = tmp_path / "strict.toml"
    path.write_text('extends = "trt"\n[rules.QDQ801]\nskip_graph_outputs = false\n')
    assert [f.node for f in lint(model, load_rules_file(path).narrowed(select=["QDQ801"])).findings] == ["conv2"]


def test_dequantized_through_maxpool_and_concat_counts_as_quantized(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    pooled = b.node("MaxPool", [b.qdq(x, 0.03)], kernel_shape=[1, 1])
    joined = b.node("Concat", [pooled, b.qdq(x, 0.03)], axis=1)
    out = conv(b, joined, "conv", cin=8)
    b.node("Identity", [out], outputs=["y"])
    b.output("y", [1, 4, 6, 6])
    model, _ = load(b, tmp_path)
    assert not findings_of(model, "QDQ801", "trt")


# --- engine predictions and rule-set keys ---------------------------------------------------------


def test_trt_findings_say_what_tensorrt_builds(tmp_path):
    model, _ = load(basic_block(residual_qdq=False), tmp_path)
    result = lint(model, load_target("trt"))
    [finding] = [f for f in result.findings if f.code == "QDQ802"]
    assert finding.effect.startswith("TensorRT: conv2 + add fuse with a float output")
    # The Q after the block and the Q x has for conv1: the Add needs x in float, so both run alone;
    # and the DQ that writes the graph output y (QDQ809).
    assert finding.conversions == ("y_q", "x_q")
    [output] = [f for f in result.findings if f.code == "QDQ809"]
    assert output.conversions == ("y_dq",) and result.predicted_reformats() == 3
    assert finding.to_dict()["predicted_conversions"] == ["y_q", "x_q"]
    text = render(result, fail_on=Severity.WARNING)
    assert "    -> TensorRT: conv2 + add" in text and "Predicted: 3 conversion layers caused" in text
    # Sets without `effect` keys predict nothing.
    assert not lint(model, load_target("npu")).predicts_engine


def test_a_conversion_two_findings_name_counts_once(tmp_path):
    """Block 2's residual is block 1's output: its Q is block 1's output Q and block 2's residual Q."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    for block in (1, 2):
        xq = b.q(x, 0.03, name=f"in{block}_q")
        h = b.node("Relu", [conv(b, b.dq(xq, 0.03), f"b{block}_conv1")])
        h = conv(b, b.qdq(h, 0.02), f"b{block}_conv2")
        x = b.node("Relu", [b.node("Add", [h, x], name=f"add{block}")])
    b.node("DequantizeLinear", [b.q(x, 0.05, name="out_q"), *b.qparams("out_dq", 0.05)], outputs=["y"])
    b.output("y", [1, 4, 6, 6])
    model, _ = load(b, tmp_path)
    result = lint(model, load_target("trt").narrowed(select=["QDQ802"]))
    assert [f.conversions for f in result.findings] == [("in2_q", "in1_q"), ("out_q", "in2_q")]
    assert result.predicted_reformats() == 3


@pytest.mark.parametrize("line, error", [
    ("effect = 3", "effect must be a string"),
    ("reformats = true", "reformats must be a number"),
])
def test_bad_effect_keys_are_rejected(tmp_path, line, error):
    path = tmp_path / "r.toml"
    path.write_text(f'extends = "trt"\n[rules.QDQ802]\n{line}\n')
    with pytest.raises(RuleSetError, match=error):
        load_rules_file(path)


# --- qdq fix --calibrate ---------------------------------------------------------------------------


def test_cli_calibrate_fixes_what_needs_data(tmp_path, capsys):
    path = basic_block(downsample=True).save(tmp_path / "m.onnx")
    # Eight samples (on the batch axis) like the inputs verification draws, over x's whole grid
    # (0.03 × [-128, 127]): the new Q's range then covers what the comparison feeds, which one
    # normal sample need not (SQNR 9.3 dB for some weights).
    calibration = np.random.default_rng(1).uniform(-3.84, 3.81, (8, 4, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "cal.npz", x=calibration)
    assert cli.main(["fix", str(path), "--target", "trt", "--select", "QDQ802", "-o", str(tmp_path / "a.onnx")]) == 1
    assert "--calibrate" in capsys.readouterr().out
    code = cli.main(["fix", str(path), "--target", "trt", "--select", "QDQ802", "-o", str(tmp_path / "b.onnx"),
                     "--calibrate", str(tmp_path / "cal.npz")])
    assert code == 0, capsys.readouterr().out


def test_cli_bad_calibration_file_writes_nothing(tmp_path, capsys):
    path = basic_block(downsample=True).save(tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", wrong=FEEDS["x"])
    out = tmp_path / "out.onnx"
    assert cli.main(["fix", str(path), "--target", "trt", "-o", str(out), "--calibrate", str(tmp_path / "cal.npz")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'x'" in err
    assert not out.exists()


def test_tensor_ranges_measure_every_float_tensor(tmp_path):
    path = basic_block().save(tmp_path / "m.onnx")
    ranges = tensor_ranges(path, FEEDS)
    assert ranges["x"] == (float(FEEDS["x"].min()), float(FEEDS["x"].max()))
    low, high = ranges["relu1_out"]
    assert low == 0.0 and high > 0
    assert "x_q_out" not in ranges  # integers are not calibrated


def test_inspect_predicts_conversion_layers_for_trt(tmp_path, capsys):
    path = basic_block(residual_qdq=True, qdq_before_add=True).save(tmp_path / "m.onnx")
    assert cli.main(["inspect", str(path), "--target", "trt", "--format", "json"]) == 0
    import json

    predicted = json.loads(capsys.readouterr().out)["predicted"]
    # QDQ803's Q/DQ between conv2 and the Add, and QDQ809's DQ on the graph output.
    assert predicted == {"ruleset": "trt", "conversion_layers": 2, "by_rule": {"QDQ803": 1, "QDQ809": 1},
                         "findings": 2}

    assert cli.main(["inspect", str(path), "--target", "npu"]) == 2
    assert "predicts nothing" in capsys.readouterr().err


# --- QDQ103 requantize-chain, unified for TensorRT ------------------------------------------------


def requantize_chain() -> GraphBuilder:
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    first = b.dq(b.q(x, 0.02, name="q1"), 0.02, name="dq1")
    second = b.dq(b.q(first, 0.05, name="q2"), 0.05, name="dq2")
    b.node("Relu", [second], outputs=["y"], name="relu")
    b.output("y", [1, 4, 6, 6])
    return b


def test_requantize_chain_is_reported_but_not_fixed_in_common(tmp_path):
    model, _ = load(requantize_chain(), tmp_path)
    [finding] = findings_of(model, "QDQ103", "common")
    assert finding.fix is None


def test_trt_unifies_a_requantize_chain_and_drops_the_pair(tmp_path):
    model, path = load(requantize_chain(), tmp_path)
    result = fix(model, load_target("trt").narrowed(select=["QDQ102", "QDQ103"]))
    assert [c.code for c in result.changes] == ["QDQ103", "QDQ102"] and not result.result.findings
    assert "2^" not in result.changes[0].new and result.changes[0].new == "0.05"
    assert [n.op for n in model.graph.nodes] == ["QuantizeLinear", "DequantizeLinear", "Relu"]
    # One rounding at 0.05 instead of two (0.02 then 0.05): at most one step apart.
    difference = np.abs(run_ort(path, FEEDS)[0] - fixed_outputs(model, tmp_path)[0])
    assert 0 < difference.max() <= 0.05 + 1e-6


# --- QDQ606 with a bias constant two convs share ---------------------------------------------------


def test_a_shared_int32_bias_gets_one_private_copy_per_conv(tmp_path):
    """Exporters deduplicate equal bias constants; onnxruntime's quantizer then quantizes one int32
    bias for convs whose input × weight scales differ. Each conv must get its own bias."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    bias = b.dq(b.init("bias_q", np.array([100, -50, 25, 0], np.int32)), 0.001, dtype=np.int32, name="bias_dq")
    outputs = []
    for name, scale in (("c1", 0.02), ("c2", 0.04)):
        w = b.weight(f"{name}_w", (RNG.standard_normal((4, 4, 1, 1)) * 0.2).astype(np.float32), scale=0.01)
        outputs.append(b.node("Conv", [b.qdq(x, scale, name=f"{name}_in"), w, bias], name=name))
    b.node("Add", outputs, outputs=["y"], name="sum")
    b.output("y", [1, 4, 6, 6])
    model, path = load(b, tmp_path)
    result = fix(model, load_target("npu").narrowed(select=["QDQ606"]))  # trt folds biases to float (QDQ609)
    assert result.converged and not result.result.findings
    scales = {}
    for node in model.graph.nodes:
        if node.op == "Conv":
            scales[node.name] = float(node.inputs[2].inputs[0].inputs[1].values)
    assert scales == pytest.approx({"c1": 0.02 * 0.01, "c2": 0.04 * 0.01})
    assert np.max(np.abs(run_ort(path, FEEDS)[0] - fixed_outputs(model, tmp_path)[0])) < 1e-3


# --- QDQ806 qdq-before-activation, QDQ807 unshared-activated-residual -------------------------------


def bottleneck(branch_qdq: bool = True, constant_nodes: bool = False) -> GraphBuilder:
    """x → Q/DQ → conv → Q/DQ → Sigmoid → Q/DQ → Mul(conv, ·) → [Q/DQ] → Add(·, DQ(x)) → Q/DQ → y,
    a YOLO bottleneck as onnxruntime's quantizer writes it (every activation quantized); with
    `constant_nodes`, the residual DQ reads its parameters from Constant nodes, as ModelOpt's PyTorch
    export writes them."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    xq = b.q(x, 0.03, name="x_q")
    c = b.qdq(conv(b, b.dq(xq, 0.03, name="x_dq"), "conv"), 0.08, name="c")
    s = b.qdq(b.node("Sigmoid", [c], name="sigmoid"), 1 / 127, name="s")
    h = b.node("Mul", [c, s], name="silu")
    if branch_qdq:
        h = b.qdq(h, 0.06, name="branch")
    if constant_nodes:
        params = [b.node("Constant", [], name=f"residual_{key}", value=onnx.numpy_helper.from_array(value))
                  for key, value in (("scale", np.array(0.03, np.float32)), ("zero_point", np.array(0, np.int8)))]
        residual = b.node("DequantizeLinear", [xq, *params], name="x_dq_residual")
    else:
        residual = b.dq(xq, 0.03, name="x_dq_residual")
    y = b.node("Add", [h, residual], name="add")
    b.node("DequantizeLinear", [b.q(y, 0.1, name="y_q"), *b.qparams("y_dq", 0.1)], outputs=["y"], name="y_dq")
    b.output("y", [1, 4, 6, 6])
    return b


def shared_trt(tmp_path: Path):
    path = tmp_path / "shared.toml"
    path.write_text('extends = "trt"\n[params]\nresidual_after_activation = "shared"\n')
    return load_rules_file(path)


def test_qdq_between_conv_and_silu_is_removed(tmp_path):
    model, path = load(bottleneck(), tmp_path)
    found = findings_of(model, "QDQ806", "trt")
    assert sorted((f.node, f.values["quantize"]) for f in found) == [
        ("sigmoid", "c_q"), ("silu", "c_q"), ("silu", "s_q")]
    apply_fix(model, "QDQ806", "trt")
    nodes = {n.name: n for n in model.graph.nodes}
    assert nodes["sigmoid"].inputs[0].inputs[0].name == "conv"
    assert {t.inputs[0].name for t in nodes["silu"].inputs} == {"conv", "sigmoid"}
    assert not findings_of(model, "QDQ806", "trt")
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.1 + 1e-6  # one output step


def test_relu_after_a_batchnorm_is_checked_and_an_add_is_not_an_activation(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    bn = b.node("BatchNormalization", [conv(b, b.qdq(x, 0.03), "conv"), *(b.init(f"bn{i}", v) for i, v in
                                                                           enumerate((ones, zeros, zeros, ones)))])
    relu = b.node("Relu", [b.qdq(bn, 0.04, name="bn")], name="relu")
    add = b.node("Add", [b.qdq(conv(b, b.qdq(relu, 0.02), "conv2"), 0.04, name="c2"), b.qdq(x, 0.03)], name="add")
    b.node("Identity", [add], outputs=["y"])
    b.output("y", [1, 4, 6, 6])
    model, _ = load(b, tmp_path)
    assert [(f.node, f.values["conv"]) for f in findings_of(model, "QDQ806", "trt")] == [("relu", "conv")]


def test_residual_after_silu_keeps_the_conv_branch_float_by_default(tmp_path):
    model, path = load(bottleneck(), tmp_path)
    assert not findings_of(model, "QDQ803", "trt")  # the SiLU is not recognised through its Q/DQs yet
    apply_fix(model, "QDQ806", "trt")
    [finding] = findings_of(model, "QDQ803", "trt")
    assert finding.values["quantize"] == "branch_q" and finding.values["conv"] == "conv"
    apply_fix(model, "QDQ803", "trt")
    add = next(n for n in model.graph.nodes if n.name == "add")
    assert add.inputs[0].inputs[0].name == "silu" and add.inputs[1].inputs[0].op == "DequantizeLinear"
    assert not findings_of(model, "QDQ807", "trt")  # the "shared" rule is off in the default mode
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.1 + 1e-6  # one output step


@pytest.mark.parametrize("branch_qdq", [True, False])
def test_shared_mode_puts_both_add_inputs_on_the_residual_scale(tmp_path, branch_qdq):
    rules = shared_trt(tmp_path)
    model, path = load(bottleneck(branch_qdq), tmp_path)
    apply_fix(model, "QDQ806", rules)
    assert not findings_of(model, "QDQ803", "trt") or branch_qdq
    assert not lint(model, rules.narrowed(select=["QDQ803"])).findings  # shared: the branch Q/DQ stays
    [finding] = lint(model, rules.narrowed(select=["QDQ807"])).findings
    assert finding.values["state"] == ("on 0.06" if branch_qdq else "float")
    [change] = [c for c in apply_fix(model, "QDQ807", rules) if c.code == "QDQ807"]
    add = next(n for n in model.graph.nodes if n.name == "add")
    scales = [float(t.inputs[0].inputs[1].values) for t in add.inputs]
    assert [t.inputs[0].op for t in add.inputs] == ["DequantizeLinear"] * 2 and scales == pytest.approx([0.03, 0.03])
    assert add.inputs[0].inputs[0].inputs[0].inputs[0].inputs[0].inputs[0].name == "silu"
    assert not lint(model, rules.narrowed(select=["QDQ807"])).findings
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.1 + 1e-6  # one output step


def test_shared_mode_reads_a_residual_scale_held_by_constant_nodes(tmp_path):
    """The new Q's output takes the int8 of a zero-point held by a Constant node (a uint8 default made the
    ONNX checker refuse its DQ), and once on that scale the branch is found shared: no new Q each round."""
    model, path = load(bottleneck(branch_qdq=False, constant_nodes=True), tmp_path)
    result = fix(model, shared_trt(tmp_path))
    assert result.converged and [c.code for c in result.changes].count("QDQ807") == 1
    add = next(n for n in model.graph.nodes if n.name == "add")
    assert add.inputs[0].inputs[0].inputs[0].dtype == np.int8  # the new Q's output, as the DQ reads it
    before, after = run_ort(path, FEEDS), fixed_outputs(model, tmp_path)
    assert np.max(np.abs(before[0] - after[0])) <= 0.1 + 1e-6  # one output step


def test_the_residual_mode_is_one_parameter_and_a_typo_is_an_error(tmp_path):
    rules = shared_trt(tmp_path)
    assert {rules.rules[c].params["residual_after_activation"] for c in ("QDQ803", "QDQ807")} == {"shared"}
    assert load_target("trt").rules["QDQ807"].params["residual_after_activation"] == "float-branch"
    path = tmp_path / "typo.toml"
    path.write_text('extends = "trt"\n[params]\nresidual_after_activation = "Shared"\n')
    model, _ = load(bottleneck(), tmp_path)
    with pytest.raises(RuleSetError, match="float-branch"):
        lint(model, load_rules_file(path))
