"""QDQ003 on blocked quantization (`block_size`): the scale's shape must follow the input, axis and block size.

The ONNX checker accepts a wrongly shaped blocked scale; onnxruntime fails only when the model
runs. The corpus test holds the rule to onnxruntime itself: on every corpus file with a blocked
Q/DQ, QDQ003 reports a blocked scale exactly where onnxruntime refuses to run the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import GraphBuilder
from conftest import findings_of

from qdq.graph.model import load_model

CORPUS = Path(__file__).parent / "corpus"


def _blocked(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(a.name == "block_size" and a.i > 0 for n in model.graph.node for a in n.attribute)


BLOCKED = [p for p in sorted(CORPUS.rglob("*.onnx")) if _blocked(p)]


def _onnxruntime_refuses_the_blocks(path: Path) -> bool:
    """Run the model on zeros; True when onnxruntime stops on a blocked scale's shape."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
        feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], dtype=dtypes[i.type])
                 for i in session.get_inputs()}
        session.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own exception types
        return "block_size" in str(exc)
    return False


def test_the_corpus_has_blocked_models_both_ways():
    assert len(BLOCKED) >= 5
    assert any(_onnxruntime_refuses_the_blocks(p) for p in BLOCKED)


@pytest.mark.parametrize("path", BLOCKED, ids=lambda p: str(p.relative_to(CORPUS)))
def test_qdq003_reports_a_blocked_scale_where_onnxruntime_refuses_it(path):
    reported = [f for f in findings_of(load_model(path), "QDQ003") if "blocked scale" in f.message]
    assert bool(reported) == _onnxruntime_refuses_the_blocks(path)


@pytest.mark.parametrize(("axis", "scale_shape", "ok"), [
    (0, (1, 64), True),     # ceil(10 / 32) = 1 on axis 0, 64 elsewhere
    (1, (10, 2), True),     # ceil(64 / 32) = 2 on axis 1
    (0, (10, 2), False),    # laid out for axis 1 but says axis 0 (ModelOpt's transposed Gemm weight)
    (1, (10, 3), False),
])
def test_blocked_scale_shapes(tmp_path, axis, scale_shape, ok):
    b = GraphBuilder(opset=21)
    weight = b.init("w", np.zeros((10, 64), dtype=np.int8))
    scale = b.init("s", np.full(scale_shape, 0.01, dtype=np.float32))
    w = b.node("DequantizeLinear", [weight, scale], ["w_dq"], name="dq", axis=axis, block_size=32)
    b.output(b.node("MatMul", [b.input("x", [2, 10]), w], ["y"], name="mm"), [2, 64])
    found = findings_of(load_model(b.save(tmp_path / "m.onnx")), "QDQ003")
    assert (found == []) == ok
    if not ok:
        (finding,) = found
        assert finding.node == "dq" and "block_size 32" in finding.message
