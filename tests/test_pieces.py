"""Running a model in pieces, and running only what a fix changed, give a whole run's values bit for bit.

The verdict trusts both (`qdq.verification.pieces`, `qdq.verification.change`): a slice boundary or a region boundary that
lost, retyped or reordered a value would change the numbers it judges. So each is checked against
one whole-model onnxruntime session, on random QDQ graphs and on a model with external weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import GraphBuilder
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from random_graphs import qdq_models

from qdq.verification.change import changed_region
from qdq.verification.pieces import Pieces, joined


def whole_run(model: onnx.ModelProto | Path, feeds: dict) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def samples(model: onnx.ModelProto, count: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [{model.graph.input[0].name: rng.uniform(-2, 2, shape).astype(np.float32)} for _ in range(count)]


def assert_identical(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and np.array_equal(got[name], expected[name]), name


@settings(max_examples=12, deadline=None)
@given(qdq_models(max_ops=8), st.integers(1, 4))
def test_slices_of_any_size_give_the_whole_run(model, max_nodes):
    feeds = samples(model)
    pieces = Pieces(model, Path("."), max_nodes=max_nodes)
    # A weight's DQ stays with its reader (a Conv reads two: weight and bias), so no slice reads a dequantized weight.
    assert pieces.count >= -(-len(model.graph.node) // max(max_nodes, 3))
    weights = {t.name for t in model.graph.initializer}
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights}
    assert not any(name in dequantized for piece in pieces._slices for name in piece.reads)
    names = pieces.outputs
    got = joined(pieces.run(feeds, names, "the model"), names)
    expected = [whole_run(model, f) for f in feeds]
    assert_identical(got, {n: np.concatenate([np.atleast_1d(e[n]) for e in expected]) for n in names})


@settings(max_examples=12, deadline=None)
@given(qdq_models(max_ops=8), st.data())
def test_the_changed_region_on_the_inputs_values_gives_the_whole_changed_model(model, data):
    """Change one scale (an activation's or a weight's), as a fix does: the fixed model's outputs computed from
    its changed region and the input model's boundary values are a whole run's, bit for bit."""
    scales = sorted({n.input[1] for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")})
    chosen = data.draw(st.sampled_from(scales))
    target = next(t for t in model.graph.initializer if t.name == chosen)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    tensor = next(t for t in fixed.graph.initializer if t.name == target.name)
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * np.float32(2), tensor.name))
    region = changed_region(model, Path("."), fixed, Path("."))
    readers = [n for n in model.graph.node if target.name in n.input]
    assert readers and 1 <= region.nodes <= len(fixed.graph.node)

    feeds = samples(model, 1)[0]
    reference = Pieces(model, Path("."), keep=region.boundary, max_nodes=3).run([feeds], [*region.boundary,
                                                                                          *region.unchanged_outputs], "in")
    got = {name: reference[0][name] for name in region.unchanged_outputs}
    if region.model.graph.output:
        part = Pieces(region.model, Path("."), max_nodes=2)
        given_values = {**feeds, **{name: reference[0][name] for name in region.boundary}}
        got.update(part.run([given_values], part.outputs, "region")[0])
    assert_identical(got, whole_run(fixed, feeds))


def chain(builder: GraphBuilder, length: int, last_scale: float) -> str:
    x = builder.input("x", [1, 4])
    current = builder.qdq(x, 0.05)
    for i in range(length):
        w = builder.weight(f"w{i}", np.eye(4, dtype=np.float32) * (1 + i / 10), 0.01)
        current = builder.qdq(builder.node("MatMul", [current, w]), last_scale if i == length - 1 else 0.05)
    builder.output(builder.node("Identity", [current], ["y"]), [1, 4])
    return current


def test_a_change_at_the_end_runs_only_the_end():
    before, after = GraphBuilder(), GraphBuilder()
    chain(before, 20, 0.05)
    chain(after, 20, 0.1)
    region = changed_region(before.model(), Path("."), after.model(), Path("."))
    assert region.of == len(after.model().graph.node)
    assert region.nodes == 3  # the last Q, its DQ (both read the changed scale) and the Identity after them
    assert len(region.boundary) == 1 and region.unchanged_outputs == []


def test_an_unchanged_model_has_no_region():
    model = GraphBuilder()
    chain(model, 3, 0.05)
    region = changed_region(model.model(), Path("."), model.model(), Path("."))
    assert region.nodes == 0 and region.unchanged_outputs == ["y"] and not region.model.graph.output


def external_model(folder: Path, scale: float = 0.05) -> Path:
    folder.mkdir()
    builder = GraphBuilder()
    chain(builder, 4, scale)
    model = builder.model()
    onnx.save(model, folder / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    return folder / "m.onnx"


def test_external_weights_are_read_per_slice_and_compared_on_disk(tmp_path):
    path = external_model(tmp_path / "a")
    model = onnx.load(str(path), load_external_data=False)
    feeds = samples(model, 1)
    pieces = Pieces(model, path.parent, max_nodes=2, max_bytes=1)  # a slice per unit: each reads its own weights
    matmuls = sum(n.op_type == "MatMul" for n in model.graph.node)
    assert pieces.count == len(model.graph.node) - matmuls  # each weight's DQ runs in its MatMul's slice
    assert_identical(pieces.run(feeds, ["y"], "the model")[0], whole_run(path, feeds[0]))

    copy = external_model(tmp_path / "b")  # the same bytes in another folder's data file: unchanged
    region = changed_region(model, path.parent, onnx.load(str(copy), load_external_data=False), copy.parent)
    assert region.nodes == 0
    changed = external_model(tmp_path / "c", scale=0.1)
    region = changed_region(model, path.parent, onnx.load(str(changed), load_external_data=False), changed.parent)
    assert region.nodes == 3


def test_a_graph_whose_nodes_are_out_of_order_runs_in_order():
    builder = GraphBuilder()
    chain(builder, 3, 0.05)
    model = builder.model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    feeds = samples(model, 1)
    assert_identical(Pieces(model, Path("."), max_nodes=2).run(feeds, ["y"], "m")[0], whole_run(model, feeds[0]))


@pytest.mark.parametrize("optimized", [True, False])
def test_an_optimised_run_is_never_cut(optimized):
    builder = GraphBuilder()
    chain(builder, 6, 0.05)
    assert (Pieces(builder.model(), Path("."), optimized=optimized, max_nodes=2).count == 1) == optimized
