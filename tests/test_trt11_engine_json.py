"""TensorRT 11 layer-info JSON: NVIDIA's real 8.4 TREx pairs rewritten in the documented 11.x schema
(`I/O Tensors` objects, split `Format`/`DataType`; `fixtures/trt/trt11-converted/convert.py`, converted
by the documented schema, not real 11.x engines) must compare, map to ONNX, draw and inspect exactly
as the originals do: only the path and the inferred version may differ."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_compare import onnx_for_mobilenet

import cli

TRT = Path(__file__).parent / "fixtures" / "trt"
CONVERTED = TRT / "trt11-converted"
ORIGINAL = TRT / "trex-v0.1.x"
PAIRS = {  # (A, B): each file is under ORIGINAL and, converted, at the same path under CONVERTED
    "mobilenet": ("tests-inputs/mobilenet_v2_residuals.qat.onnx.engine.graph.json",
                  "tests-inputs/mobilenet.qat.onnx.engine.graph.json"),
    "resnet18": ("pytorch/resnet/A100/qat-residual/resnet-qat-residual.onnx.engine.graph.json",
                 "pytorch/resnet/A100/qat/resnet-qat.onnx.engine.graph.json"),
    "resnet18-fp16-reference": ("pytorch/resnet/A100/fp16/resnet.onnx.engine.graph.json",
                                "pytorch/resnet/A100/qat/resnet-qat.onnx.engine.graph.json"),
}
FILES = sorted({name for pair in PAIRS.values() for name in pair})


def run(capsys, *argv) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def without_origin(text: str) -> str:
    """The report with the fixture folder and the inferred TensorRT version blanked."""
    for folder in (CONVERTED, ORIGINAL):
        text = text.replace(str(folder), "<folder>")
    return re.sub(r"(TensorRT |\"version\": \")(11\.x|8\.4-8\.5)", r"\1<v>", text)


@pytest.mark.parametrize("fmt", ["json", "text", "html"])
@pytest.mark.parametrize("pair", PAIRS)
def test_converted_pair_compares_like_the_original(capsys, tmp_path, pair, fmt):
    converted, original = [CONVERTED / p for p in PAIRS[pair]], [ORIGINAL / p for p in PAIRS[pair]]
    onnx = ["--onnx", onnx_for_mobilenet(tmp_path)] if pair == "mobilenet" else []
    code_c, out_c = run(capsys, "compare", *converted, "--format", fmt, *onnx)
    code_o, out_o = run(capsys, "compare", *original, "--format", fmt, *onnx)
    assert code_c == code_o == 0
    if fmt == "json":
        report = json.loads(out_c)
        assert report["totals"]["a"]["version"] == report["totals"]["b"]["version"] == "11.x"
        assert report["differences"], "the pair differs: a test of nothing otherwise"
        if onnx:
            assert any(d["findings"] for d in report["differences"])
    same = without_origin(out_c) == without_origin(out_o)  # not `assert a == b`: pytest's diff of a page takes minutes
    assert same


@pytest.mark.parametrize("name", FILES)
def test_converted_engine_inspects_like_the_original(capsys, name):
    code_c, out_c = run(capsys, "inspect-engine", CONVERTED / name, "--format", "json")
    code_o, out_o = run(capsys, "inspect-engine", ORIGINAL / name, "--format", "json")
    assert code_c == code_o and json.loads(out_c)["engine"]["version"] == "11.x"
    assert without_origin(out_c) == without_origin(out_o)


def test_converted_files_are_what_the_script_writes(tmp_path):
    """The committed files are the script's output, and say they were converted."""
    copy = tmp_path / "convert.py"
    copy.write_text((CONVERTED / "convert.py").read_text().replace(
        'HERE = Path(__file__).resolve().parent', f'HERE = Path({str(tmp_path)!r})').replace(
        'ORIGINALS = HERE.parent / "trex-v0.1.x"', f'ORIGINALS = Path({str(ORIGINAL)!r})'))
    subprocess.run([sys.executable, str(copy)], check=True, capture_output=True)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.graph.json"))
    assert written == sorted(FILES)
    for name in written:
        assert (tmp_path / name).read_text() == (CONVERTED / name).read_text()
        document = json.loads((tmp_path / name).read_text())
        assert "Bindings" not in document and document["I/O Tensors"][0]["IOMode"] == "Input"
        assert not any("Format/Datatype" in t for layer in document["Layers"] for t in layer["Inputs"])
