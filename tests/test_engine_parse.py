"""Parsing trtexec layer-info and profile files of every TensorRT version into one engine model.

Counts are taken from the JSON files directly, never through the parser under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qdq.trt import names
from qdq.trt.layers import EngineFileError, load_layer_info
from qdq.trt.profile import attach_profile, load_profile

TRT = Path(__file__).parent / "fixtures" / "trt"
MOBILENET_82 = TRT / "trex-v0.1.0" / "tests-inputs"
MOBILENET_84 = TRT / "trex-v0.1.x" / "tests-inputs"
YOLO = TRT / "trt8.5-layer-names-only-qat-yolo"


def raw_layers(path: Path) -> list:
    return json.loads(path.read_text())["Layers"]


def test_trt82_scale_type_q_layers_are_qdq():
    path = MOBILENET_82 / "mobilenet.qat.onnx.engine.graph.json"
    expected = [layer["Name"] for layer in raw_layers(path)
                if layer["LayerType"] == "Scale" and layer.get("Mode") == "UNIFORM"
                and ("Int8" in layer["Inputs"][0]["Format/Datatype"]) != ("Int8" in layer["Outputs"][0]["Format/Datatype"])]
    engine = load_layer_info(path)
    assert len(expected) == 17
    assert [layer.name for layer in engine.layers if layer.is_qdq] == expected
    assert engine.version == "8.2" and engine.detailed
    assert engine.bindings == ["input1", "1179"]


def test_trt84_origin_qdq_and_precisions():
    path = MOBILENET_84 / "mobilenet.qat.onnx.engine.graph.json"
    raw = raw_layers(path)
    engine = load_layer_info(path)
    assert [layer.name for layer in engine.layers if layer.is_qdq] == [r["Name"] for r in raw if r.get("Origin") == "QDQ"]
    residual = next(layer for layer in engine.layers if layer.name.endswith("Conv_142 + Add_144"))
    assert residual.input_precisions == ["INT8", "FP16"] and residual.output_precisions == ["FP16"]
    assert residual.weights_int8 and residual.kind == "Convolution" and residual.layer_type == "CaskConvolution"
    assert residual.ops == ["Conv", "Add"] and residual.qdq_nodes == ("QuantizeLinear_138",)
    assert residual.inputs[1].dims == (1, 24, 56, 56)
    assert engine.version == "8.4-8.5"


def test_names_only_file():
    path = YOLO / "layer_info.json"
    raw = raw_layers(path)
    engine = load_layer_info(path)
    assert not engine.detailed and engine.version == "unknown"
    assert [layer.name for layer in engine.layers] == raw
    bare_qdq = [n for n in raw if " + " not in n and n.rsplit("/", 1)[-1].split("_clone")[0] in ("QuantizeLinear", "DequantizeLinear")]
    assert len(bare_qdq) == 12
    assert [layer.name for layer in engine.layers if layer.is_qdq] == bare_qdq
    assert all(layer.qdq_direction == "Q" for layer in engine.layers if layer.is_qdq)


def test_fused_name_syntax():
    assert names.onnx_nodes("w.weight + QuantizeLinear_7 + Conv_9 + PWN(PWN(Sigmoid_3), Mul_4)") == [
        "w.weight", "QuantizeLinear_7", "Conv_9", "Sigmoid_3", "Mul_4"]
    assert names.onnx_nodes("{ForeignNode[/a/MatMul.../b/Add]}") == ["/a/MatMul", "/b/Add"]
    assert names.onnx_nodes("Conv_1 || Conv_2") == ["Conv_1", "Conv_2"]
    assert names.onnx_nodes("x + (Unnamed Layer* 849) [Shuffle] + DequantizeLinear_62 + QuantizeLinear_378_clone_0") == [
        "x", "(Unnamed Layer* 849) [Shuffle]", "DequantizeLinear_62", "QuantizeLinear_378"]
    assert names.onnx_nodes("Reformatting CopyNode for Input Tensor 0 to Conv_5 + Add_6") == []
    assert names.op_type("/backbone/conv1/Conv_1") == "Conv" and names.op_type("(Unnamed Layer* 3) [Shuffle]") == "Shuffle"
    assert names.qdq_kind("QuantLinearNode__838") == "Q" and names.qdq_kind("DequantizeLinear_291") == "DQ"


def test_trt10_metadata_and_kgen_layers(tmp_path):
    layers = [
        {"Name": "__myl_MulMinMaxRounCast_myl0_1", "LayerType": "kgen",
         "Inputs": [{"Name": "x", "Dimensions": [1, 8], "Format/Datatype": "Float"}],
         "Outputs": [{"Name": "xq", "Dimensions": [1, 8], "Format/Datatype": "Int8"}],
         "Metadata": "[ONNX Layer: /qact_input/QuantizeLinear]\u001f"},
        {"Name": "/fc1/Gemm_myl0_2", "LayerType": "gemm",
         "Inputs": [{"Name": "xq", "Dimensions": [1, 8], "Format/Datatype": "Int8"}],
         "Outputs": [{"Name": "y", "Dimensions": [1, 4], "Format/Datatype": "Half"}],
         "Metadata": "[ONNX Layer: /fc1/Gemm]\u001f[ONNX Layer: /qact_input/DequantizeLinear]\u001f"
                     "[ONNX Layer: /fc1/DequantizeLinear]"},
    ]
    path = tmp_path / "trt10.json"
    path.write_text(json.dumps({"Layers": layers, "Bindings": ["x", "y"]}))
    engine = load_layer_info(path)
    assert engine.version == "10.x"
    quantize, gemm = engine.layers
    assert quantize.onnx_nodes == ("/qact_input/QuantizeLinear",)
    assert gemm.onnx_nodes == ("/fc1/Gemm", "/qact_input/DequantizeLinear", "/fc1/DequantizeLinear")
    assert gemm.ops == ["Gemm"] and gemm.input_precisions == ["INT8"] and gemm.output_precisions == ["FP16"]
    assert gemm.stable_nodes == {"/fc1/Gemm"} and gemm.own_region == "fc1"


def test_trt10_fp8_and_int4_formats_are_low_precision_not_float(tmp_path):
    """TensorRT 10 writes `Row major linear FP8 format` for FP8 tensors (and FP4 and Int4 likewise):
    a layer reading them is quantized, and the Q that makes FP8 is a Q/DQ layer, not a float island."""
    layers = [
        {"Name": "/q/QuantizeLinear", "LayerType": "Scale",
         "Inputs": [{"Name": "x", "Dimensions": [1, 64], "Format/Datatype": "Row major linear FP16 format"}],
         "Outputs": [{"Name": "xq", "Dimensions": [1, 64], "Format/Datatype": "Row major linear FP8 format"}]},
        {"Name": "/fc/MatMul", "LayerType": "gemm",
         "Inputs": [{"Name": "xq", "Dimensions": [1, 64], "Format/Datatype": "Row major linear FP8 format"},
                    {"Name": "w", "Dimensions": [64, 64], "Format/Datatype": "Row major linear Int4 format"}],
         "Outputs": [{"Name": "y", "Dimensions": [1, 64], "Format/Datatype": "Row major linear FP16 format"}]},
        {"Name": "/fc2/MatMul", "LayerType": "gemm",
         "Inputs": [{"Name": "y", "Dimensions": [1, 64], "Format/Datatype": "Row major linear FP4 format (kLINEAR)"}],
         "Outputs": [{"Name": "z", "Dimensions": [1, 64], "Format/Datatype": "Row major linear FP16 format"}]},
    ]
    path = tmp_path / "fp8.json"
    path.write_text(json.dumps({"Layers": layers, "Bindings": ["x", "z"]}))
    engine = load_layer_info(path)
    quantize, fp8_gemm, fp4_gemm = engine.layers
    assert quantize.output_precisions == ["FP8"] and quantize.is_qdq and engine.quantized
    assert fp8_gemm.input_precisions == ["FP8", "INT4"] and fp8_gemm.runs_low_bit
    assert fp4_gemm.input_precisions == ["FP4"] and fp4_gemm.runs_low_bit


def test_trt11_io_tensors_and_split_fields(tmp_path):
    document = {
        "Layers": [{"Name": "QuantizeLinear_2", "LayerType": "Reformat", "ParameterType": "Reformat", "Origin": "QDQ",
                    "Inputs": [{"Name": "in", "Dimensions": [1, 3], "Format": "Row major linear", "Datatype": "FP32"}],
                    "Outputs": [{"Name": "q", "Dimensions": [1, 3], "Format": "Channel major", "DataType": "Int8"}]}],
        "I/O Tensors": [{"Name": "in", "IOMode": "INPUT", "DataType": "FP32"}, {"Name": "q", "IOMode": "OUTPUT"}],
    }
    path = tmp_path / "trt11.json"
    path.write_text(json.dumps(document))
    engine = load_layer_info(path)
    assert engine.version == "11.x" and engine.bindings == ["in", "q"]
    (layer,) = engine.layers
    assert layer.is_qdq and layer.input_precisions == ["FP32"] and layer.output_precisions == ["INT8"]


def test_per_layer_dumps(tmp_path):
    raw = raw_layers(MOBILENET_84 / "mobilenet.qat.onnx.engine.graph.json")[:3]
    path = tmp_path / "dump.txt"
    path.write_text("".join(f"--- Layer {i} ---\n{json.dumps(layer, indent=1)}\n" for i, layer in enumerate(raw)))
    assert [layer.name for layer in load_layer_info(path).layers] == [layer["Name"] for layer in raw]


def test_profile_with_unescaped_names_and_without_median(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('[\n  { "count" : 10 }\n'
                    ', { "name" : "say "hi" \\ there", "timeMs" : 1.5, "averageMs" : 0.15, "percentage" : 60 }\n'
                    ', { "name" : "b", "timeMs" : 1, "averageMs" : 0.1, "medianMs" : 0.09, "percentage" : 40 }\n]\n')
    rows = load_profile(path)
    assert [(r.name, r.average_ms, r.median_ms) for r in rows] == [('say "hi" \\ there', 0.15, None), ("b", 0.1, 0.09)]


def test_profile_rows_join_layers_in_order():
    engine = load_layer_info(MOBILENET_82 / "mobilenet.qat.onnx.engine.graph.json")
    path = MOBILENET_82 / "mobilenet.qat.onnx.engine.profile.json"
    rows = json.loads(path.read_text())[1:]
    attach_profile(engine, load_profile(path), path)
    assert "medianMs" not in rows[0]
    assert [layer.time_ms for layer in engine.layers] == [row["averageMs"] for row in rows]
    assert engine.total_ms() == pytest.approx(sum(row["averageMs"] for row in rows))


@pytest.mark.parametrize("content, message", [
    ("", "empty"),
    ("not json", "not valid JSON"),
    ('{"Layers": [{"Name": "a", "LayerType": "Reformat"}', "truncated"),
    ('{"layers": []}', 'an object with a "Layers" list'),
    ('{"Layers": []}', "empty"),
    ('{"Layers": [{"Name": "a"}, "b"]}', "Layers[1] is a string"),
    ('[{"count": 3}, {"name": "a", "timeMs": 1, "averageMs": 1, "percentage": 1}]', "--exportProfile"),
])
def test_malformed_layer_info(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(EngineFileError, match=message.replace("[", r"\[")):
        load_layer_info(path)


def test_profile_of_another_engine_is_refused(tmp_path):
    engine = load_layer_info(MOBILENET_84 / "mobilenet.qat.onnx.engine.graph.json")
    path = YOLO / "profile.json"
    with pytest.raises(EngineFileError, match="no row names a layer"):
        attach_profile(engine, load_profile(path), path)


def test_trt11_tensor_without_a_dtype_key_takes_its_format_word(tmp_path):
    document = {"Layers": [{"Name": "conv", "LayerType": "CaskConvolution",
                            "Inputs": [{"Name": "x", "Format": "Row major linear FP16 format (kLINEAR)"}]}],
                "I/O Tensors": [{"Name": "x", "IOMode": "Input"}]}
    path = tmp_path / "trt11.json"
    path.write_text(json.dumps(document))
    assert load_layer_info(path).layers[0].input_precisions == ["FP16"]
