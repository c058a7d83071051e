"""`qdq fix --target trt11`: a Q/DQ model's float parts to FP16 with every Q/DQ kept (QDQ901's fix).

Checked with onnx and onnxruntime directly: the written model passes the full checker and runs (graph
optimisations off and on), its scales and activations are FP16, its FP32 interface is kept behind
Casts (or is FP16 with `fp16_io`), ops whose Q/DQ-bounded range leaves FP16's stay FP32, and a second
fix changes nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import GraphBuilder
from conftest import run_optimized, run_ort
from onnx import TensorProto

import cli
from qdq.engine.lint import lint
from qdq.engine.ruleset import load_target
from qdq.graph.model import load_model

MODELOPT = Path(__file__).parent / "corpus" / "modelopt"


def fix(tmp_path: Path, source: Path, *options: str, name: str = "out.onnx") -> Path:
    out = tmp_path / name
    assert cli.main(["fix", str(source), "--target", "trt11", "--no-verify", "-o", str(out), *options]) in (0, 1)
    onnx.checker.check_model(onnx.load(out), full_check=True)
    return out


def scale_types(model: onnx.ModelProto) -> Counter:
    inits = {i.name: i.data_type for i in model.graph.initializer}
    return Counter(TensorProto.DataType.Name(inits[n.input[1]]) for n in model.graph.node
                   if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in inits)


def sqnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    noise = np.sum((reference.astype(np.float64) - candidate.astype(np.float64)) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / max(noise, 1e-30)))


def test_modelopt_fp32_export_becomes_fp16_with_every_qdq_kept(tmp_path, capsys):
    """ModelOpt 0.47 INT8 with FP32 float parts (`dq_only`): what TensorRT 11 would build FP32."""
    source = MODELOPT / "resnet_int8_dq_only_fp32.onnx"
    out = fix(tmp_path, source, "--select", "QDQ901")
    before, after = onnx.load(source), onnx.load(out)
    count = Counter(n.op_type for n in after.graph.node)
    assert {op: count[op] for op in ("QuantizeLinear", "DequantizeLinear")} == \
        {op: n for op, n in Counter(n.op_type for n in before.graph.node).items() if "Linear" in op}
    assert scale_types(before) == {"FLOAT": 23} and scale_types(after) == {"FLOAT16": 23}
    # The interface stays FP32: one Cast in, one Cast out; everything between is FP16.
    assert [i.type.tensor_type.elem_type for i in after.graph.input] == [TensorProto.FLOAT]
    assert [o.type.tensor_type.elem_type for o in after.graph.output] == [TensorProto.FLOAT]
    assert count["Cast"] == 2
    assert {i.data_type for i in after.graph.initializer} <= {TensorProto.FLOAT16, TensorProto.INT8, TensorProto.INT64}
    x = np.random.default_rng(0).standard_normal((2, 1, 32, 32)).astype(np.float32)
    (reference,), (plain,), (optimized,) = (run_ort(source, {"input": x}), run_ort(out, {"input": x}),
                                             run_optimized(out, {"input": x}))
    assert sqnr(reference, plain) > 30 and sqnr(reference, optimized) > 30
    assert not [f for f in lint(load_model(out), load_target("trt11")).findings if f.code.startswith("QDQ90")]
    again = fix(tmp_path, out, "--select", "QDQ901", name="again.onnx")
    assert again.read_bytes() == out.read_bytes()
    capsys.readouterr()


def conv_model(opset: int, input_scale: float, weight: float) -> GraphBuilder:
    """x → Q/DQ(input_scale) → Conv(1x1, 8 channels of `weight`) → ReduceMean(axes: an attribute before opset 18) → y."""
    b = GraphBuilder(opset=opset)
    x = b.qdq(b.input("x", [1, 8, 4, 4]), scale=input_scale, name="in")
    w = b.weight("w", np.full((8, 8, 1, 1), weight, np.float32), scale=weight / 100)
    y = b.node("Conv", [x, w], name="conv")
    if opset < 18:
        b.node("ReduceMean", [y], ["y"], name="mean", axes=[2, 3], keepdims=1)
    else:
        b.node("ReduceMean", [y, b.init("axes", np.array([2, 3], np.int64))], ["y"], name="mean", keepdims=1)
    b.output("y", [1, 8, 1, 1])
    return b


def test_fp16_io_and_the_opset_raised_with_reduce_axes_moved(tmp_path, capsys):
    """Opset 13 → 19: ReduceMean-18 takes its axes as an input; `fp16_io` drops the interface Casts."""
    source = conv_model(13, 0.05, 0.1).save(tmp_path / "m.onnx")
    rules = tmp_path / "io.toml"
    rules.write_text('extends = "trt11"\n[rules.QDQ901]\nfp16_io = true\n')
    out = tmp_path / "out.onnx"
    # Verified: the FP16 interface takes the input's values rounded to FP16, as its caller would.
    assert cli.main(["fix", str(source), "--rules", str(rules), "--select", "QDQ901", "-o", str(out)]) == 0
    assert "PASS" in capsys.readouterr().out
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [19]
    (mean,) = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert len(mean.input) == 2 and not [a for a in mean.attribute if a.name == "axes"]
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert not [n for n in model.graph.node if n.op_type == "Cast"]
    x = np.random.default_rng(1).uniform(-3, 3, (1, 8, 4, 4)).astype(np.float32)
    (reference,), (half,) = run_ort(source, {"x": x}), run_ort(out, {"x": x.astype(np.float16)})
    assert half.dtype == np.float16 and sqnr(reference, half) > 40
    capsys.readouterr()


def test_an_op_the_qdq_bound_beyond_fp16_stays_fp32(tmp_path, capsys):
    """x → Q/DQ(100) → Conv(8 weights of 100 per output) → Q/DQ(500) → Relu: after the first DQ |x| ≤ 12800,
    so the Conv can reach 1.0e7 > 65504 and stays FP32; the Relu after the second DQ is bounded by 64000."""
    b = GraphBuilder(opset=19)
    x = b.qdq(b.input("x", [1, 8, 4, 4]), scale=100.0, name="in")
    w = b.weight("w", np.full((8, 8, 1, 1), 100.0, np.float32), scale=1.0)
    y = b.qdq(b.node("Conv", [x, w], name="conv"), scale=500.0, name="mid")
    b.node("Relu", [y], ["y"], name="relu")
    b.output("y", [1, 8, 4, 4])
    source = b.save(tmp_path / "m.onnx")
    out = fix(tmp_path, source, "--select", "QDQ901")
    model = onnx.load(out)
    producers = {o: n for n in model.graph.node for o in n.output}
    (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
    (mid_q,) = [n for n in model.graph.node if n.name == "mid_q"]
    # The Conv reads FP32 through Casts from the FP16 DQs, and its FP32 output is cast to FP16 for the Q.
    assert [producers[i].op_type for i in conv.input] == ["Cast", "Cast"]
    assert producers[mid_q.input[0]].op_type == "Cast" and scale_types(model) == {"FLOAT16": 5}
    assert [f for f in lint(load_model(out), load_target("trt11")).findings if f.code == "QDQ901"] == []
    x = np.random.default_rng(2).uniform(-5000, 5000, (1, 8, 4, 4)).astype(np.float32)
    (reference,), (fixed,) = run_ort(source, {"x": x}), run_ort(out, {"x": x})
    assert np.isfinite(fixed).all() and sqnr(reference, fixed) > 40
    capsys.readouterr()


@pytest.mark.parametrize("name", ["resnet_int8.onnx", "transformer_fp8.onnx"])
def test_modelopt_fp16_exports_are_left_alone(tmp_path, capsys, name):
    """ModelOpt's default output is already what TensorRT 11 wants: nothing to convert."""
    out = fix(tmp_path, MODELOPT / name, "--select", "QDQ9")
    before, after = onnx.load(MODELOPT / name), onnx.load(out)
    assert Counter(n.op_type for n in after.graph.node) == Counter(n.op_type for n in before.graph.node)
    assert scale_types(after) == scale_types(before) and set(scale_types(after)) == {"FLOAT16"}
    capsys.readouterr()


def test_a_graph_output_read_by_an_op_kept_fp32(tmp_path, capsys):
    """Relu → y (a graph output) → Celu (AutoCast keeps Celu FP32): y keeps its FP32 interface and Celu reads FP32."""
    b = GraphBuilder(opset=19)
    x = b.qdq(b.input("x", [1, 4]), name="in")
    b.node("Relu", [x], ["y"], name="relu")
    b.node("Celu", ["y"], ["z"], name="celu")
    b.output("y", [1, 4])
    b.output("z", [1, 4])
    source = b.save(tmp_path / "m.onnx")
    model = onnx.load(fix(tmp_path, source, "--select", "QDQ901"))
    producers = {o: n for n in model.graph.node for o in n.output}
    (celu,) = [n for n in model.graph.node if n.op_type == "Celu"]
    assert producers[celu.input[0]].op_type == "Cast" and producers["y"].op_type == "Cast"
    x = np.array([[-1.0, 0.5, 1.0, 2.0]], np.float32)
    for before, after in zip(run_ort(source, {"x": x}), run_ort(tmp_path / "out.onnx", {"x": x})):
        assert after.dtype == np.float32 and np.abs(after - before).max() < 1e-3
    capsys.readouterr()


def test_a_model_with_subgraphs_keeps_its_opset(tmp_path, capsys):
    """An If below opset 19: its branches' nodes are not reviewed for the opset change, so nothing is converted."""
    from onnx import helper
    b = GraphBuilder(opset=13)
    x = b.qdq(b.input("x", [1, 4]), name="in")
    branch = helper.make_graph([helper.make_node("Relu", [x], ["r"])], "branch", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4])])
    flag = b.init("flag", np.array(True))
    b.node("If", [flag], ["y"], name="if", then_branch=branch, else_branch=branch)
    b.output("y", [1, 4])
    source = b.save(tmp_path / "m.onnx")
    found = [f for f in lint(load_model(source), load_target("trt11")).findings if f.code == "QDQ901"]
    assert found and all(f.fix is None and "holds subgraphs" in f.message for f in found)
    model = onnx.load(fix(tmp_path, source, "--select", "QDQ901"))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    capsys.readouterr()
