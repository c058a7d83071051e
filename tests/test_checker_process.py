"""The ONNX checker in a second process beside the import: the same model, notes and refusals as in process.

Large models are checked by a child while the graph is built (`qdq.graph.checker_process`). These tests
force that path on the corpus's odd files, those whose check leads somewhere other than a plain
pass (a refusal onnxruntime overrules, repairs, an outright refusal), and compare what
`load_model` gives with the in-process check: the written proto, the notes, or the error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qdq.graph import checker_process
from qdq.graph.model import load_model, to_proto
from qdq.support.errors import ModelLoadError

CORPUS = Path(__file__).parent / "corpus"
CASES = {
    "plain": "ort/resnet_default.onnx",
    "checker refuses, onnxruntime loads": "public/onnxruntime/qdq_with_multi_consumer_q_dq_axis.onnx",
    "nodes out of order": "public/onnxruntime/constant_folding_dequantizelinear.onnx",
    "quark's order": "quark/resnet_xint8.onnx",
    "output without a shape": "public/polygraphy/qdq_conv.onnx",
    "refused": "public/polygraphy/weightless.qdq_conv.onnx",
}


def loaded(path: Path) -> tuple[str, object, list[str]]:
    """What load_model makes of a file: ("model", its proto as written, notes) or ("refused", message, [])."""
    try:
        model = load_model(path)
    except ModelLoadError as exc:
        return "refused", str(exc), []
    return "model", to_proto(model).SerializeToString(deterministic=True), model.notes


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_second_process_gives_what_the_check_in_process_gives(case, monkeypatch):
    path = CORPUS / CASES[case]
    started = []
    real = checker_process.CheckerProcess
    monkeypatch.setattr(checker_process, "CheckerProcess", lambda p, *full: started.append(p) or real(p, *full))
    in_process = loaded(path)
    assert started == []  # corpus files are far below MIN_NODES
    monkeypatch.setattr(checker_process, "MIN_NODES", 0)
    beside = loaded(path)
    assert started == [path]
    assert beside == in_process


def test_a_written_file_is_checked_fully_in_a_second_process_with_the_same_outcome(monkeypatch, tmp_path):
    """`save_model` runs the full check of a large output in a child while onnxruntime loads it here."""
    from qdq.graph.model import save_model

    started = []
    real = checker_process.CheckerProcess
    monkeypatch.setattr(checker_process, "CheckerProcess", lambda p, full: started.append(full) or real(p, full))
    save_model(load_model(CORPUS / CASES["plain"]), tmp_path / "in_process.onnx")
    monkeypatch.setattr(checker_process, "MIN_NODES", 0)
    save_model(load_model(CORPUS / CASES["plain"]), tmp_path / "beside.onnx")
    assert started == [False, True]  # the load's plain check, then the written file's full one
    assert (tmp_path / "beside.onnx").read_bytes() == (tmp_path / "in_process.onnx").read_bytes()


def test_the_child_reports_the_checkers_verdict():
    accepted = checker_process.CheckerProcess(CORPUS / CASES["plain"])
    refused = checker_process.CheckerProcess(CORPUS / CASES["refused"])
    assert accepted.accepted() is True
    assert refused.accepted() is False


def test_small_models_and_single_cores_check_in_process(monkeypatch, tmp_path):
    path = CORPUS / CASES["plain"]
    assert checker_process.start_checker(path, checker_process.MIN_NODES - 1) is None
    monkeypatch.setattr(checker_process, "usable_cores", lambda: 1)
    assert checker_process.start_checker(path, checker_process.MIN_NODES) is None


def test_usable_cores_are_those_the_process_may_run_on():
    assert 1 <= checker_process.usable_cores() <= (checker_process.os.cpu_count() or 1)


def test_a_frozen_application_checks_in_process(monkeypatch):
    monkeypatch.setattr(checker_process.sys, "frozen", True, raising=False)
    assert checker_process.start_checker(CORPUS / CASES["plain"], checker_process.MIN_NODES) is None


def test_no_interpreter_to_start_means_checking_in_process(monkeypatch):
    monkeypatch.setattr(checker_process.sys, "executable", "/nonexistent/python")
    monkeypatch.setattr(checker_process, "MIN_NODES", 0)
    assert checker_process.start_checker(CORPUS / CASES["plain"], 10) is None
    assert loaded(CORPUS / CASES["plain"])[0] == "model"


def test_the_session_child_reports_whether_onnxruntime_loads_the_file(tmp_path):
    (tmp_path / "not_onnx.onnx").write_bytes(b"not a model")
    with checker_process.SessionProcess(CORPUS / CASES["plain"]) as loads:
        assert loads.accepted("loading") is True
    with checker_process.SessionProcess(tmp_path / "not_onnx.onnx") as refuses:
        assert refuses.accepted("loading") is False


@pytest.mark.parametrize("target", ["npu", "trt"])
def test_a_large_fix_is_verified_beside_onnxruntimes_load_with_the_same_outcome(target, monkeypatch, tmp_path):
    """Above SESSION_MIN_NODES onnxruntime loads the written file in a child while the verdict runs here, and the
    verdict's shape inference runs in another: the same file, report and exit code as in process (npu's verdict
    refuses this fix, trt's passes it)."""
    from cli_run import qdq

    def fixed(where: str):
        out = tmp_path / where
        out.mkdir()
        run = qdq("fix", CORPUS / "ort/resnet_u8_per_channel_reduce_range.onnx", "--target", target, "-o",
                  out / "fixed.onnx", "--format", "json")
        written = (out / "fixed.onnx").read_bytes() if (out / "fixed.onnx").exists() else None
        return run.code, run.out.replace(str(out), "OUT"), written

    started, typed = [], []
    monkeypatch.setattr(checker_process, "SessionProcess", lambda p, real=checker_process.SessionProcess:
                        started.append(p) or real(p))
    monkeypatch.setattr(checker_process, "TypesProcess", lambda m, real=checker_process.TypesProcess:
                        typed.append(m) or real(m))
    in_process = fixed("in_process")
    monkeypatch.setattr(checker_process, "SESSION_MIN_NODES", 0)
    monkeypatch.setattr(checker_process, "MIN_NODES", 0)  # the checks too
    monkeypatch.setattr(checker_process, "TYPES_MIN_NODES", 0)  # and the verdict's shape inference
    beside = fixed("beside")
    assert len(started) == 1 and len(typed) == 1
    assert beside == in_process



@pytest.mark.parametrize("case", ["plain", "quark's order"])
def test_the_types_child_infers_the_element_types_inference_gives_in_process(case, monkeypatch):
    """On a large model onnx's shape inference runs in a child (it holds the interpreter lock for seconds):
    the same element types as in process."""
    import onnx

    from qdq.verification.pieces import element_types, start_element_types

    model = onnx.load(CORPUS / CASES[case])
    with start_element_types(model) as typing:
        assert typing is None  # corpus files are far below TYPES_MIN_NODES
        in_process = element_types(model, typing)
    monkeypatch.setattr(checker_process, "TYPES_MIN_NODES", 0)
    with start_element_types(model) as typing:
        assert isinstance(typing, checker_process.TypesProcess)
        beside = element_types(model, typing)
    assert len(in_process) > len(model.graph.input) and beside == in_process


def test_a_types_child_that_fails_leaves_the_inference_to_this_process(monkeypatch):
    import onnx

    from qdq.verification.pieces import element_types, start_element_types

    model = onnx.load(CORPUS / CASES["plain"])
    expected = element_types(model)
    monkeypatch.setattr(checker_process, "TYPES_MIN_NODES", 0)
    monkeypatch.setattr(checker_process.sys, "executable", "/bin/false")  # starts, and exits 1
    with start_element_types(model) as typing:
        assert typing.element_types("reading") is None
        assert element_types(model, typing) == expected
