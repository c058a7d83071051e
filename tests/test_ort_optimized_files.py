"""Files onnxruntime's optimizer writes (`SessionOptions.optimized_model_filepath`), fixed as users fix them.

Users save onnxruntime's optimized graph to see what it runs, then hand that file on. On a float16
model (ModelOpt's int8 default) onnxruntime's CPU provider has no float16 Conv, so at the basic level
it inserts `InsertedPrecisionFreeCast` nodes: the weights' DequantizeLinear stays float16, and the
input's DQ reads its float16 scale through a Cast to float32, while its Q still reads it as float16.
A fix that gave Q and DQ one new scale constant typed like the Q's made the DQ write float16 into a
float32 Conv; the ONNX checker refused the result ("W has inconsistent type") and nothing was written.

The optimized files are made here by onnxruntime from corpus files; the checks read the written
model with onnx and onnxruntime, not with qdq.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from cli_run import qdq

CORPUS = Path(__file__).parent / "corpus"
FLOAT16 = onnx.TensorProto.FLOAT16


def optimized(source: Path, level: ort.GraphOptimizationLevel, out: Path) -> Path:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return out


def scale_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each Q/DQ's scale element type, through a Cast on the way (as the node reads it)."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Cast":
            types[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    return {n.name: types[n.input[1]] for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in types}


@pytest.mark.parametrize("level", [ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED], ids=["basic", "extended"])
@pytest.mark.parametrize("target", ["npu", "trt"])
def test_each_node_keeps_the_scale_type_it_reads(tmp_path, level, target):
    source = optimized(CORPUS / "modelopt" / "resnet_int8.onnx", level, tmp_path / "optimized.onnx")
    before = scale_types(onnx.load(str(source)))
    assert FLOAT16 in before.values() and onnx.TensorProto.FLOAT in before.values(), "no mixed scale types"
    out = tmp_path / "fixed.onnx"
    run = qdq("fix", source, "--target", target, "-o", out)
    assert run.code in (0, 1), run.err
    assert out.exists(), run.out + run.err
    onnx.checker.check_model(str(out), full_check=True)
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    after = scale_types(onnx.load(str(out)))
    assert {name: after[name] for name in before if name in after} == {name: before[name] for name in before
                                                                       if name in after}
