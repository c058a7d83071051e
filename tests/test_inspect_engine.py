"""`qdq inspect-engine`: hazards of one engine, exit codes, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli

TRT = Path(__file__).parent / "fixtures" / "trt"
RESNET = TRT / "trex-v0.1.x" / "pytorch" / "resnet" / "A100"
MOBILENET = TRT / "trex-v0.1.x" / "tests-inputs"


def inspect(capsys, path: Path, *options) -> tuple[int, dict]:
    code = cli.main(["inspect-engine", str(path), "--format", "json", *map(str, options)])
    out, err = capsys.readouterr()
    assert err == ""
    return code, json.loads(out)


def test_bad_mobilenet_hazards(capsys):
    path = MOBILENET / "mobilenet.qat.onnx.engine.graph.json"
    code, report = inspect(capsys, path, "--profile", MOBILENET / "mobilenet.qat.onnx.engine.profile.json", "--top", 3)
    raw = json.loads(path.read_text())["Layers"]
    inner_qdq = [r["Name"] for r in raw if r.get("Origin") == "QDQ" and r["Inputs"][0]["Name"] != "input1"]
    assert code == 1 and len(inner_qdq) == 16
    assert [h["layers"][0] for h in report["hazards"] if h["kind"] == "qdq-reformat"] == inner_qdq
    residual = [h for h in report["hazards"] if h["kind"] == "float-residual"]
    assert len(residual) == 10 and {h["rule"] for h in residual} == {"QDQ802"}
    profile = json.loads((MOBILENET / "mobilenet.qat.onnx.engine.profile.json").read_text())[1:]
    slowest = sorted(profile, key=lambda row: -row["averageMs"])[:3]
    assert [s["name"] for s in report["slowest"]] == [row["name"] for row in slowest]


def test_float_island_in_an_int8_engine(capsys):
    code, report = inspect(capsys, RESNET / "qat" / "resnet-qat.onnx.engine.graph.json")
    islands = [h for h in report["hazards"] if h["kind"] == "float-island"]
    assert [h["layers"] for h in islands] == [["MaxPool_12"], ["GlobalAveragePool_246"]]
    assert islands[0]["rule"] == "QDQ402"


def test_only_the_network_input_q_is_clean(capsys):
    code, report = inspect(capsys, RESNET / "qat-residual-qgap" / "resnet-qat-residual-qgap.onnx.engine.graph.json")
    assert (code, report["hazards"]) == (0, [])
    assert report["engine"]["qdq_layers"] == 1


def test_text_report_and_exit_zero(capsys):
    code = cli.main(["inspect-engine", str(RESNET / "qat-residual" / "resnet-qat-residual.onnx.engine.graph.json"), "--exit-zero"])
    out = capsys.readouterr().out
    assert code == 0
    assert "qdq-reformat   DequantizeLinear_291: standalone DQ [INT8] -> [FP32]" in out and "-> QDQ802" in out


def test_malformed_file_exits_2(capsys, tmp_path):
    bad = tmp_path / "layer.json"
    bad.write_text('{"Layers": [{"Name": "a", "LayerType": "Reformat"},')
    out = tmp_path / "report.txt"
    assert cli.main(["inspect-engine", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid JSON" in err and not out.exists()


FLOAT_ENGINES = [RESNET / "fp16" / "resnet.onnx.engine.graph.json", RESNET / "fp32" / "resnet.onnx.engine.graph.json",
                 TRT / "trex-v0.1.x" / "tensorflow" / "resnet" / "RTX-3090" / "fp16" / "resnet.onnx.engine.graph.json",
                 TRT / "trex-v0.1.x" / "tensorflow" / "resnet" / "RTX-3090" / "fp32" / "resnet.onnx.engine.graph.json"]


@pytest.mark.parametrize("path", FLOAT_ENGINES, ids=lambda p: "-".join(p.parts[-4:-2]))
def test_float_engines_are_clean(capsys, path):
    """FP16/FP32 engines have reformats that change the type (TF fp16: FP32 -> FP16 after the input
    transpose, FP16 -> FP32 before the Softmax) but no Q/DQ near them: nothing to blame, exit 0."""
    raw = json.loads(path.read_text())["Layers"]
    assert not [r for r in raw if "Int8" in json.dumps(r) or r.get("Origin") == "QDQ"]
    code, report = inspect(capsys, path)
    assert (code, report["hazards"], report["engine"]["quantized"]) == (0, [], False)
    assert cli.main(["inspect-engine", str(path)]) == 0
    assert "note: no Q/DQ or INT8 layer: a float engine" in capsys.readouterr().out


def test_float_type_reformats_next_to_qdq_stay_hazards(capsys):
    """In the QAT ResNet the MaxPool's FP32 -> FP16 output reformat feeds a Q: still QDQ802."""
    _, report = inspect(capsys, RESNET / "qat" / "resnet-qat.onnx.engine.graph.json")
    reformats = [h for h in report["hazards"] if h["kind"] == "type-reformat"]
    assert [(h["layers"], h["rule"]) for h in reformats] == [
        (["Reformatting CopyNode for Output Tensor 0 to MaxPool_12"], "QDQ802")]
