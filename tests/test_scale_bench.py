"""Smoke test of benchmarks/scale.py: its generated models are valid, and a one-repeat run on
small ones judges every target of issue 8 from a measurement (the numbers themselves are not
asserted: at this size they say nothing about scale); and of benchmarks/graph_layer.py,
benchmarks/lint_profile.py, benchmarks/lint_floor.py and benchmarks/ort_session_phases.py, which run;
and of benchmarks/verdict.py: its measurement and replayed verdict, and the sign test of
benchmarks/significance.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import onnx

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_models_are_valid(tmp_path):
    models = load("scale_models")
    ladder = models.ladder(1000)
    assert 980 <= len(ladder.graph.node) <= 1000
    onnx.checker.check_model(ladder, full_check=True)
    ops = {node.op_type for node in ladder.graph.node}
    assert {"Conv", "MatMul", "Concat", "MaxPool", "Add", "QuantizeLinear", "DequantizeLinear"} <= ops

    external = models.external(tmp_path, gib=4 / 1024, tensor_mib=1)
    onnx.checker.check_model(str(external), full_check=True)
    proto = onnx.load(str(external), load_external_data=False)
    weights = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(weights) == 8  # four 1 MiB int8 weights and their float biases
    assert (tmp_path / "external.onnx.data").stat().st_size >= 4 * 2**20


def test_one_repeat_run_measures_every_target(tmp_path, capsys):
    scale = load("scale")
    out = tmp_path / "scale.json"
    assert scale.main(["--sizes", "300,600", "--external-gib", "0.004", "--repeats", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["failures"] == []  # no lint or fix crashed or exited 2 on the generated models
    targets = {t["target"]: t for t in results["targets"]}
    assert len(targets) == 4 + 4 + 4 + 2 + 4  # ratios, growth, external lint, verified fix (largest, external), external fix
    assert all(isinstance(t["measured"], float) for t in targets.values())
    assert targets["external fix npu keeps weights external, input data untouched"]["passed"]
    assert results["sizes"]["600"]["longest_still"]["steps"] > 1  # still.py recorded the verified fix's progress
    for command in scale.COMMANDS:
        assert results["sizes"]["600"]["median_s"][command] > 0
    printed = capsys.readouterr().out
    assert "targets:" in printed and printed.count("PASS") + printed.count("FAIL") >= len(targets)
    assert "onnxruntime opening the 600-node input takes" in printed


def test_graph_layer_benchmark_times_both_libraries(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # graph_layer.py imports scale_models from its folder
    out = tmp_path / "graph_layer.json"
    assert load("graph_layer").main(["--sizes", "1000", "--repeats", "1", "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())
    assert row["changes"] > 0
    assert all(row[f"{library}_{step}_s"] > 0 for library in ("qdq", "graphsurgeon") for step in ("read", "tidy", "write"))
    assert json.loads(capsys.readouterr().out) == row


def test_lint_profile_times_every_phase_and_rule(tmp_path, capsys):
    import qdq
    from qdq.engine.ruleset import load_target

    model = BENCHMARKS.parent / "examples" / "models" / "demo_fx_qat.onnx"
    out = tmp_path / "profile.json"
    assert load("lint_profile").main([str(model), "--target", "trt", "--repeats", "1", "--json", str(out)]) == 0
    profile = json.loads(out.read_text())
    phases = profile["seconds"]
    assert {"reading MODEL", "checking MODEL with the ONNX checker", "building the graph of MODEL",
            "indexing the Q/DQ nodes", "rendering the text report"} <= set(phases)
    assert {p for p in phases if p.startswith("QDQ")} == {rule.code for rule, _ in load_target("trt").enabled()}
    assert all(seconds >= 0 for seconds in phases.values()) and phases["building the graph of MODEL"] > 0
    assert profile["findings"] == len(qdq.lint(model, target="trt").findings)
    assert "slowest rules:" in capsys.readouterr().out


def test_lint_floor_reads_every_tensor_and_times_what_lint_pays_before_its_rules(tmp_path, capsys):
    benchmark = load("lint_floor")
    model = BENCHMARKS.parent / "examples" / "models" / "demo_fx_qat.onnx"
    proto = onnx.load(str(model))
    names = {i.name for i in proto.graph.initializer} | {
        name for node in proto.graph.node for name in [*node.input, *node.output]}
    assert benchmark.table_read(proto) == len(names)
    out = tmp_path / "floor.json"
    assert benchmark.main([str(model), "--repeats", "1", "--json", str(out)]) == 0
    floor = json.loads(out.read_text())
    phases = floor["seconds"]
    assert {"onnx.load", "onnx.save", "table read (the floor)", "qdq: reading and checking", "qdq: building the graph",
            "qdq: indexing the Q/DQ nodes", benchmark.PROCESS_START} == set(phases)
    assert all(seconds > 0 for seconds in phases.values())
    assert floor["before_rules"] > phases[benchmark.PROCESS_START]
    assert "left for the rules and the report at 4x" in capsys.readouterr().out


def test_ort_session_phases_finds_every_phase_in_onnxruntimes_log(tmp_path, capsys):
    benchmark = load("ort_session_phases")
    model = BENCHMARKS.parent / "examples" / "models" / "demo_fx_qat.onnx"
    out = tmp_path / "phases.json"
    assert benchmark.main([str(model), "--json", str(out)]) == 0
    seconds = json.loads(out.read_text())["seconds"][str(model)]
    assert set(benchmark.PHASES) <= set(seconds), "a phase's log lines are missing: onnxruntime changed its words"
    assert all(value >= 0 for value in seconds.values()) and seconds["total"] > 0
    assert abs(sum(v for phase, v in seconds.items() if phase != "total") - seconds["total"]) < 1e-6
    assert str(model) in capsys.readouterr().out


def test_verdict_benchmark_measures_a_fix_against_the_task(tmp_path, capsys):
    """benchmarks/verdict.py on one corpus model: the task paired sample by sample, and each judged row's
    distances on both kinds of inputs; --choose replays the verdict on them over its grids."""
    import pytest

    pytest.importorskip("torch", reason="benchmarks/verdict.py re-makes the digits split with PyTorch")
    pytest.importorskip("sklearn", reason="the digits come with scikit-learn")
    verdict = load("verdict")
    out = tmp_path / "verdict.json"
    verdict.main(["--limit", "1", "--targets", "trt", "--json", str(out)])
    [row] = json.loads(out.read_text())["rows"]
    task = row["task"]
    assert 80 < task["float"] <= 100 and task["samples"] == 360
    assert task["fixed"] - task["input"] == pytest.approx(100 * (task["better"] - task["worse"]) / 360)
    for inputs in ("random", "held_out"):
        assert row[inputs]["twin"] and len(row[inputs]["outputs"][0]) == 3 and len(row[inputs]["deep"]) == 2
    grid = tmp_path / "grid.json"
    verdict.main(["--choose", str(out), "--json", str(grid)])
    chosen = json.loads(grid.read_text())
    assert len(chosen["deep"]) == len(verdict.DEEP_MARGINS) * len(verdict.DEEP_EPSILONS)
    assert all(t["judged"] == 2 for t in chosen["deep"] + chosen["outputs"])  # random and held-out, evidence on both


def test_the_verdict_benchmark_judges_an_exact_fix_as_qdq_fix_does(tmp_path):
    """The benchmark that set the margins must give fix's verdict: a fix whose changes all claim to be exact
    (QDQ505 re-typing int8 as uint8 for ort) is held to identity, without a twin, as fix holds it."""
    import numpy as np
    from cli_run import qdq
    from test_verdict import relu_net

    verdict = load("verdict")
    model = relu_net(tmp_path / "m.onnx", 0, np.int8)
    fixed, exact = verdict.fixed_by(model, "ort", tmp_path)
    held_out = [{"x": np.random.default_rng(0).uniform(-3, 3, (1, 4, 8, 8)).astype(np.float32)}]
    rows = verdict.verdicts(model, fixed, exact, "ort", held_out, "one sample")
    report = tmp_path / "report.json"
    qdq("fix", model, "--target", "ort", "-o", tmp_path / "by_fix.onnx", "--report", report)
    shipped = json.loads(report.read_text())["verification"]
    assert exact and shipped["twin"] == "no float twin: the change claims to be exact"
    assert not rows["random"]["twin"] and rows["random"]["passed"] == shipped["passed"]
    assert not rows["held_out"]["twin"]


def test_the_sign_test_against_exact_binomial_figures():
    significance = load("significance")
    assert significance.sign_test(0, 0) == 1.0 and significance.sign_test(3, 3) == 1.0
    assert significance.sign_test(2, 0) == 0.5  # two images lost of 64: chance
    assert significance.sign_test(6, 0) == significance.sign_test(0, 6) == 2 / 64
    assert abs(significance.sign_test(9, 1) - 2 * 11 / 1024) < 1e-12


def test_a_loss_is_lost_only_past_keep_and_beyond_chance():
    significance = load("significance")
    task = {"input": 100.0, "keep": 2.0}
    assert significance.outcome(task | {"fixed": 98.5, "p": 0.01}) == "kept"
    assert significance.outcome(task | {"fixed": 96.9, "p": 0.5}) == "unclear"
    assert significance.outcome(task | {"fixed": 90.0, "p": 0.002}) == "lost"
    assert significance.outcome({"input": 0.0, "fixed": 0.0, "keep": 2.0, "p": 1.0}) == "kept"


def test_the_replayed_verdict_holds_each_row_to_its_own_allowance():
    """An output well within the outputs' allowance, the deepest tensors 2.5 times further from the twin:
    only the deep row's margin decides."""
    verdict = load("verdict")
    rows = {"twin": True, "outputs": [[0.1, 0.12, True]], "deep": [0.4, 1.0], "passed": False}
    assert verdict.replay(rows, 0.41, 0.03, 0.41, 0.03) == "refuse"
    assert verdict.replay(rows, 10.0, 0.03, 0.41, 0.03) == "refuse"
    assert verdict.replay(rows, 0.41, 0.03, 1.5, 0.0) == "pass"
    assert verdict.replay(rows | {"outputs": [[0.1, 0.12, False]]}, 0.41, 0.03, 1.5, 0.0) == "no evidence"
    lost = {"corpus": "trained", "task": {"input": 100.0, "fixed": 80.0, "keep": 2.0, "p": 0.001},
            "random": rows, "held_out": rows | {"deep": None}}
    counts = verdict.disagreements([lost], 0.41, 0.03, 1.5, 0.0)
    assert counts["trained random"]["false_pass"] == 1 and counts["trained held_out"]["false_pass"] == 1
    assert verdict.disagreements([lost], 0.41, 0.03, 0.41, 0.03)["trained random"]["false_pass"] == 0


def test_the_trained_table_judges_a_loss_by_the_same_sign_test():
    """benchmarks/trained.py calls a pass that loses 4.9 points on 5 of 32 pages (p 0.06) unclear, not a
    disagreement, as benchmarks/verdict.py does; on 6 pages (p 0.03) it is one, and so is a refusal that keeps the task."""
    trained = load("trained")
    row = {"task": "det", "input": {"f1": 0.975}, "fixed": {"f1": 0.926},
           "verdict_random": {"passed": True, "evidence": True}, "paired": {"worse": 5, "better": 0, "p": 0.0625}}
    assert not trained.disagrees(row, "verdict_random") and "p 0.062" in trained.disagreement(row, "verdict_random")
    assert trained.disagrees(row | {"paired": {"worse": 6, "better": 0, "p": 0.03125}}, "verdict_random")
    refused = row | {"verdict_random": {"passed": False, "evidence": True}, "fixed": {"f1": 0.97}}
    assert trained.disagrees(refused, "verdict_random")
