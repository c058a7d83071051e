"""`trt` is TensorRT 10 (INT8, FP8, INT4 weight-only); `trt8` is TensorRT 8 (INT8 only, ConvTranspose
weights per channel along axis 0). A TensorRT version is a rules-file edit: `rules/trt8.toml`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builders import GraphBuilder
from conftest import findings_of

from qdq.graph.model import load_model

MODELOPT = Path(__file__).parent / "corpus" / "modelopt"


@pytest.mark.parametrize(("model", "dtype"), [("transformer_fp8", "float8e4m3fn"), ("transformer_int4_rtn_dq", "int4")])
def test_tensorrt_10_builds_fp8_and_int4_weight_only_that_tensorrt_8_does_not(model, dtype):
    """ModelOpt 0.47's FP8 and INT4 (RTN) exports: no format error for TensorRT 10, errors for 8."""
    loaded = load_model(MODELOPT / f"{model}.onnx")
    assert findings_of(loaded, "QDQ501", target="trt") == []
    old = findings_of(loaded, "QDQ501", target="trt8")
    assert old and {f.values["dtype"] for f in old} == {dtype}
    assert all(f.values["allowed"] == "int8" and str(f.severity) == "error" for f in old)


def conv_transpose(axis: int, scales: int):
    """x → ConvTranspose(W [Cin 4, Cout 6, 3, 3]) with `scales` per-channel weight scales along `axis`."""
    b = GraphBuilder(opset=17)
    x = b.qdq(b.input("x", [1, 4, 5, 5]), name="x")
    weight = b.init("w", np.ones((4, 6, 3, 3), dtype=np.int8))
    params = [b.init("ws", np.full(scales, 0.01, dtype=np.float32)), b.init("wz", np.zeros(scales, dtype=np.int8))]
    w = b.node("DequantizeLinear", [weight, *params], ["w_dq"], name="w_dq", axis=axis)
    b.output(b.node("ConvTranspose", [x, w], ["y"], name="deconv"), [1, 6, 7, 7])
    return b


@pytest.mark.parametrize(("axis", "scales", "reported_by"), [(1, 6, "trt8"), (0, 4, "trt")])
def test_conv_transpose_weight_axis_follows_the_version(tmp_path, axis, scales, reported_by):
    model = load_model(conv_transpose(axis, scales).save(tmp_path / "m.onnx"))
    for target in ("trt", "trt8"):
        found = findings_of(model, "QDQ506", target=target)
        assert bool(found) == (target == reported_by), target
        if found:
            assert found[0].values["expected"] == 1 - axis
