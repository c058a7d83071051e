"""Files onnxruntime's optimizer writes (`SessionOptions.optimized_model_filepath`), fixed as users fix them.

Users save onnxruntime's optimized graph to see what it runs, then hand that file on. On a float16
model (ModelOpt's int8 default) onnxruntime's CPU provider has no float16 Conv, so at the basic level
it inserts `InsertedPrecisionFreeCast` nodes: the weights' DequantizeLinear stays float16, and the
input's DQ reads its float16 scale through a Cast to float32, while its Q still reads it as float16.
A fix that gave Q and DQ one new scale constant typed like the Q's made the DQ write float16 into a
float32 Conv; the ONNX checker refused the result ("W has inconsistent type") and nothing was written.

The optimized files are in the corpus (`tests/corpus/ort_optimized/`, made by onnxruntime from
other corpus files); the checks read the written model with onnx and onnxruntime, not with qdq.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from cli_run import qdq

OPTIMIZED = Path(__file__).parent / "corpus" / "ort_optimized"
FLOAT16 = onnx.TensorProto.FLOAT16


def scale_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each Q/DQ's scale element type, through a Cast on the way (as the node reads it)."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Cast":
            types[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    return {n.name: types[n.input[1]] for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in types}


@pytest.mark.parametrize("level", ["basic", "extended"])
@pytest.mark.parametrize("target", ["npu", "trt"])
def test_each_node_keeps_the_scale_type_it_reads(tmp_path, level, target):
    source = OPTIMIZED / f"modelopt-resnet_int8_{level}.onnx"
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


def test_an_unset_output_dtype_stays_unset(tmp_path):
    """onnxruntime writes every attribute out, QuantizeLinear's `output_dtype = 0` (the zero-point
    gives the type) among them. The NPU fix turns these uint16 activations into int8; writing
    `output_dtype = INT8` as well made onnxruntime refuse the file with its optimisations on (its
    int8 → uint8 rewrite changes the zero-point, not the attribute: "output_dtype INT8 does not match
    y_zero_point type UINT8"), though the file is valid ONNX."""
    source = OPTIMIZED / "ort-mobilenetv2_u16_activations_basic.onnx"

    def output_dtypes(path: Path) -> dict[str, int]:
        return {n.name: a.i for n in onnx.load(str(path)).graph.node if n.op_type == "QuantizeLinear"
                for a in n.attribute if a.name == "output_dtype"}

    assert set(output_dtypes(source).values()) == {0}
    out = tmp_path / "fixed.onnx"
    # int8 for uint16 moves the outputs past the verdict; the attribute is what is checked here
    run = qdq("fix", source, "--target", "npu", "-o", out, "--keep-failed")
    assert run.code in (0, 1), run.err
    assert set(output_dtypes(out).values()) == {0}
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # every optimisation on
