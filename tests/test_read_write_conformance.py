"""Reading what onnxruntime runs and never writing what it refuses: the quirks real exports have.

Each case is a small model with one quirk a real tool writes (named in its docstring); the
corpus test (`test_conformance.py`) runs the same promises over the tools' own files.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_ort
from onnx import TensorProto, helper, numpy_helper

import cli
from qdq.graph.model import load_model, save_model
from qdq.graph.normalize import _shape_graph_outputs, _sort_nodes
from qdq.support.errors import InvalidOutputError


def conv_model(weight: onnx.TensorProto, weight_scale: np.ndarray, opset: int = 17, ir_version: int = 8,
               zero_point_type: int = TensorProto.UINT8) -> onnx.ModelProto:
    """x → Q/DQ (uint8) → Conv with a dequantized weight; `weight_scale` per output channel."""
    zero = numpy_helper.from_array(np.array(128 if zero_point_type == TensorProto.UINT8 else 0,
                                            helper.tensor_dtype_to_np_dtype(zero_point_type)), "x_zero_point")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_q"], name="x_quantize"),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero_point"], ["x_dq"], name="x_dequantize"),
        helper.make_node("DequantizeLinear", ["w", "w_scale"], ["w_dq"], name="w_dequantize", axis=0),
        helper.make_node("Conv", ["x_dq", "w_dq"], ["y"], name="conv"),
    ]
    channels = weight.dims[0]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 6, 6])],
        [numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"), zero, weight,
         numpy_helper.from_array(weight_scale.astype(np.float32), "w_scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def int8_weight() -> onnx.TensorProto:
    values = np.random.default_rng(0).integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    return numpy_helper.from_array(values, "w")


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def qdq_json(*argv) -> tuple[int, dict]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([str(a) for a in argv] + ["--format", "json"])
    return code, json.loads(out.getvalue())


CORPUS = Path(__file__).resolve().parent / "corpus"
FEEDS = {"x": np.random.default_rng(1).uniform(-6, 6, (1, 3, 8, 8)).astype(np.float32)}


# --- reading --------------------------------------------------------------------------------------


def test_unsorted_graph_is_sorted_with_a_note(tmp_path):
    """AMD Quark 0.13 writes nodes out of topological order; onnxruntime runs such files."""
    model = conv_model(int8_weight(), np.full(4, 0.01))
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    path = save(model, tmp_path / "unsorted.onnx")
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(str(path))
    run_ort(path, FEEDS)  # onnxruntime accepts it

    loaded = load_model(path)
    assert any("topological order" in note for note in loaded.notes)
    code, report = qdq_json("lint", path, "--target", "ort")
    assert code in (0, 1) and any("topological" in note for note in report["notes"])
    out = tmp_path / "out.onnx"
    assert cli.main(["fix", str(path), "--target", "trt", "-o", str(out)]) in (0, 1)
    onnx.checker.check_model(str(out), full_check=True)


def _branch(name: str) -> onnx.GraphProto:
    """A subgraph that reads `y` from the scope around it."""
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)
    return helper.make_graph([helper.make_node("Identity", ["y"], [f"{name}_out"])], name, [], [out])


@pytest.mark.parametrize("reader", ["plain", "attributes", "subgraph"])
def test_a_read_of_a_later_value_is_out_of_order(reader):
    """The already-sorted test looks into subgraphs only for nodes with attributes: each kind of reader
    of `y`, placed before the Relu that makes it, is found out of order and moved after it."""
    first = {"plain": helper.make_node("Neg", ["y"], ["z"]),
             "attributes": helper.make_node("LeakyRelu", ["y"], ["z"], alpha=0.1),
             "subgraph": helper.make_node("If", ["c"], ["z"], then_branch=_branch("a"), else_branch=_branch("b"))}[reader]
    relu = helper.make_node("Relu", ["x"], ["y"])
    inputs = [helper.make_tensor_value_info(n, t, []) for n, t in (("x", TensorProto.FLOAT), ("c", TensorProto.BOOL))]
    graph = helper.make_graph([first, relu], "g", inputs, [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    assert _sort_nodes(graph) and [n.op_type for n in graph.node] == ["Relu", first.op_type]
    assert not _sort_nodes(graph)


def test_a_fix_reaches_the_readers_inside_subgraphs(tmp_path):
    """x is quantized twice alike; only the branches of an If read the second Q's output (as exporters
    write control flow). QDQ104 points those readers at the first Q: the written model names it
    inside both branches, checks, runs, and verification finds the outputs unchanged."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        nodes = [helper.make_node("DequantizeLinear", ["x_q2", "s", "zp"], [f"{name}_dq"], name=f"{name}_dequantize"),
                 helper.make_node(op, [f"{name}_dq"], [f"{name}_out"], name=f"{name}_op")]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [4])])

    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q1"], name="q1"),
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q2"], name="q2"),
        helper.make_node("DequantizeLinear", ["x_q1", "s", "zp"], ["x_dq1"], name="dq1"),
        helper.make_node("Relu", ["x_dq1"], ["y"], name="relu"),
        helper.make_node("If", ["c"], ["z"], name="if", then_branch=branch("then", "Relu"),
                         else_branch=branch("else", "Neg")),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]), helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "zp")])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "if.onnx")
    out = tmp_path / "out.onnx"
    code, report = qdq_json("fix", path, "--target", "ort", "-o", out)
    assert code in (0, 1) and "QDQ104" in {change["code"] for change in report["changes"]}
    onnx.checker.check_model(str(out), full_check=True)
    written = onnx.load(str(out))
    branches = [a.g for node in written.graph.node if node.op_type == "If" for a in node.attribute]
    assert [[n.input[0] for n in b.node if n.op_type == "DequantizeLinear"] for b in branches] == [["x_q1"], ["x_q1"]]
    assert "q2" not in {n.name for n in written.graph.node}
    feeds = {"x": np.array([-1.0, 0.05, 0.5, 3.0], np.float32)}
    for c in (True, False):
        before, after = (run_ort(p, {**feeds, "c": np.array(c)}) for p in (path, out))
        assert all(np.array_equal(a, b) for a, b in zip(before, after))


def _qdq_around(middle: onnx.NodeProto, **model_fields) -> onnx.ModelProto:
    """x → Q/DQ → `middle` (reads x_dq, writes m) → Q/DQ → y, int8, scales 0.05 and 0.1."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], name="q_in"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["x_dq"], name="dq_in"), middle,
             helper.make_node("QuantizeLinear", ["m", "s2", "zp"], ["m_q"], name="q_out"),
             helper.make_node("DequantizeLinear", ["m_q", "s2", "zp"], ["y"], name="dq_out")]
    initializers = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                    numpy_helper.from_array(np.array(0.1, np.float32), "s2"), numpy_helper.from_array(np.array(0, np.int8), "zp")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializers,
                              sparse_initializer=model_fields.pop("sparse_initializer", []))
    return helper.make_model(graph, ir_version=8, **model_fields)


def _local_function_model() -> onnx.ModelProto:
    """A node calling a model-local function, as torch.onnx.export(export_modules_as_functions=...) writes."""
    relu = helper.make_function("local", "MyRelu", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 17)])
    return _qdq_around(helper.make_node("MyRelu", ["x_dq"], ["m"], name="call", domain="local"), functions=[relu],
                       opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


def _sparse_initializer_model() -> onnx.ModelProto:
    """An Add whose constant operand is a sparse initializer (onnxruntime densifies it on load)."""
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "bias"),
                                       numpy_helper.from_array(np.array([1, 3], np.int64), "bias_indices"), [1, 4])
    return _qdq_around(helper.make_node("Add", ["x_dq", "bias"], ["m"], name="add"), sparse_initializer=[sparse],
                       opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["npu", "trt", "ort"])
@pytest.mark.parametrize("build", [_local_function_model, _sparse_initializer_model], ids=["function", "sparse"])
def test_local_functions_and_sparse_initializers_are_read_and_kept(tmp_path, build, target):
    """Both read as onnxruntime reads them: fixed for every target, verified, and written with the
    function and the sparse initializer as they were. (Reading a sparse initializer's name once
    failed with an AttributeError.)"""
    path = save(build(), tmp_path / "m.onnx")
    feeds = {"x": np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)}
    run_ort(path, feeds)
    out = tmp_path / "out.onnx"
    code, report = qdq_json("fix", path, "--target", target, "-o", out)
    assert code == 0 and report["changes"] and report["verification"]["passed"]
    written, source = onnx.load(str(out)), onnx.load(str(path))
    assert list(written.functions) == list(source.functions)
    assert list(written.graph.sparse_initializer) == list(source.graph.sparse_initializer)
    onnx.checker.check_model(written, full_check=not source.graph.sparse_initializer)
    run_ort(out, feeds)


def test_a_sparse_initializer_with_external_values_keeps_them_in_the_outputs_data_file(tmp_path):
    """The output's data file holds every byte its external tensors reference, a sparse
    initializer's values included: written to another folder, it needs nothing from the input's."""
    model = _sparse_initializer_model()
    values = model.graph.sparse_initializer[0].values
    raw = numpy_helper.to_array(values).tobytes()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bias.data").write_bytes(raw)
    values.ClearField("float_data")
    values.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "bias.data"), ("offset", "0"), ("length", str(len(raw)))):
        entry = values.external_data.add()
        entry.key, entry.value = key, value
    path = save(model, tmp_path / "in" / "m.onnx")
    feeds = {"x": np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)}
    run_ort(path, feeds)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "m.onnx"
    assert cli.main(["fix", str(path), "--target", "npu", "-o", str(out)]) == 0
    written = onnx.load(str(out), load_external_data=False).graph.sparse_initializer[0].values
    assert {e.key: e.value for e in written.external_data}["location"] == "m.data"
    run_ort(out, feeds)


def test_what_the_checker_accepts_needs_no_order_or_output_shape_repair():
    """load_model skips those two repairs when the checker accepts the file as it is. Over the corpus,
    wherever the checker accepts a file, both repairs indeed find nothing to do."""
    accepted = 0
    for path in sorted(CORPUS.rglob("*.onnx")):
        try:
            onnx.checker.check_model(str(path))
        except onnx.checker.ValidationError:
            continue
        proto = onnx.load(str(path), load_external_data=False)
        assert not _sort_nodes(proto.graph) and not _shape_graph_outputs(proto), path
        accepted += 1
    assert accepted >= 100


def test_untyped_value_info_in_a_file_the_checker_accepts_is_dropped_with_a_note(tmp_path):
    model = conv_model(int8_weight(), np.full(4, 0.01))
    model.graph.value_info.append(onnx.ValueInfoProto(name="x_dq"))
    path = save(model, tmp_path / "untyped.onnx")
    onnx.checker.check_model(str(path))

    loaded = load_model(path)
    assert loaded.notes == ["1 value_info entry has no element type; qdq dropped them"]
    assert [info.name for info in loaded.proto.graph.value_info] == []


def test_untyped_value_info_and_shapeless_output_are_tolerated(tmp_path):
    model = conv_model(int8_weight(), np.full(4, 0.01))
    model.graph.value_info.append(onnx.ValueInfoProto(name="x_dq"))
    model.graph.output[0].type.tensor_type.ClearField("shape")
    path = save(model, tmp_path / "loose.onnx")
    run_ort(path, FEEDS)

    loaded = load_model(path)
    assert len(loaded.notes) == 2, loaded.notes
    out = tmp_path / "out.onnx"
    assert cli.main(["fix", str(path), "--target", "trt", "-o", str(out)]) in (0, 1)
    onnx.checker.check_model(str(out), full_check=True)
    assert onnx.load(str(out)).graph.output[0].type.tensor_type.shape.dim[1].dim_value == 4


@pytest.mark.parametrize("broken", ["cycle", "undefined input"])
def test_a_real_cycle_or_undefined_input_is_still_refused(tmp_path, broken):
    model = conv_model(int8_weight(), np.full(4, 0.01))
    model.graph.node[0].input[0] = "y" if broken == "cycle" else "nobody_makes_this"
    model.graph.input[0].name = "unused"
    path = save(model, tmp_path / "broken.onnx")
    before = path.read_bytes()
    for command in (["lint", str(path)], ["fix", str(path), "--target", "trt", "-o", str(tmp_path / "o.onnx")]):
        assert cli.main(command) == 2
    assert not (tmp_path / "o.onnx").exists() and path.read_bytes() == before


# --- writing --------------------------------------------------------------------------------------


def test_changed_q_types_reach_value_info(tmp_path):
    """QDQ505 moves uint8 activations to int8; a value_info that kept uint8 made onnxruntime refuse the file."""
    model = conv_model(int8_weight(), np.full(4, 0.01))
    model.graph.value_info.append(helper.make_tensor_value_info("x_q", TensorProto.UINT8, [1, 3, 8, 8]))
    path = save(model, tmp_path / "u8.onnx")
    out = tmp_path / "out.onnx"
    assert cli.main(["fix", str(path), "--target", "trt", "--no-verify", "-o", str(out)]) in (0, 1)
    declared = {v.name: v.type.tensor_type.elem_type for v in onnx.load(str(out)).graph.value_info}
    assert declared["x_q"] == TensorProto.INT8
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_a_model_the_checker_would_refuse_is_not_written(tmp_path, monkeypatch):
    """An output qdq broke is qdq's bug: exit 2, one line, nothing written, not even with --no-verify."""
    path = save(conv_model(int8_weight(), np.full(4, 0.01)), tmp_path / "m.onnx")
    model = load_model(path)
    model.graph.nodes[-1].op = "Conv2D"  # what a broken rewrite could leave behind
    with pytest.raises(InvalidOutputError, match="not written: the ONNX checker refuses"):
        save_model(model, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("low_bit", ["int4", "uint4"])
def test_low_bit_weights_a_fix_requantizes_are_packed(tmp_path, low_bit):
    """`qdq fix --target npu` on int4 weights crashed with "Raw data size does not match"."""
    dtype = ml_dtypes.int4 if low_bit == "int4" else ml_dtypes.uint4
    lo, hi = (-8, 8) if low_bit == "int4" else (0, 16)
    values = np.random.default_rng(0).integers(lo, hi, (4, 3, 3, 3)).astype(dtype)
    weight = numpy_helper.from_array(values, "w")
    scale = np.array([0.03, 0.011, 0.07, 0.0049])  # not powers of two: the NPU set re-quantizes them
    path = save(conv_model(weight, scale, opset=21, ir_version=10, zero_point_type=TensorProto.INT8), tmp_path / "m.onnx")
    run_ort(path, FEEDS)
    out = tmp_path / "out.onnx"
    assert cli.main(["fix", str(path), "--target", "npu", "--no-verify", "-o", str(out)]) in (0, 1)
    onnx.checker.check_model(str(out), full_check=True)
    run_ort(out, FEEDS)

    fixed = onnx.load(str(out))
    weights = {t.name: t for t in fixed.graph.initializer}
    dq = next(n for n in fixed.graph.node if n.name == "w_dequantize")
    stored, new_scale = weights[dq.input[0]], numpy_helper.to_array(weights[dq.input[1]]).astype(np.float64)
    zero = numpy_helper.to_array(weights[dq.input[2]]).astype(np.float64) if len(dq.input) > 2 else 0.0
    assert stored.data_type == weight.data_type and len(stored.raw_data) == 54  # 108 values, two per byte
    assert np.all(np.log2(new_scale) == np.round(np.log2(new_scale)))
    step = new_scale.reshape(-1, 1, 1, 1)  # per tensor or per output channel
    zero = np.reshape(zero, (-1, 1, 1, 1))
    before = values.astype(np.float64) * scale.reshape(-1, 1, 1, 1)
    after = (numpy_helper.to_array(stored).astype(np.float64) - zero) * step
    clipped = (before < (lo - zero) * step) | (before > (hi - 1 - zero) * step)  # outside the new grid
    # Within one new step: QDQ502/503/504 each round once, and the intermediate grids are finer.
    assert np.all((np.abs(after - before) <= step + 1e-9) | clipped)
