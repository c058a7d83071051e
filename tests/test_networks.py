"""The realistic test networks of examples/networks.py and the placements their quantized exports have.

Each network is trained for a few batches on generated glyphs (no scikit-learn needed): enough
for BatchNorm statistics and non-trivial weights, not for accuracy (see `python
examples/networks.py OUT_DIR` for that). Checked per network:

- the float export (dynamic batch) computes what torch computes;
- trt-style: Q/DQ only where a Conv/Gemm reads a tensor; per-channel symmetric int8 weights on
  axis 0; zero-point 0 everywhere; float bias; Add, Concat, MaxPool and Resize read float tensors;
- ort-default: uint8 activations with asymmetric zero-points; in the YOLO net, Concats whose
  inputs carry different scales (what the Concat-scale rules are about);
- FX QAT: loads in onnxruntime, keeps the unfolded Conv → Div → BatchNormalization, lints clean
  of validity errors with the common rule set.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from optional import torch_or_skip
from onnx import numpy_helper

torch = torch_or_skip()

from conftest import run_ort  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import networks  # noqa: E402

from qdq.engine.lint import lint  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.graph.model import load_model  # noqa: E402
from qdq.rewrite.rule import Severity  # noqa: E402

NAMES = list(networks.NETWORKS)


@pytest.fixture(scope="module", params=NAMES)
def net(request, tmp_path_factory):
    """(name, data, trained float model, folder with its float/trt_style/ort_default/fx_qat exports)."""
    name = request.param
    data = networks.glyphs(networks.INPUT_CHANNELS[name], count=320)
    torch.manual_seed(0)
    model = networks.train(networks.NETWORKS[name](networks.INPUT_CHANNELS[name]), data, max_steps=4)
    folder = tmp_path_factory.mktemp(name)
    float_path = networks.export_float(model, folder / "float.onnx")
    networks.quantize_trt_style(float_path, folder / "trt_style.onnx", networks.calibration_batches(data, 32))
    networks.quantize_ort_default(float_path, folder / "ort_default.onnx", networks.calibration_batches(data, 32))
    networks.fx_qat_export(model, data, folder / "fx_qat.onnx", steps=2)
    return name, data, model, folder


def graph_of(path: Path):
    """(graph, producer of each tensor, initializers by name)."""
    graph = onnx.load(str(path)).graph
    return graph, {out: n for n in graph.node for out in n.output}, {t.name: t for t in graph.initializer}


def qparams(node, inits) -> tuple[np.ndarray, np.ndarray]:
    return numpy_helper.to_array(inits[node.input[1]]), numpy_helper.to_array(inits[node.input[2]])


def test_float_export_matches_torch(net):
    name, data, model, folder = net
    x = data[2][:4]
    with torch.no_grad():
        expected = model(x).numpy()
    (actual,) = run_ort(folder / "float.onnx", {"input": x.numpy()})  # batch 4 through the "batch" axis
    assert actual.shape == (4, networks.NUM_CLASSES)
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)


def test_trt_style_quantizes_only_weighted_op_inputs(net):
    name, data, model, folder = net
    graph, producer, inits = graph_of(folder / "trt_style.onnx")
    from_dq = [(n, i) for n in graph.node for i in n.input if i in producer and producer[i].op_type == "DequantizeLinear"]
    readers = Counter(n.op_type for n, _ in from_dq)
    weighted = sum(n.op_type in ("Conv", "Gemm") for n in graph.node)
    assert set(readers) == ({"Conv"} if name == "yolo" else {"Conv", "Gemm"})
    assert sum(readers.values()) == 2 * weighted  # data and weight of each, no bias
    assert all(len(n.input) < 3 or n.input[2] in inits for n in graph.node if n.op_type == "Conv")  # float bias
    for node in graph.node:
        if node.op_type == "QuantizeLinear":
            scale, zero_point = qparams(node, inits)
            assert zero_point.dtype == np.int8 and not zero_point.any()
            if node.input[0] in inits:  # float weight → Q → DQ, one scale per output channel
                assert scale.shape == (numpy_helper.to_array(inits[node.input[0]]).shape[0],)
                assert next(a.i for a in node.attribute if a.name == "axis") == 0
            else:
                assert scale.shape == ()
    assert producer["logits"].op_type != "DequantizeLinear"  # no output Q/DQ


def test_trt_style_leaves_adds_and_concats_float(net):
    name, data, model, folder = net
    graph, producer, inits = graph_of(folder / "trt_style.onnx")
    adds = [n for n in graph.node if n.op_type == "Add"]
    assert len(adds) == 3  # the residual Adds of every network
    data_movement = [n for n in graph.node if n.op_type in ("Add", "Concat", "MaxPool", "Resize")]
    assert all(producer[i].op_type != "DequantizeLinear" for n in data_movement for i in n.input if i in producer)
    if name == "resnet":  # the conv branch of each residual Add comes straight from its (BN-folded) Conv
        assert all(producer[a.input[0]].op_type == "Conv" for a in adds)
    if name == "yolo":
        assert Counter(n.op_type for n in data_movement) == {"Concat": 6, "Add": 3, "MaxPool": 3, "Resize": 1}


def test_trt_style_runs_close_to_float(net):
    name, data, model, folder = net
    feeds = {"input": data[2][:8].numpy()}
    (reference,) = run_ort(folder / "float.onnx", feeds)
    (quantized,) = run_ort(folder / "trt_style.onnx", feeds)
    assert np.abs(quantized - reference).max() < 0.1 * np.abs(reference).max()


def test_ort_default_is_asymmetric_uint8_everywhere(net):
    name, data, model, folder = net
    graph, producer, inits = graph_of(folder / "ort_default.onnx")
    activation_qs = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    zero_points = [qparams(n, inits)[1] for n in activation_qs]
    assert all(z.dtype == np.uint8 for z in zero_points)
    assert any(z != 0 and z != 128 for z in zero_points)  # asymmetric ranges
    readers = {n.op_type for n in graph.node for i in n.input if i in producer and producer[i].op_type == "DequantizeLinear"}
    assert "Add" in readers


def test_ort_default_gives_concat_inputs_their_own_scales(net):
    name, data, model, folder = net
    graph, producer, inits = graph_of(folder / "ort_default.onnx")
    concats = [n for n in graph.node if n.op_type == "Concat"]
    assert len(concats) == (6 if name == "yolo" else 0)
    assert all(producer[i].op_type == "DequantizeLinear" for n in concats for i in n.input)
    distinct_scales = [len({float(qparams(producer[i], inits)[0]) for i in n.input}) for n in concats]
    assert sum(count >= 2 for count in distinct_scales) >= (3 if name == "yolo" else 0)


def test_fx_qat_export_runs_and_lints(net):
    name, data, model, folder = net
    path = folder / "fx_qat.onnx"
    graph, producer, inits = graph_of(path)
    convs = sum(n.op_type == "Conv" for n in graph.node)
    batch_norms = sum(n.op_type == "BatchNormalization" for n in graph.node)
    assert batch_norms == convs - (1 if name == "yolo" else 0)  # every QAT ConvBn unfolded; YOLO's head has no BN
    (logits,) = run_ort(path, {"input": data[2][:1].numpy()})
    assert logits.shape == (1, networks.NUM_CLASSES) and np.isfinite(logits).all()
    result = lint(load_model(path), load_target("common"))
    assert result.rules_run and not result.failing(Severity.ERROR)
    assert "QDQ201" in {f.code for f in result.findings}  # the TorchScript exporter's [1]-shaped qparams


def test_accuracy_runs_torch_and_onnx_alike(net):
    name, data, model, folder = net
    assert networks.accuracy(folder / "float.onnx", data) == pytest.approx(networks.accuracy(model, data))
    assert 0.0 <= networks.accuracy(folder / "fx_qat.onnx", data) <= 1.0  # batch-1 file: one row at a time


def test_glyphs_are_deterministic_and_normalized():
    first, second = networks.glyphs(3, count=200, seed=1), networks.glyphs(3, count=200, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    train_x, train_y, test_x, test_y = first
    assert train_x.shape == (160, 3, 32, 32) and test_x.shape == (40, 3, 32, 32)
    assert abs(float(train_x.mean())) < 1e-4 and abs(float(train_x.std()) - 1) < 1e-3
    assert set(train_y.tolist()) == set(range(10))


def test_digits_without_sklearn_names_the_missing_package():
    if networks.has_sklearn():
        assert networks.digits(1)[0].shape[1:] == (1, 32, 32)
    else:
        with pytest.raises(ModuleNotFoundError, match="scikit-learn"):
            networks.digits(1)
