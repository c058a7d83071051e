"""The independent checkers of "clean" (`npu_constraints.py`, `trt_placement.py`, `ort_node_units.py`)
on graphs that break one catalogue rule each, and their nearest clean neighbours: a checker that
passes everything would let the conformance run's lint-clean check pass everything too."""

from __future__ import annotations

import numpy as np
import npu_constraints
import ort_node_units
import trt_placement
from builders import GraphBuilder
from test_rules_placement import concat_residual_block

RNG = np.random.default_rng(0)


def conv(b: GraphBuilder, x: str, name: str, weight_type=None) -> str:
    values = RNG.normal(size=(2, 2, 1, 1)).astype(np.float32)
    if weight_type is None:
        w = b.weight(f"{name}_w", values, scale=2**-6)
    else:
        b.init(f"{name}_wq", np.clip(np.round(values * 4), -8, 7).astype(weight_type))
        w = b.dq(f"{name}_wq", 0.25, dtype=weight_type, name=f"{name}_wdq")
    return b.node("Conv", [x, w], name=name)


# --- npu ---------------------------------------------------------------------------------------------


def leaky(alpha: float):
    b = GraphBuilder()
    x = b.qdq(b.input("x", [1, 2, 4, 4]), 2**-4)
    b.node("LeakyRelu", [b.qdq(conv(b, x, "conv"), 2**-4)], ["y"], alpha=alpha)
    b.output("y", [1, 2, 4, 4])
    return b.model()


def test_npu_leaky_relu_slope_is_the_dpus():
    assert npu_constraints.check(leaky(26 / 256)) == []
    assert npu_constraints.tags(npu_constraints.check(leaky(0.1))) == {"leaky-relu"}


# --- trt ---------------------------------------------------------------------------------------------


def test_trt_residual_rule_is_for_int8_convs_only():
    """A float model has no residual to quantize; NNCF's Concat residual beside a quantized conv has."""
    b = GraphBuilder()
    x = b.input("x", [1, 2, 4, 4])
    h = b.node("Conv", [x, b.init("w", RNG.normal(size=(2, 2, 1, 1)).astype(np.float32))], name="conv")
    b.node("Add", [h, x], ["y"], name="add")
    b.output("y", [1, 2, 4, 4])
    assert trt_placement.violations(b.model()) == []
    found = trt_placement.violations(concat_residual_block().model())
    assert found == ["add: residual input of a quantized conv's activation is not dequantized"], found


def test_trt_an_add_of_a_constant_is_no_residual():
    """Hard-swish's x + 3 after a quantized conv's Q/DQ is no residual Add; the same Add of a graph
    input is one, with its Q/DQ in the wrong place."""
    for second, residual in (("three", False), ("r", True)):
        b = GraphBuilder()
        h = b.qdq(conv(b, b.qdq(b.input("x", [1, 2, 4, 4]), 2**-4), "conv"), 2**-4)
        b.init("three", np.full((1,), 3, np.float32))
        b.input("r", [1, 2, 4, 4])
        b.node("Add", [h, second], ["y"], name="add")
        b.output("y", [1, 2, 4, 4])
        found = trt_placement.violations(b.model())
        assert any(v.startswith("add:") for v in found) == residual, (second, found)


def test_trt_a_conv_whose_quantized_output_fans_out_has_no_residual_to_fuse():
    """Conv → Q → DQ → Add with the DQ also read elsewhere (PP-OCR's FPN): TensorRT cannot fuse the
    Add into the conv, so the Q/DQ on the conv side is no violation; with the Add its only reader it is."""
    for shared in (True, False):
        b = GraphBuilder()
        h = b.qdq(conv(b, b.qdq(b.input("x", [1, 2, 4, 4]), 2**-4), "conv"), 2**-4)
        b.node("Add", [h, b.qdq(b.input("r", [1, 2, 4, 4]), 2**-4)], ["y"], name="add")
        b.output("y", [1, 2, 4, 4])
        if shared:
            b.node("Relu", [h], ["z"], name="relu")
            b.output("z", [1, 2, 4, 4])
        found = trt_placement.violations(b.model())
        assert ("add: a Q/DQ sits between every conv input and the Add" in found) != shared, (shared, found)


def test_trt_formats_are_tensorrts():
    """int4 is a TensorRT weight type, uint8 is no TensorRT type."""
    for weight_type, clean in ((np.int8, True), (np.uint8, False)):
        b = GraphBuilder()
        b.output(conv(b, b.qdq(b.input("x", [1, 2, 4, 4]), 0.1), "conv", weight_type), [1, 2, 4, 4])
        assert (trt_placement.violations(b.model()) == []) == clean, weight_type


def test_trt_per_channel_weights_run_along_the_output_channels():
    for axis, clean in ((0, True), (1, False)):
        b = GraphBuilder()
        x = b.qdq(b.input("x", [1, 2, 4, 4]), 0.1)
        w = b.weight("w", RNG.normal(size=(2, 2, 1, 1)).astype(np.float32), scale=[0.01, 0.02], axis=axis)
        b.output(b.node("Conv", [x, w], name="conv"), [1, 2, 4, 4])
        assert (trt_placement.violations(b.model()) == []) == clean, axis


def test_trt_maxpool_fan_out_shares_the_q_after_the_pool():
    """SPP: x feeds a conv and a MaxPool, each through a Q of its own; the pool's Qs agree with each
    other, and must agree with the conv's too."""
    for pooled_scale, clean in ((0.1, True), (0.2, False)):
        b = GraphBuilder()
        x = b.input("x", [1, 2, 4, 4])
        a = conv(b, b.qdq(x, 0.1), "conv")
        pooled = b.node("MaxPool", [b.qdq(x, pooled_scale)], name="pool", kernel_shape=[1, 1])
        b.node("Concat", [a, b.qdq(pooled, pooled_scale)], ["y"], name="cat", axis=1)
        b.output("y", [1, 4, 4, 4])
        found = [v for v in trt_placement.violations(b.model()) if "MaxPool's input" in v]
        assert (found == []) == clean, found


# --- ort ---------------------------------------------------------------------------------------------


def ort_unit(zero_point=128, dtype=np.uint8, shape=(), relu_zero_point=0, head_float=False):
    """x → Q/DQ → Conv → Relu → Q/DQ → Add(·, x's DQ) → Q/DQ → y, with 0-d parameters unless `shape`."""
    b = GraphBuilder()
    x = b.input("x", [1, 2, 4, 4])
    scale = np.full(shape, 0.05, np.float32)
    xq = b.node("QuantizeLinear", [x, b.init("xs", scale), b.init("xz", np.full(shape, zero_point, dtype))], name="xq")
    xd = b.node("DequantizeLinear", [xq, "xs", "xz"], name="xdq")
    h = b.node("Relu", [conv(b, xd, "conv")], name="relu")
    h = b.qdq(h, 0.05, relu_zero_point, np.uint8, name="h")
    total = b.node("Add", [h, xd], name="add")
    out = total if head_float else b.qdq(total, 0.1, 128, np.uint8, name="sum")
    b.node("Identity", [out], ["y"])
    b.output("y", [1, 2, 4, 4])
    return b.model()


def test_ort_clean_units():
    assert ort_node_units.check(ort_unit()) == []


def test_ort_each_broken_condition():
    assert ort_node_units.tags(ort_node_units.check(ort_unit(shape=(1,)))) == {"scalar"}
    assert ort_node_units.tags(ort_node_units.check(ort_unit(relu_zero_point=128))) == {"unit-output"}
    assert ort_node_units.tags(ort_node_units.check(ort_unit(head_float=True))) == {"unit-output"}
    # int8 activations whose Q has two readers stay int8 on x86: no QLinearConv, no QLinearAdd.
    found = ort_node_units.check(ort_unit(zero_point=0, dtype=np.int8))
    assert ort_node_units.tags(found) == {"unit-type"} and len(found) == 2, found


def test_ort_int32_bias_at_input_times_weight_scale():
    """onnxruntime keeps a Conv float when its int32 bias is off the accumulator's scale (measured)."""
    for bias_scale, clean in ((0.05 * 2**-6, True), (0.05 * 2**-5, False)):
        b = GraphBuilder()
        x = b.qdq(b.input("x", [1, 2, 4, 4]), 0.05, 128, np.uint8)
        w = b.weight("w", RNG.normal(size=(2, 2, 1, 1)).astype(np.float32), scale=2**-6)
        bias = b.dq(b.init("b_int", np.arange(2, dtype=np.int32)), bias_scale, dtype=np.int32, name="b")
        b.node("Identity", [b.qdq(b.node("Conv", [x, w, bias], name="conv"), 0.1, 128, np.uint8)], ["y"])
        b.output("y", [1, 2, 4, 4])
        found = ort_node_units.check(b.model())
        assert (found == []) == clean and (clean or ort_node_units.tags(found) == {"bias-scale"}), found
