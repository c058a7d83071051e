"""`qdq compare` on the NVIDIA TREx engine pairs: counts asserted from the JSON files themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from builders import GraphBuilder

import cli

TRT = Path(__file__).parent / "fixtures" / "trt"
MOBILENET = TRT / "trex-v0.1.x" / "tests-inputs"
MOBILENET_82 = TRT / "trex-v0.1.0" / "tests-inputs"
RESNET = TRT / "trex-v0.1.x" / "pytorch" / "resnet" / "A100"


def graph(folder: Path, stem: str) -> Path:
    return folder / f"{stem}.onnx.engine.graph.json"


def profile(folder: Path, stem: str) -> Path:
    return folder / f"{stem}.onnx.engine.profile.json"


def compare(capsys, a: Path, b: Path, *options) -> tuple[int, dict, str]:
    code = cli.main(["compare", str(a), str(b), "--format", "json", *map(str, options)])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def raw(path: Path) -> list[dict]:
    return json.loads(path.read_text())["Layers"]


def dtype(tensor: dict) -> str:
    return next(w for w in tensor["Format/Datatype"].split() if w in ("Int8", "FP16", "FP32"))


def float_residuals(path: Path) -> list[str]:
    """Fused Conv+Add layers with an Int8 conv input and a float residual input or output."""
    return [layer["Name"] for layer in raw(path) if len(layer["Inputs"]) == 2 and dtype(layer["Inputs"][0]) == "Int8"
            and (dtype(layer["Inputs"][1]) != "Int8" or dtype(layer["Outputs"][0]) != "Int8")]


def average_ms(path: Path) -> dict[str, float]:
    return {row["name"]: row["averageMs"] for row in json.loads(path.read_text())[1:]}


def test_mobilenet_bad_against_good(capsys):
    good, bad = graph(MOBILENET, "mobilenet_v2_residuals.qat"), graph(MOBILENET, "mobilenet.qat")
    code, report, err = compare(capsys, good, bad, "--profile-a", profile(MOBILENET, "mobilenet_v2_residuals.qat"),
                                "--profile-b", profile(MOBILENET, "mobilenet.qat"))
    assert (code, err) == (0, "")
    qdq_bad = [r["Name"] for r in raw(bad) if r.get("Origin") == "QDQ"]
    qdq_good = [r["Name"] for r in raw(good) if r.get("Origin") == "QDQ"]
    assert (len(qdq_bad), len(qdq_good)) == (17, 2)
    # The input Q and the Q after the global average pool are in both; the rest only in B.
    extra = [d["b"] for d in report["differences"] if d["kind"] == "only-in-b"]
    assert extra == [n for n in qdq_bad if n not in ("QuantizeLinear_2", "QuantizeLinear_854")]
    assert len(extra) == 15
    residual = float_residuals(bad)
    assert len(residual) == 10 and float_residuals(good) == []
    flagged = [d for d in report["differences"] if d["kind"] == "precision" and d["details"]["float_residual"]]
    assert [d["b"] for d in flagged] == residual
    times_a, times_b = average_ms(profile(MOBILENET, "mobilenet_v2_residuals.qat")), average_ms(profile(MOBILENET, "mobilenet.qat"))
    for diff in flagged:
        assert (diff["a_ms"], diff["b_ms"]) == (times_a[diff["a"]], times_b[diff["b"]])
        assert diff["rule"] == "QDQ802"
    assert report["totals"]["a"]["total_ms"] == pytest.approx(sum(times_a.values()))
    assert report["totals"]["b"]["total_ms"] == pytest.approx(sum(times_b.values()))
    assert {d["region"] for d in flagged} == {"features.%d" % i for i in (3, 5, 6, 8, 9, 10, 12, 13, 15, 16)}


def test_mobilenet_text_report_and_fail_on(capsys):
    good, bad = graph(MOBILENET, "mobilenet_v2_residuals.qat"), graph(MOBILENET, "mobilenet.qat")
    code = cli.main(["compare", str(good), str(bad), "--profile-a", str(profile(MOBILENET, "mobilenet_v2_residuals.qat")),
                     "--profile-b", str(profile(MOBILENET, "mobilenet.qat")), "--fail-on", "qdq-reformat,slower=30"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "Failed --fail-on: qdq-reformat: 15; slower: B takes +32.2 % (limit 30 %)" in out
    assert "QDQ802 x30" in out and "qdq fix --target trt" in out.splitlines()[-2]
    assert cli.main(["compare", str(good), str(bad), "--fail-on", "fusion"]) == 0
    capsys.readouterr()


def test_resnet_qat_against_qat_residual(capsys):
    good, bad = RESNET / "qat-residual" / "resnet-qat-residual.onnx.engine.graph.json", RESNET / "qat" / "resnet-qat.onnx.engine.graph.json"
    code, report, _ = compare(capsys, good, bad, "--profile-a", good.with_name("resnet-qat-residual.onnx.engine.profile.json"),
                              "--profile-b", bad.with_name("resnet-qat.onnx.engine.profile.json"))
    qdq_bad = [r["Name"] for r in raw(bad) if r.get("Origin") == "QDQ"]
    assert len(qdq_bad) == 10
    only_b = [d["b"] for d in report["differences"] if d["kind"] == "only-in-b" and d["details"]["role"] == "qdq"]
    # Input Q and the Q after the pool have a counterpart in the good engine.
    assert only_b == [n for n in qdq_bad if n not in ("QuantizeLinear_2", "QuantizeLinear_250")]
    residual_bad = float_residuals(bad)
    assert len(residual_bad) == 8 and len(float_residuals(good)) == 1
    flagged = {d["b"] for d in report["differences"] if d["kind"] in ("precision", "fusion")
               and d["b"] in residual_bad}
    # Three of them are fused with the other conv of their block in the good engine: fusion differences.
    assert flagged == set(residual_bad)
    assert {d["b"] for d in report["differences"] if d["kind"] == "fusion"} >= {
        "conv1.weight + QuantizeLinear_7 + Conv_9"}
    assert all(d["b_ms"] is not None for d in report["differences"] if d["b"])


def test_fp16_against_qat_reports_every_precision_change(capsys):
    fp16, qat = RESNET / "fp16" / "resnet.onnx.engine.graph.json", RESNET / "qat" / "resnet-qat.onnx.engine.graph.json"
    _, report, _ = compare(capsys, fp16, qat)
    convs = [r["Name"] for r in raw(qat) if r.get("ParameterType") == "Convolution"]
    changed = {d["b"] for d in report["differences"] if d["kind"] == "precision"}
    assert len(convs) == 21 and set(convs) <= changed
    assert all(d["details"]["direction"] == "gained-int8" for d in report["differences"]
               if d["kind"] == "precision" and d["b"] in convs)


def test_trt82_pair(capsys):
    good, bad = graph(MOBILENET_82, "mobilenet_v2_residuals.qat"), graph(MOBILENET_82, "mobilenet.qat")
    _, report, _ = compare(capsys, good, bad)
    scale_q = [r["Name"] for r in raw(bad) if r["LayerType"] == "Scale"]
    assert len(scale_q) == 17 and len([r for r in raw(good) if r["LayerType"] == "Scale"]) == 2
    only_b_qdq = [d["b"] for d in report["differences"] if d["kind"] == "only-in-b" and d["details"]["role"] == "qdq"]
    assert len(only_b_qdq) == 15 and set(only_b_qdq) < set(scale_q)
    residual = [d["b"] for d in report["differences"] if d["kind"] == "precision" and d["details"]["float_residual"]]
    assert residual == float_residuals(bad) and len(residual) == 10


def test_names_only_gives_a_reduced_comparison(capsys, tmp_path):
    bad = graph(MOBILENET, "mobilenet.qat")
    names_only = tmp_path / "names.json"
    names_only.write_text(json.dumps({"Layers": [r["Name"] for r in raw(bad)], "Bindings": ["input1", "1179"]}))
    _, report, _ = compare(capsys, graph(MOBILENET, "mobilenet_v2_residuals.qat"), names_only)
    assert any("lists layer names only" in note and "cannot be compared" in note for note in report["notes"])
    assert not [d for d in report["differences"] if d["kind"] == "precision"]
    assert len([d for d in report["differences"] if d["kind"] == "only-in-b"]) == 15
    code = cli.main(["compare", str(graph(MOBILENET, "mobilenet_v2_residuals.qat")), str(names_only)])
    assert code == 0 and "note: B (names.json) lists layer names only" in capsys.readouterr().out


def test_html_is_one_self_contained_file(capsys, tmp_path):
    good, bad = graph(MOBILENET, "mobilenet_v2_residuals.qat"), graph(MOBILENET, "mobilenet.qat")
    out = tmp_path / "report.html"
    code = cli.main(["compare", str(good), str(bad), "--profile-a", str(profile(MOBILENET, "mobilenet_v2_residuals.qat")),
                     "--profile-b", str(profile(MOBILENET, "mobilenet.qat")), "--format", "html", "-o", str(out)])
    assert code == 0 and capsys.readouterr().out == ""
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "<script src" not in html  # scripts are inline
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    assert "features.3.conv.2.weight + QuantizeLinear_119" in html and "features.3.conv.2.weight + QuantizeLinear_138" in html
    assert html.count("class='only-in-b'") == 15


def test_json_schema_is_stable(capsys):
    _, report, _ = compare(capsys, graph(MOBILENET, "mobilenet_v2_residuals.qat"), graph(MOBILENET, "mobilenet.qat"))
    assert set(report) == {"version", "tool", "command", "a", "b", "totals", "counts", "regions", "differences",
                           "pairs", "notes", "onnx", "failed"}
    assert report["version"] == 1 and report["counts"] == {"precision": 15, "only-in-b": 15}
    assert set(report["differences"][0]) == {"kind", "region", "message", "a", "b", "a_ms", "b_ms", "rule",
                                             "qdq_nodes", "details", "findings"}


def onnx_for_mobilenet(tmp_path: Path) -> Path:
    """A Q/DQ pair named like the MobileNet engines' QuantizeLinear_98, with [1]-shaped qparams (QDQ201)."""
    b = GraphBuilder(opset=13)
    x = b.input("x", [1, 4, 8, 8])
    w = b.dq(b.init("w_q", np.ones((4, 4, 3, 3), np.int8)), 0.02, name="w_dq")
    y = b.node("Conv", [b.dq(b.q(x, 0.05, name="QuantizeLinear_2"), 0.05, name="dq_in"), w], name="Conv_94")
    scale, zp = b.init("s98", np.array([0.1], np.float32)), b.init("z98", np.array([0], np.int8))
    yq = b.node("QuantizeLinear", [y, scale, zp], name="QuantizeLinear_98")
    b.node("DequantizeLinear", [yq, scale, zp], ["y"], name="DequantizeLinear_99")
    b.output("y", [1, 4, 6, 6])
    return b.save(tmp_path / "bad.onnx")


def test_onnx_findings_attach_to_the_layer_of_their_q_node(capsys, tmp_path):
    model = onnx_for_mobilenet(tmp_path)
    _, report, _ = compare(capsys, graph(MOBILENET, "mobilenet_v2_residuals.qat"), graph(MOBILENET, "mobilenet.qat"),
                           "--onnx", model)
    diff = next(d for d in report["differences"] if d["b"] == "QuantizeLinear_98")
    assert {f["node"] for f in diff["findings"]} == {"QuantizeLinear_98", "DequantizeLinear_99"}
    assert report["onnx"]["target"] in ("trt", "common")


@pytest.mark.parametrize("content", ["", "{", "[1, 2]", '{"Layers": 3}', '{"Layers": [{"Name": "a", "Inputs": 5}]}'])
def test_malformed_input_exits_2_and_writes_nothing(capsys, tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "report.json"
    code = cli.main(["compare", str(graph(MOBILENET, "mobilenet.qat")), str(bad), "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and not out.exists()
    assert err.startswith("qdq: error: ") and err.count("\n") == 1


def test_bad_fail_on_is_a_usage_error(capsys):
    g = graph(MOBILENET, "mobilenet.qat")
    assert cli.main(["compare", str(g), str(g), "--fail-on", "slower=5"]) == 2
    assert "needs --profile-a and --profile-b" in capsys.readouterr().err


TF_RESNET = TRT / "trex-v0.1.x" / "tensorflow" / "resnet" / "RTX-3090"


@pytest.mark.parametrize("folder", [RESNET, TF_RESNET], ids=["pytorch-resnet18", "tf-resnet50"])
def test_fp32_against_fp16_says_what_differs_without_rules(capsys, folder):
    fp32, fp16 = folder / "fp32" / "resnet.onnx.engine.graph.json", folder / "fp16" / "resnet.onnx.engine.graph.json"
    code, report, _ = compare(capsys, fp32, fp16, "--fail-on", "qdq-reformat,precision,fusion")
    assert (code, report["failed"]) == (0, [])
    assert report["totals"]["same_network"] and not report["totals"]["b"]["quantized"]
    assert [d for d in report["differences"] if d["rule"]] == []
    convs = [r["Name"] for r in raw(fp16) if r.get("ParameterType") == "Convolution"]
    precision = {d["b"]: d for d in report["differences"] if d["kind"] == "precision"}
    assert len(convs) in (21, 54) and set(convs) <= set(precision)
    assert all(d["details"]["direction"] == "changed" and "changes float precision" in d["message"]
               for d in precision.values())
    # The FP32 -> FP16 copy at the input: a type reformat only in the FP16 engine.
    assert any(d["kind"] == "only-in-b" and d["message"].startswith("type reformat only in B")
               and "[FP32] -> [FP16]" in d["message"] for d in report["differences"])
    assert any("has no Q/DQ or INT8 layer" in note for note in report["notes"])
    assert cli.main(["compare", str(fp32), str(fp16)]) == 0
    out = capsys.readouterr().out
    assert "QDQ" not in out and "qdq fix" not in out and "with other data types and no INT8" in out


def test_qat_against_fp16_blames_no_rule_on_the_float_engine(capsys):
    """Reversed: B has no Q/DQ, so every conv falls back to float, and nothing in B's model can be fixed."""
    code, report, _ = compare(capsys, RESNET / "qat" / "resnet-qat.onnx.engine.graph.json",
                              RESNET / "fp16" / "resnet.onnx.engine.graph.json")
    lost = [d for d in report["differences"] if d["kind"] == "precision" and d["details"]["direction"] == "lost-int8"]
    assert code == 0 and len(lost) == 21 and [d for d in report["differences"] if d["rule"]] == []


@pytest.mark.parametrize("a, b, paired, larger", [
    (RESNET / "fp16" / "resnet.onnx.engine.graph.json", graph(MOBILENET, "mobilenet_v2_residuals.qat"), 0, 54),
    (TF_RESNET / "qat" / "resnet-qat.onnx.engine.graph.json", RESNET / "qat" / "resnet-qat.onnx.engine.graph.json", 22, 60),
], ids=["resnet18-fp16-vs-mobilenet-qat", "resnet50-qat-vs-resnet18-qat"])
def test_different_networks_warn_and_suggest_nothing(capsys, a, b, paired, larger):
    """ResNet-50 against ResNet-18 pairs 22 layers by kind and shape (it used to blame 24 rules)."""
    code, report, _ = compare(capsys, a, b)
    warning = (f"only {paired} of {larger} compute layers pair: these look like different networks; "
               "the differences below are not evidence of a Q/DQ problem")
    assert code == 0 and report["notes"][0] == warning and not report["totals"]["same_network"]
    assert report["differences"] and [d for d in report["differences"] if d["rule"]] == []
    assert cli.main(["compare", str(a), str(b), "--fail-on", "qdq-reformat"]) == 1
    out = capsys.readouterr().out
    assert out.index("note: " + warning) < out.index("Differences by network region")
    assert "qdq fix" not in out and "Q/DQ placement rules" not in out
    assert f"Failed --fail-on: different networks: only {paired} of {larger} compute layers pair" in out


@pytest.mark.parametrize("qat, still_float", [("qat/resnet-qat", ["MaxPool_12", "GlobalAveragePool_246"]),
                                              ("qat-residual-qgap/resnet-qat-residual-qgap", [])])
def test_fp16_reference_names_what_stays_float_in_the_qat_engine(capsys, qat, still_float):
    """TensorRT 11 builds no PTQ engine; an FP16 engine of the float model is the reference instead."""
    _, report, _ = compare(capsys, RESNET / "fp16" / "resnet.onnx.engine.graph.json",
                           RESNET / f"{qat}.onnx.engine.graph.json")
    notes = [n for n in report["notes"] if "is a float engine" in n]
    if still_float:
        assert len(notes) == 1 and f"{len(still_float)} compute layer(s)" in notes[0]
        assert all(name in notes[0] for name in still_float)
    else:
        assert notes == []
