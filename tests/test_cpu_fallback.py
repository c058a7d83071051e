"""QDQ811 cpu-fallback (issue 39): for npu, the compute ops outside the quantized graph, which the
NPU leaves to the CPU, are named one by one (NNCF's YOLOv8n kept 149 after a lint-clean fix)."""

from __future__ import annotations

import numpy as np
from builders import GraphBuilder
from cli_run import qdq

RNG = np.random.default_rng(0)


def conv(b: GraphBuilder, x: str, name: str) -> str:
    w = b.weight(f"{name}_w", RNG.normal(size=(2, 2, 1, 1)).astype(np.float32), scale=2**-6)
    return b.node("Conv", [x, w], name=name)


def silu_island(tmp_path):
    """DQ → conv1 → Sigmoid·Mul (float SiLU) → Q/DQ → conv2 → Relu → Q/DQ → AveragePool → DPU Mul → Q/DQ,
    and a shape Concat of int64 constants (not the NPU's data)."""
    b = GraphBuilder()
    x = b.qdq(b.input("x", [1, 2, 4, 4]), 2**-5, name="x")
    h = conv(b, x, "conv1")
    h = b.node("Mul", [h, b.node("Sigmoid", [h], name="sigmoid")], name="silu")
    h = b.qdq(b.node("Relu", [conv(b, b.qdq(h, 2**-4, name="silu"), "conv2")], name="relu"), 2**-4, name="relu")
    pooled = b.node("AveragePool", [h], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    pooled = b.node("Mul", [pooled, b.init("dpu_factor", np.float32(1.0))], name="pool_mul")
    shape = b.node("Concat", [b.init("a", np.array([1, 2], np.int64)), b.init("c", np.array([4], np.int64))],
                   name="shape", axis=0)
    b.node("Reshape", [b.qdq(pooled, 2**-4, name="pool"), shape], ["y"], name="reshape")
    b.output("y", [1, 2, 4])
    return b.save(tmp_path / "m.onnx")


def test_float_ops_are_named_and_counted(tmp_path):
    run = qdq("lint", silu_island(tmp_path), "--target", "npu", "--select", "QDQ811", "--format", "json")
    assert run.code == 0, run.err  # info: a lint-clean model may keep ops float on purpose
    findings = {f["node"]: f["message"] for f in run.json()["findings"]}
    assert sorted(findings) == ["conv1", "sigmoid", "silu"]
    assert "writes float" in findings["conv1"] and "reads float" in findings["silu"]
    assert all(f["severity"] == "info" for f in run.json()["findings"])


def test_only_the_npu_rule_set_reports_them(tmp_path):
    for target in ("trt", "ort"):
        run = qdq("lint", silu_island(tmp_path), "--target", target, "--format", "json")
        assert not [f for f in run.json()["findings"] if f["code"] == "QDQ811"], target
