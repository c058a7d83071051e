"""`qdq inspect`: exact counts on small hand-built models, and a model quantized by onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_run import qdq
from qdq.engine.inspect import render_tensors, render_text, summarize, tensors
from qdq.graph import ir
from qdq.graph.model import Model, load_model

OPSET = 17


def _init(name: str, values, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _save(tmp_path: Path, nodes, inits, inputs, outputs, name: str = "model.onnx") -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    # IR version 8 (opset 17 era): onnxruntime refuses newer IR versions than it knows.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
    onnx.checker.check_model(model)
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _float_input(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _mixed_model(tmp_path: Path) -> Path:
    """Quantized Conv → Relu, Sigmoid, Tanh left unquantized → Conv with a float bias → quantized Reshape.

    Scales: x 0.5 (pow2, Q/DQ share initializers), per-channel int8 weight and int32 bias
    (not pow2), Conv output 0.1 (not pow2, Q and DQ read separate copies), the rest pow2.
    """
    w1_scale = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
    inits = [
        _init("sx", 0.5), _init("zx", 128, np.uint8),
        _init("w1", np.ones((4, 3, 3, 3)), np.int8), _init("w1_s", w1_scale), _init("w1_z", np.zeros(4), np.int8),
        _init("b1", np.zeros(4), np.int32), _init("b1_s", w1_scale * 0.5),
        _init("s1_q", 0.1), _init("z1_q", 0, np.int8), _init("s1_dq", 0.1), _init("z1_dq", 0, np.int8),
        _init("s2", 0.0625),
        _init("w2", np.ones((2, 4, 1, 1)), np.int8), _init("w2_s", 0.25), _init("b2", [0.5, -0.5]),
        _init("s3", 0.125), _init("z3", 0, np.int8),
        _init("shape", [1, -1], np.int64),
    ]
    dq, q = "DequantizeLinear", "QuantizeLinear"
    nodes = [
        helper.make_node(q, ["x", "sx", "zx"], ["xq"], name="q_x"),
        helper.make_node(dq, ["xq", "sx", "zx"], ["xd"], name="dq_x"),
        helper.make_node(dq, ["w1", "w1_s", "w1_z"], ["w1d"], name="dq_w1", axis=0),
        helper.make_node(dq, ["b1", "b1_s"], ["b1d"], name="dq_b1", axis=0),
        helper.make_node("Conv", ["xd", "w1d", "b1d"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node(q, ["c1", "s1_q", "z1_q"], ["c1q"], name="q_c1"),
        helper.make_node(dq, ["c1q", "s1_dq", "z1_dq"], ["c1d"], name="dq_c1"),
        helper.make_node("Relu", ["c1d"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["sg"], name="sigmoid"),
        helper.make_node("Tanh", ["sg"], ["t"], name="tanh"),
        helper.make_node(q, ["t", "s2"], ["tq"], name="q_t"),
        helper.make_node(dq, ["tq", "s2"], ["td"], name="dq_t"),
        helper.make_node(dq, ["w2", "w2_s"], ["w2d"], name="dq_w2"),
        helper.make_node("Conv", ["td", "w2d", "b2"], ["c2"], name="conv2"),
        helper.make_node(q, ["c2", "s3", "z3"], ["c2q"], name="q_c2"),
        helper.make_node(dq, ["c2q", "s3", "z3"], ["c2d"], name="dq_c2"),
        helper.make_node("Reshape", ["c2d", "shape"], ["rs"], name="reshape"),
        helper.make_node(q, ["rs", "s3", "z3"], ["rsq"], name="q_rs"),
        helper.make_node(dq, ["rsq", "s3", "z3"], ["y"], name="dq_rs"),
    ]
    return _save(tmp_path, nodes, inits, [_float_input("x", [1, 3, 8, 8])], [_float_input("y", [1, 128])])


def test_mixed_model_counts(tmp_path):
    summary = summarize(load_model(_mixed_model(tmp_path)))
    json.dumps(summary, allow_nan=False)

    assert summary["model"] == {
        "path": str(tmp_path / "model.onnx"),
        "opset": OPSET,
        "nodes": 19,
        "quantize_nodes": 5,
        "dequantize_nodes": 8,
        "integer_only_nodes": 0,
        "external_data": False,
    }
    assert summary["ops"] == {
        "Conv": {"quantized": 1, "partial": 1, "float": 0},
        "Relu": {"quantized": 0, "partial": 1, "float": 0},
        "Reshape": {"quantized": 1, "partial": 0, "float": 0},
        "Sigmoid": {"quantized": 0, "partial": 0, "float": 1},
        "Tanh": {"quantized": 0, "partial": 1, "float": 0},
    }
    assert summary["float_islands"] == [
        {"size": 3, "ops": {"Relu": 1, "Sigmoid": 1, "Tanh": 1}, "nodes": ["relu", "sigmoid", "tanh"], "more_nodes": 0},
        {"size": 1, "ops": {"Conv": 1}, "nodes": ["conv2"], "more_nodes": 0},
    ]
    assert summary["quantized_tensors"] == {
        "total": 8,
        "by_dtype": {"int32": 1, "int8": 5, "uint8": 2},
        "by_granularity": {"per-tensor": 6, "per-axis": 2, "blocked": 0},
        "stored": 3,
        "activations": 5,
        "float_weights": 0,
        "other": 0,
        "qdq_pairs": {"shared": 4, "separate": 1},
    }
    scales = summary["scales"]
    assert (scales["count"], scales["pow2"], scales["dynamic"], scales["invalid"]) == (13, 9, 0, 0)
    assert scales["min"] == pytest.approx(0.005)
    assert scales["max"] == 0.5
    assert scales["pos_min"] is None and scales["pos_max"] is None
    assert summary["notes"] == ["not fully quantized: 4 of 6 compute nodes, in 2 float islands"]


def test_render_text_mixed_model(tmp_path):
    text = render_text(summarize(load_model(_mixed_model(tmp_path))))
    assert "Ops        quantized  partial  float" in text
    assert "  Conv             1        1      0" in text
    assert "   1. 3 nodes   Relu, Sigmoid, Tanh: relu, sigmoid, tanh" in text
    assert "powers of 2  9 of 13" in text


def test_external_data_model_reads_only_scales_and_zero_points(tmp_path, monkeypatch):
    path = _mixed_model(tmp_path)
    onnx.save(onnx.load(str(path)), str(path), save_as_external_data=True, location="model.data", size_threshold=0)
    model = load_model(path)
    read: list[str] = []
    constant_values = Model.constant_values

    def recording_constant_values(self, tensor):
        read.append(tensor.name)
        return constant_values(self, tensor)

    monkeypatch.setattr(Model, "constant_values", recording_constant_values)
    monkeypatch.setattr(ir, "decode", lambda proto: pytest.fail(f"read {proto.name}"))
    summary = summarize(model)

    assert summary["model"]["external_data"] is True
    assert summary["scales"]["count"] == 13
    assert "w1_s" in read and not {"w1", "b1", "w2", "b2", "shape"} & set(read)


def test_float_model_has_note_and_zero_counts(tmp_path):
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    inits = [_init("w", np.ones((2, 3, 1, 1))), _init("b", [0.0, 0.0])]
    path = _save(tmp_path, nodes, inits, [_float_input("x", [1, 3, 4, 4])], [_float_input("y", [1, 2, 4, 4])])
    summary = summarize(load_model(path))

    assert summary["notes"] == ["the model has no QuantizeLinear or DequantizeLinear nodes: it runs entirely in float"]
    assert (summary["model"]["quantize_nodes"], summary["model"]["dequantize_nodes"]) == (0, 0)
    assert summary["ops"] == {
        "Conv": {"quantized": 0, "partial": 0, "float": 1},
        "Relu": {"quantized": 0, "partial": 0, "float": 1},
    }
    assert summary["float_islands"] == []
    assert summary["quantized_tensors"]["total"] == 0
    assert summary["quantized_tensors"]["qdq_pairs"] == {"shared": 0, "separate": 0}
    assert summary["scales"] == {
        "count": 0, "dynamic": 0, "pow2": 0, "min": None, "max": None, "pos_min": None, "pos_max": None, "invalid": 0,
    }
    assert "no QuantizeLinear or DequantizeLinear" in render_text(summary)


def test_all_pow2_scales_report_pos_range(tmp_path):
    """A QAT-style export: the weight stays float and is fake-quantized per channel at run time."""
    inits = [
        _init("s_in", 2.0**-3), _init("s_out", 2.0**-5), _init("z", 0, np.int8),
        _init("w", np.ones((2, 3, 1, 1))), _init("w_s", [0.5, 0.25]), _init("w_z", [0, 0], np.int8),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_in", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s_in", "z"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "w_s", "w_z"], ["wq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "w_s", "w_z"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["c"]),
        helper.make_node("QuantizeLinear", ["c", "s_out", "z"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "s_out", "z"], ["y"]),
    ]
    path = _save(tmp_path, nodes, inits, [_float_input("x", [1, 3, 4, 4])], [_float_input("y", [1, 2, 4, 4])])
    summary = summarize(load_model(path))

    scales = summary["scales"]
    assert (scales["count"], scales["pow2"], scales["pos_min"], scales["pos_max"]) == (6, 6, 1, 5)
    assert summary["ops"] == {"Conv": {"quantized": 1, "partial": 0, "float": 0}}
    assert summary["float_islands"] == []
    tensors = summary["quantized_tensors"]
    assert (tensors["stored"], tensors["float_weights"], tensors["activations"]) == (0, 1, 2)
    assert tensors["by_granularity"] == {"per-tensor": 2, "per-axis": 1, "blocked": 0}
    assert summary["notes"] == []
    assert "pos          1 .. 5" in render_text(summary)


def test_long_island_lists_ten_names_and_a_count(tmp_path):
    """Twelve unnamed float Relus after a DQ: one island, ten names listed, two counted."""
    inits = [_init("s", 0.5)]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s"], ["r0"]),
    ]
    nodes += [helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"]) for i in range(12)]
    path = _save(tmp_path, nodes, inits, [_float_input("x", [4])], [_float_input("r12", [4])])
    summary = summarize(load_model(path))

    [island] = summary["float_islands"]
    assert (island["size"], island["ops"], island["more_nodes"]) == (12, {"Relu": 12}, 2)
    assert island["nodes"] == [f"<Relu #{i}>" for i in range(2, 12)]
    assert summary["ops"] == {"Relu": {"quantized": 0, "partial": 1, "float": 11}}
    assert "12 nodes  Relu x12: <Relu #2>," in render_text(summary)


def test_dynamic_scales_and_non_data_inputs(tmp_path):
    """Run-time scales; a missing roi, Resize scales and a Shape-computed Reshape shape are not data."""
    inits = [_init("resize_scales", [1, 1, 2, 2]), _init("axis0", [0], np.int64), _init("minus1", [-1], np.int64)]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s"], ["xd"]),
        helper.make_node("Resize", ["xd", "", "resize_scales"], ["r"], name="resize"),
        helper.make_node("QuantizeLinear", ["r", "s"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "s"], ["rd"]),
        helper.make_node("Shape", ["rd"], ["shape"]),
        helper.make_node("Gather", ["shape", "axis0"], ["batch"]),
        helper.make_node("Concat", ["batch", "minus1"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["rd", "new_shape"], ["flat"], name="reshape"),
        helper.make_node("QuantizeLinear", ["flat", "s"], ["fq"]),
        helper.make_node("DequantizeLinear", ["fq", "s"], ["y"]),
    ]
    inputs = [_float_input("x", [1, 2, 4, 4]), _float_input("s", [])]
    path = _save(tmp_path, nodes, inits, inputs, [_float_input("y", [1, 128])])
    summary = summarize(load_model(path))

    assert summary["ops"] == {
        "Reshape": {"quantized": 1, "partial": 0, "float": 0},
        "Resize": {"quantized": 1, "partial": 0, "float": 0},
    }
    assert summary["model"]["integer_only_nodes"] == 3
    assert summary["scales"]["count"] == 0 and summary["scales"]["dynamic"] == 6
    assert summary["quantized_tensors"]["activations"] == 3
    assert summary["quantized_tensors"]["qdq_pairs"] == {"shared": 0, "separate": 0}
    assert summary["notes"] == [
        "scales computed at run time in 6 Q/DQ nodes",
        "left out of the op counts: 3 compute nodes that only handle integer or bool tensors (shape arithmetic)",
    ]


def test_onnxruntime_quantize_static_per_channel(tmp_path):
    quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(0)
    inits = [
        _init("w1", rng.normal(size=(4, 3, 3, 3))), _init("b1", rng.normal(size=4)),
        _init("w2", rng.normal(size=(2, 4, 3, 3))), _init("b2", rng.normal(size=2)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    float_path = _save(tmp_path, nodes, inits, [_float_input("x", [1, 3, 8, 8])], [_float_input("y", [1, 2, 8, 8])],
                       name="float.onnx")

    class RandomData(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantized_path = tmp_path / "quantized.onnx"
    quantization.quantize_static(
        str(float_path), str(quantized_path), RandomData(),
        quant_format=quantization.QuantFormat.QDQ, per_channel=True,
    )
    summary = summarize(load_model(quantized_path))

    assert summary["ops"]["Conv"] == {"quantized": 2, "partial": 0, "float": 0}
    assert summary["float_islands"] == []
    tensors = summary["quantized_tensors"]
    # Both weights and both biases are stored per output channel.
    assert tensors["stored"] == 4
    assert tensors["by_granularity"]["per-axis"] == 4
    assert tensors["by_dtype"]["int8"] >= 2 and tensors["by_dtype"]["int32"] == 2


# --- --tensors on corpus models, checked against the file read with onnx and numpy ---------------------

CORPUS = Path(__file__).resolve().parent / "corpus"


def _file_params(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray | None, int]]:
    """Scale, zero-point and axis of each quantized value, by the name its Q reads or its DQ's stored integers."""
    graph = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    found = {}
    for node in graph.node:
        stored = node.op_type == "DequantizeLinear" and node.input[0] in inits
        if node.op_type == "QuantizeLinear" or stored:
            zero_point = inits[node.input[2]] if len(node.input) > 2 and node.input[2] else None
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            found[node.input[0]] = (inits[node.input[1]], zero_point, axis)
    return found


def _range(values: np.ndarray):
    low, high = float(values.min()), float(values.max())
    return low if low == high else [low, high]


def test_tensors_of_a_power_of_two_model_match_the_file():
    path = CORPUS / "quark" / "resnet_xint8.onnx"
    rows = tensors(load_model(path))
    expected = _file_params(path)

    assert sorted(row["name"] for row in rows) == sorted(expected)
    for row in rows:
        scale, zero_point, _ = expected[row["name"]]
        assert row["granularity"] == "per-tensor" and row["scale"] == float(scale)
        assert row["zero_point"] == int(zero_point) and row["dtype"] == str(zero_point.dtype)
        assert isinstance(row["pos"], int) and 2.0 ** -row["pos"] == float(scale)
    assert {row["role"] for row in rows} == {"activation", "weight", "bias"}


def test_tensors_of_a_per_channel_model_match_the_file():
    path = CORPUS / "ort" / "resnet_u8_per_channel_reduce_range.onnx"
    rows = {row["name"]: row for row in tensors(load_model(path))}
    expected = _file_params(path)

    assert set(rows) == set(expected)
    for name, (scale, zero_point, axis) in expected.items():
        row = rows[name]
        assert row["scale"] == _range(scale) and row["zero_point"] == _range(zero_point)
        assert row["dtype"] == str(zero_point.dtype) and row["pos"] is None  # no scale here is a power of two
        if scale.size > 1:
            assert (row["granularity"], row["axis"]) == ("per-axis", axis)
        else:
            assert (row["granularity"], row["axis"], row["role"]) == ("per-tensor", None, "activation")
    weights = [row for row in rows.values() if row["role"] == "weight"]
    assert len(weights) == 10 and all(row["dtype"] == "int8" and row["granularity"] == "per-axis" for row in weights)
    assert sum(row["role"] == "bias" for row in rows.values()) == 10


def test_tensors_text_is_aligned():
    rows = tensors(load_model(CORPUS / "ort" / "resnet_u8_per_channel_reduce_range.onnx"))
    lines = render_tensors(rows).splitlines()
    assert lines[0].split() == ["tensor", "dtype", "granularity", "scale", "zero", "point", "pos", "role"]
    assert len(lines) == len(rows) + 1
    column = lines[0].index("dtype")
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines)
    weight = next(line for line in lines if "fc.weight_quantized" in line)
    assert "per-axis 0" in weight and ".." in weight and weight.split()[-2:] == ["-", "weight"]


def test_inspect_several_models_with_tensors_as_json():
    paths = [CORPUS / "quark" / "resnet_xint8.onnx", CORPUS / "ort" / "resnet_u8_per_channel_reduce_range.onnx"]
    run = qdq("inspect", *paths, "--tensors", "--format", "json")
    assert run.code == 0, run.err
    summaries = run.json()
    assert [s["model"]["path"] for s in summaries] == [str(p) for p in paths]
    assert all(s["tensors"] == tensors(load_model(p)) for s, p in zip(summaries, paths))

    single = qdq("inspect", paths[0], "--format", "json").json()
    assert single["model"]["path"] == str(paths[0]) and "tensors" not in single
    text = qdq("inspect", *paths, "--tensors").out
    assert text.count("Model  ") == 2 and text.count("Tensors (") == 2
