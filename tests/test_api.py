"""`qdq.lint` and `qdq.fix` on a path, an onnx.ModelProto or a loaded model, and docs/python-api.md as written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import onnx
import pytest

import qdq
from qdq.support.errors import QdqError

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "models" / "demo_fx_qat.onnx"
RESNET = ROOT / "tests" / "corpus" / "ort" / "resnet_default.onnx"


def _report(result: qdq.LintResult) -> list[dict]:
    return [f.to_dict() for f in result.findings]


@pytest.mark.parametrize("target", ["npu", "trt"])
def test_every_form_of_a_model_lints_alike(target: str) -> None:
    expected = _report(qdq.lint(qdq.load_model(RESNET), qdq.load_target(target)))  # the positional form
    assert expected
    assert _report(qdq.lint(RESNET, target=target)) == expected
    assert _report(qdq.lint(str(RESNET), target=target)) == expected
    assert _report(qdq.lint(onnx.load(RESNET), target=target)) == expected
    assert _report(qdq.lint(RESNET, ruleset=qdq.load_target(target))) == expected


def test_a_model_proto_with_external_data_in_memory(tmp_path: Path) -> None:
    stored = tmp_path / "external.onnx"
    onnx.save(onnx.load(DEMO), stored, save_as_external_data=True, location="external.data", size_threshold=0)
    assert (tmp_path / "external.data").stat().st_size > 0
    assert _report(qdq.lint(onnx.load(stored), target="npu")) == _report(qdq.lint(DEMO, target="npu"))


def test_rules_by_name_or_set_not_both() -> None:
    with pytest.raises(TypeError):
        qdq.lint(DEMO)
    with pytest.raises(TypeError):
        qdq.lint(DEMO, qdq.load_target("npu"), target="npu")


def test_a_bad_path_is_a_one_line_qdq_error(tmp_path: Path) -> None:
    with pytest.raises(QdqError, match="no such file"):
        qdq.lint(tmp_path / "missing.onnx", target="npu")


def test_fixing_a_path_leaves_the_file_and_returns_the_fixed_model(tmp_path: Path) -> None:
    before = DEMO.read_bytes()
    fixed = qdq.fix(DEMO, target="npu")
    assert DEMO.read_bytes() == before
    assert fixed.changes and fixed.converged and fixed.result.findings == []
    qdq.save_model(fixed.model, tmp_path / "fixed.onnx")
    assert qdq.lint(tmp_path / "fixed.onnx", target="npu").findings == []


def test_fixing_a_model_proto_leaves_it_as_it_was(tmp_path: Path) -> None:
    proto = onnx.load(DEMO)
    before = proto.SerializeToString()
    fixed = qdq.fix(proto, target="npu")
    assert proto.SerializeToString() == before
    qdq.save_model(fixed.model, tmp_path / "fixed.onnx")
    assert qdq.lint(tmp_path / "fixed.onnx", target="npu").findings == []
    assert qdq.lint(proto, target="npu").findings, "the ModelProto still has what the fix removed"


def test_fixing_a_loaded_model_edits_it_in_place() -> None:
    model = qdq.load_model(DEMO)
    fixed = qdq.fix(model, qdq.load_target("npu"), max_rounds=8)
    assert fixed.model is model and fixed.changes
    assert qdq.lint(model, target="npu").findings == []


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def test_python_api_doc_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Each block of docs/python-api.md on its own, from a checkout's top folder (a copy, so outputs land in tmp)."""
    blocks = _python_blocks((ROOT / "docs" / "python-api.md").read_text())
    assert len(blocks) >= 5
    (tmp_path / DEMO.relative_to(ROOT)).parent.mkdir(parents=True)
    shutil.copy2(DEMO, tmp_path / DEMO.relative_to(ROOT))
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "docs/python-api.md", "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out
    assert "QDQ610 error" in printed and "missing.onnx: no such file" in printed
    assert qdq.lint("demo_npu.onnx", target="npu").findings == []
    assert (tmp_path / "demo_trt.onnx").is_file()
