"""`qdq fix --target npu` end to end, through `cli.main` (the console script's entry point).

The models are the NPU test CNN of examples/cnn.py: (a) onnxruntime `quantize_static` (float
scales), (b) the FX power-of-two QAT export, and (c) hand-edited copies of (a)-after-fix or (b),
each breaking one rule of the NPU catalogue. Every fixed model is checked three ways: `qdq lint
--target npu` exits 0, the independent checker in `npu_constraints.py` (onnx + numpy, none of
qdq's rule code) finds nothing, and onnxruntime's outputs stay close to the input's.

Models are built once per module; each `qdq fix` run is cached, so the file runs in seconds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from optional import torch_or_skip
from onnx import TensorProto, helper, numpy_helper

torch = torch_or_skip()

import npu_constraints  # noqa: E402
from conftest import run_ort  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import cnn  # noqa: E402

from cli_run import Run, qdq  # noqa: E402
from qdq.engine.registry import all_rules  # noqa: E402
from qdq.rewrite.rule import FixSafety  # noqa: E402

# Relative L2 error of the logits over the 8 calibration inputs. Measured (x86-64, onnxruntime
# CPU, optimisations off): (a) fixed vs input 1.1 %, fixed vs float 1.0 %, input vs float 0.4 %;
# (b) fixed vs input 0.5 %, fixed vs float 1.1 %, input vs float 1.1 %. The limits leave 4x margin.
MAX_FIXED_VS_INPUT = 0.05
MAX_FIXED_VS_FLOAT = 0.05


# --- running the command line ------------------------------------------------------------------------


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def lint(path: Path) -> tuple[int, dict]:
    run = qdq("lint", path, "--target", "npu", "--format", "json", "--isolated")
    return run.code, run.json()


def lint_codes(path: Path) -> set[str]:
    return {f["code"] for f in lint(path)[1]["findings"] if f["severity"] != "info"}


# --- numerics ---------------------------------------------------------------------------------------


def logits(path: Path, inputs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([run_ort(path, {"input": x})[0] for x in inputs])


def rel_l2(candidate: np.ndarray, reference: np.ndarray) -> float:
    return float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference))


# --- reading and editing ONNX protobufs ----------------------------------------------------------------


def producer_map(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: n for n in graph.node for out in n.output if out}


def consumers_of(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [n for n in graph.node if name in n.input]


def node_named(graph: onnx.GraphProto, op: str, suffix: str) -> onnx.NodeProto:
    found = [n for n in graph.node if n.op_type == op and n.name.endswith(suffix)]
    assert len(found) == 1, (op, suffix, [n.name for n in graph.node if n.op_type == op])
    return found[0]


def only_node(graph: onnx.GraphProto, op: str) -> onnx.NodeProto:
    found = [n for n in graph.node if n.op_type == op]
    assert len(found) == 1, (op, len(found))
    return found[0]


def constant(graph: onnx.GraphProto, name: str) -> np.ndarray:
    """An initializer's value, through Identity chains (the FX export reads qparams through Identity)."""
    inits = {t.name: t for t in graph.initializer}
    producers = producer_map(graph)
    while name not in inits:
        name = producers[name].input[0]
        assert name, "not a constant"
    return numpy_helper.to_array(inits[name])


def group_of_input(graph: onnx.GraphProto, node: onnx.NodeProto, i: int) -> list[onnx.NodeProto]:
    """The Q (if any) and every DQ of the value input `i` of `node` is dequantized from."""
    producers = producer_map(graph)
    dq = producers[node.input[i]]
    assert dq.op_type == "DequantizeLinear", dq.op_type
    integer = dq.input[0]
    q = producers.get(integer)
    dqs = [n for n in consumers_of(graph, integer) if n.op_type == "DequantizeLinear"]
    return ([q] if q is not None and q.op_type == "QuantizeLinear" else []) + dqs


def group_of_output(graph: onnx.GraphProto, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The Q reading `node`'s output and every DQ of that Q."""
    qs = [n for n in consumers_of(graph, node.output[0]) if n.op_type == "QuantizeLinear"]
    assert len(qs) == 1, node.name
    return qs + [n for n in consumers_of(graph, qs[0].output[0]) if n.op_type == "DequantizeLinear"]


_names = iter(range(10**6))


def add_initializer(graph: onnx.GraphProto, base: str, array: np.ndarray, storage: str = "raw") -> str:
    """A new initializer; `storage` "raw" (raw_data, as numpy_helper writes) or "typed" (float_data/int32_data)."""
    name = f"{base}_edit{next(_names)}"
    array = np.asarray(array)
    if storage == "raw":
        tensor = numpy_helper.from_array(array, name)
    else:
        elem = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor = helper.make_tensor(name, elem, array.shape, array.ravel().tolist(), raw=False)
    graph.initializer.append(tensor)
    return name


def set_scale(graph: onnx.GraphProto, group: list[onnx.NodeProto], scale, storage: str = "raw") -> None:
    """Point every Q/DQ of a value at one new scale initializer (float32)."""
    name = add_initializer(graph, "scale", np.asarray(scale, dtype=np.float32), storage)
    for node in group:
        node.input[1] = name


def set_zero_point(graph: onnx.GraphProto, group: list[onnx.NodeProto], zero_point: np.ndarray) -> None:
    name = add_initializer(graph, "zero_point", zero_point)
    for node in group:
        node.input[2] = name


def stored_integers(graph: onnx.GraphProto, group: list[onnx.NodeProto]) -> tuple[str, np.ndarray]:
    dq = group[-1]
    return dq.input[0], constant(graph, dq.input[0])


def set_stored(graph: onnx.GraphProto, group: list[onnx.NodeProto], values: np.ndarray) -> None:
    name = add_initializer(graph, "q", values)
    for node in group:
        assert node.op_type == "DequantizeLinear"
        node.input[0] = name


def qparams(graph: onnx.GraphProto, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray, int]:
    """(scale, zero-point, axis) of a Q/DQ."""
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    return constant(graph, node.input[1]), constant(graph, node.input[2]), axis


def dequantized(graph: onnx.GraphProto, op_node_name: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(effective float values, scale) of the stored integers input `i` of a node reads."""
    node = next(n for n in graph.node if n.name == op_node_name)
    dq = producer_map(graph)[node.input[i]]
    assert dq.op_type == "DequantizeLinear"
    q = constant(graph, dq.input[0]).astype(np.float64)
    scale, zp, axis = qparams(graph, dq)
    scale, zp = scale.astype(np.float64), zp.astype(np.float64)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q - zp) * scale, scale


def pos(scale: np.ndarray) -> int:
    value = float(np.asarray(scale, dtype=np.float64).ravel()[0])
    assert np.frexp(value)[0] == 0.5, value
    return int(round(-np.log2(value)))


def graph_signature(path: Path) -> tuple[list, dict]:
    """Nodes (op, name, inputs, outputs, attributes) and initializers (dtype, shape, bytes) of a model."""
    graph = onnx.load(str(path)).graph
    nodes = [(n.op_type, n.name, list(n.input), list(n.output), [a.SerializeToString() for a in n.attribute])
             for n in graph.node]
    inits = {}
    for t in graph.initializer:
        array = numpy_helper.to_array(t)
        inits[t.name] = (str(array.dtype), array.shape, array.tobytes())
    return nodes, inits


# --- the models, built once -------------------------------------------------------------------------------


@dataclass
class Fixed:
    """One `qdq fix` run: input, output, the --report JSON, stdout, timings and the input's hashes."""

    source: Path
    out: Path
    run: Run
    report: dict
    hash_before: str
    hash_after: str


@dataclass
class Models:
    folder: Path
    float: Path
    ort: Path
    fx: Path
    calib_npz: Path
    calibration: list[np.ndarray]
    build_seconds: float
    fixes: dict[str, Fixed] = field(default_factory=dict)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    folder = tmp_path_factory.mktemp("npu_fix")
    start = time.perf_counter()
    calibration = cnn.calibration_data()
    float_path = cnn.export_float(folder / "float.onnx")
    ort = cnn.quantize_ort(float_path, folder / "ort_qdq.onnx", calibration)
    fx = cnn.export_fx_pow2_qat(folder / "fx_pow2_qat.onnx")
    calib_npz = folder / "calib.npz"
    np.savez(calib_npz, input=calibration[0])  # batch 1: the models' input is 1x3x32x32
    return Models(folder, float_path, ort, fx, calib_npz, calibration, time.perf_counter() - start)


def fix_once(models: Models, key: str, source: Path, *options: object) -> Fixed:
    """`qdq fix SOURCE --target npu -o OUT --inputs calib.npz --report R.json`, once per key."""
    if key not in models.fixes:
        out = models.folder / f"{key}.fixed.onnx"
        report = models.folder / f"{key}.report.json"
        before = sha(source)
        run = qdq("fix", source, "--target", "npu", "-o", out, "--inputs", models.calib_npz,
                  "--report", report, "--isolated", *options)
        loaded = json.loads(report.read_text()) if report.exists() else {}
        models.fixes[key] = Fixed(source, out, run, loaded, before, sha(source))
    return models.fixes[key]


def source_of(models: Models, kind: str) -> Path:
    return {"ort": models.ort, "fx": models.fx}[kind]


KINDS = ["ort", "fx"]


# --- the independent checker, on tiny graphs ----------------------------------------------------------------


def _tiny_qdq_model(scales: dict[str, float], zero_point: int = 0) -> onnx.ModelProto:
    """x, y → Q/DQ → Concat → Q/DQ → MaxPool → Q/DQ, and x' + y' → Add → Q/DQ; scales by tensor name."""
    nodes, inits = [], []

    def qdq_pair(name: str) -> str:
        inits.append(numpy_helper.from_array(np.array(scales[name], dtype=np.float32), f"{name}_s"))
        inits.append(numpy_helper.from_array(np.array(zero_point if name == "x" else 0, dtype=np.int8), f"{name}_z"))
        nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"],
                                      name=f"{name}_Q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                                      name=f"{name}_DQ"))
        return f"{name}_dq"

    x, y = qdq_pair("x"), qdq_pair("y")
    nodes.append(helper.make_node("Concat", [x, y], ["cat"], axis=1, name="cat"))
    c = qdq_pair("cat")
    nodes.append(helper.make_node("MaxPool", [c], ["pool"], kernel_shape=[1, 1], name="pool"))
    qdq_pair("pool")
    nodes.append(helper.make_node("Add", [x, y], ["sum"], name="add"))
    qdq_pair("sum")
    shape = [1, 2, 4, 4]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("pool_dq", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("sum_dq", TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def test_checker_passes_a_clean_tiny_graph():
    clean = {"x": 2**-4, "y": 2**-4, "cat": 2**-4, "pool": 2**-4, "sum": 2**-3}
    assert npu_constraints.check(_tiny_qdq_model(clean)) == []


def test_checker_reports_each_broken_rule_of_a_tiny_graph():
    broken = {"x": 2**-4, "y": 2**-12, "cat": 2**-4, "pool": 0.0123, "sum": 2**-3}
    found = npu_constraints.check(_tiny_qdq_model(broken, zero_point=-3))
    assert npu_constraints.tags(found) == {"concat", "shift-read", "pow2", "zero-point"}, found
    assert any("cat" in v and "[4, 12]" in v for v in found), found  # the positions are named
    assert any("gap 8" in v for v in found), found


def test_checker_reads_shift_cut_bias_and_hard_sigmoid():
    """A Conv whose shift_cut and int32 bias are wrong, followed by a HardSigmoid with a coarse output."""
    def pair(name, scale, dtype=np.int8, stored=None):
        inits = [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
                 numpy_helper.from_array(np.array(0, dtype), f"{name}_z")]
        nodes = []
        if stored is None:
            nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]))
        else:
            inits.append(numpy_helper.from_array(stored, f"{name}_q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"]))
        return nodes, inits

    parts = [pair("x", 2**-4), pair("w", 2**-20, stored=np.ones((2, 2, 1, 1), np.int8)),
             pair("b", 2**-10, np.int32, stored=np.zeros(2, np.int32)), pair("y", 2**-4), pair("h", 2**-5)]
    x, w, b, y, h = (p[0] for p in parts)
    nodes = [*x, *w, *b, helper.make_node("Conv", ["x_dq", "w_dq", "b_dq"], ["y"], name="conv"), *y,
             helper.make_node("HardSigmoid", ["y_dq"], ["h"], alpha=1 / 6, beta=0.5, name="hsig"), *h]
    inits = [t for p in parts for t in p[1]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])],
                              [helper.make_tensor_value_info("h_dq", TensorProto.FLOAT, [1, 2, 2, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    found = npu_constraints.check(model)
    assert npu_constraints.tags(found) == {"shift-cut", "bias-int32", "hard-sigmoid"}, found
    assert any("= 20 outside" in v for v in found), found  # 20 + 4 - 4


def test_checker_reads_mul_shift_qdq_agreement_and_uint8():
    """x (uint8, zp 128) * y (uint8, zp 0) → Mul at pos 20: write shift < 0; x's DQ disagrees with its Q."""
    inits = [numpy_helper.from_array(np.array(2**-4, np.float32), "s4"),
             numpy_helper.from_array(np.array(2**-5, np.float32), "s5"),
             numpy_helper.from_array(np.array(2**-20, np.float32), "s20"),
             numpy_helper.from_array(np.array(128, np.uint8), "z128"),
             numpy_helper.from_array(np.array(0, np.uint8), "z0")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s4", "z128"], ["xq"], name="xQ"),
        helper.make_node("DequantizeLinear", ["xq", "s5", "z128"], ["xd"], name="xDQ"),
        helper.make_node("QuantizeLinear", ["y", "s4", "z0"], ["yq"], name="yQ"),
        helper.make_node("DequantizeLinear", ["yq", "s4", "z0"], ["yd"], name="yDQ"),
        helper.make_node("Mul", ["xd", "yd"], ["m"], name="mul"),
        helper.make_node("QuantizeLinear", ["m", "s20", "z128"], ["mq"], name="mQ"),
        helper.make_node("DequantizeLinear", ["mq", "s20", "z128"], ["md"], name="mDQ"),
    ]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "y", "md")]
    model = helper.make_model(helper.make_graph(nodes, "g", info[:2], info[2:], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    found = npu_constraints.check(model)
    assert npu_constraints.tags(found) == {"qdq-agree", "zero-point", "shift-write-mul"}, found
    assert sum("[zero-point]" in v for v in found) == 2  # yQ and yDQ (uint8 with 0); x and m (128) pass
    assert any("mul" in v and "-11" in v for v in found), found  # 5 + 4 - 20, read from x's DQ


def test_checker_flags_the_unfixed_models(models):
    ort = npu_constraints.check(models.ort)
    assert npu_constraints.tags(ort) == {"pow2"} and len(ort) > 40, ort[:5]
    fx = npu_constraints.check(models.fx)
    assert fx == ["[hard-sigmoid] /gate/HardSigmoid: output pos 6 < 7"], fx


# --- (a) and (b): fix, lint, check, compare ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_fix_exits_0_and_the_output_is_clean(models, kind):
    fixed = fix_once(models, kind, source_of(models, kind))
    print(f"\n{kind}: qdq fix {fixed.run.seconds:.2f} s, {len(fixed.report['changes'])} change(s) in "
          f"{fixed.report['rounds']} round(s), by rule {fixed.report['changes_by_rule']}")
    assert fixed.run.code == 0, fixed.run.out + fixed.run.err
    assert fixed.run.err == ""
    assert "lint-clean at --fail-on warning; outputs within tolerance" in fixed.run.out
    onnx.checker.check_model(str(fixed.out), full_check=True)
    code, report = lint(fixed.out)
    assert code == 0, report["findings"]
    assert {f["severity"] for f in report["findings"]} <= {"info"}
    assert qdq("lint", fixed.out, "--target", "npu", "--isolated").code == 0  # the text format, as in CI
    assert npu_constraints.check(fixed.out) == []


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_outputs_stay_close(models, kind):
    fixed = fix_once(models, kind, source_of(models, kind))
    assert fixed.run.code == 0
    reference = logits(models.float, models.calibration)
    before = logits(fixed.source, models.calibration)
    after = logits(fixed.out, models.calibration)
    errors = {
        "fixed vs input": rel_l2(after, before),
        "fixed vs float": rel_l2(after, reference),
        "input vs float": rel_l2(before, reference),
    }
    print(f"\n{kind}: relative L2 of the logits over {len(models.calibration)} inputs: "
          + ", ".join(f"{k} {v:.2%}" for k, v in errors.items()))
    assert errors["fixed vs input"] < MAX_FIXED_VS_INPUT
    assert errors["fixed vs float"] < MAX_FIXED_VS_FLOAT
    # qdq's own verification ran on the calibration input given with --inputs.
    verification = fixed.report["verification"]
    assert verification["inputs"] == str(models.calib_npz) and verification["passed"]


@pytest.mark.parametrize("kind", KINDS)
def test_fixing_the_fixed_model_changes_nothing(models, kind):
    fixed = fix_once(models, kind, source_of(models, kind))
    assert fixed.run.code == 0
    again = models.folder / f"{kind}.fixed2.onnx"
    run = qdq("fix", fixed.out, "--target", "npu", "-o", again, "--format", "json", "--isolated")
    assert run.code == 0, run.out + run.err
    report = run.json()
    assert report["changes"] == [] and report["changes_by_rule"] == {}
    assert report["rounds"] == 1 and report["converged"] and report["passed"]
    assert report["verification"] is None  # nothing changed, nothing to compare
    assert graph_signature(again) == graph_signature(fixed.out)


@pytest.mark.parametrize("kind", KINDS)
def test_fix_never_modifies_its_input(models, kind):
    fixed = fix_once(models, kind, source_of(models, kind))
    assert fixed.hash_before == fixed.hash_after == sha(fixed.source)


@pytest.mark.parametrize("kind", KINDS)
def test_report_file_lists_every_change(models, kind):
    fixed = fix_once(models, kind, source_of(models, kind))
    report = fixed.report
    assert report["model"] == str(fixed.source) and report["output"] == str(fixed.out)
    assert report["rule_set"] == "npu" and report["passed"] and report["converged"]
    changes = report["changes"]
    assert changes
    for change in changes:
        assert set(change) >= {"code", "node", "tensor", "old", "new"}, change
        assert change["code"] in all_rules() and change["node"] and change["tensor"], change
        assert change["old"] != change["new"], change
    counted = {}
    for change in changes:
        counted[change["code"]] = counted.get(change["code"], 0) + 1
    assert counted == report["changes_by_rule"]
    # The text on stdout names the same changes, one line each.
    for change in changes:
        line = f"{change['code']} {change['node']} [{change['tensor']}]: {change['old']} → {change['new']}"
        assert line in fixed.run.out


def test_ort_fix_moves_every_scale_to_a_power_of_two(models):
    fixed = fix_once(models, "ort", models.ort)
    by_rule = fixed.report["changes_by_rule"]
    graph = onnx.load(str(models.ort)).graph
    float_scales = sum(1 for n in graph.node if n.op_type == "QuantizeLinear") + sum(
        1 for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in {t.name for t in graph.initializer}
    )
    int32_biases = 7  # 6 Conv + 1 Gemm
    assert by_rule["QDQ504"] == float_scales - int32_biases  # int32 biases are QDQ606's
    # Every int32 bias is realigned (one twice: the Flatten before the Gemm moves and moves back).
    assert len({c["tensor"] for c in fixed.report["changes"] if c["code"] == "QDQ606"}) == int32_biases
    assert fixed.report["rounds"] >= 2


def test_fx_fix_only_moves_the_gate_hard_sigmoid(models):
    fixed = fix_once(models, "fx", models.fx)
    # QDQ204 folds the QAT ConvBn (Conv → Div → BN) first; its fix is approximate in general but
    # reports each fold's exactness, and these are exact (k = 1 within float rounding).
    folds = [c for c in fixed.report["changes"] if c["code"] == "QDQ204"]
    assert folds and all(c["values"]["exact"] for c in folds)
    # QDQ610 stores the float (folded) biases as int32 at input × weight scale; no scale moves.
    biases = [c for c in fixed.report["changes"] if c["code"] == "QDQ610"]
    assert biases and all(c["old"] == "float" and c["new"].startswith("int32 at 2^-") for c in biases)
    approximate = [c for c in fixed.report["changes"]
                   if all_rules()[c["code"]].fix_safety != FixSafety.EXACT and c["code"] not in ("QDQ204", "QDQ610")]
    assert [(c["code"], c["old"], c["new"]) for c in approximate] == [("QDQ607", "2^-6", "2^-7")]
    assert "gate" in approximate[0]["node"] or "gate" in approximate[0]["tensor"]


def resolved_scales(path: Path) -> dict[str, np.ndarray]:
    graph = onnx.load(str(path)).graph
    return {n.name: constant(graph, n.input[1]).ravel() for n in graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear")}


def test_fx_fix_moves_no_scale_but_the_gates_even_through_a_shared_initializer(models):
    """In the FX export the gate's output scale and branch_a's weight scale are one initializer (the exporter
    deduplicates equal constants and reads them through Identity). Moving the gate must clone it."""
    graph = onnx.load(str(models.fx)).graph
    gate_q = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "/gate/HardSigmoid_output_0")
    weight_q = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.name.startswith("/branch_a.0/weight"))
    producers, inits = producer_map(graph), {t.name for t in graph.initializer}

    def source(name: str) -> str:
        while name not in inits:
            name = producers[name].input[0]
        return name

    assert gate_q.input[1] not in inits  # read through Identity
    assert source(gate_q.input[1]) == source(weight_q.input[1])  # one initializer for both
    fixed = fix_once(models, "fx", models.fx)
    before, after = resolved_scales(models.fx), resolved_scales(fixed.out)
    assert set(before) <= set(after)
    assert all("bias" in name for name in set(after) - set(before))  # QDQ610's new bias DQs
    moved = {name for name in before if not np.array_equal(before[name], after[name])}
    gate_dq = next(n.name for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == gate_q.output[0])
    assert moved == {gate_q.name, gate_dq}, moved
    assert after[weight_q.name].tolist() == [2**-6] and after[gate_q.name].tolist() == [2**-7]


# --- (c) hand-edited models, one broken rule each -------------------------------------------------------------


@dataclass
class Variant:
    """A model that breaks one rule: which lint code and checker tag must appear before the fix."""

    base: str  # "ort" (the fixed onnxruntime model) or "fx" (the FX export as it is)
    edit: Callable[[onnx.GraphProto], dict]  # edits in place; returns facts for the specific checks
    code: str
    tag: str | None  # the checker's tag, None when the checker cannot see it before the fix (non-pow2)
    options: tuple = ()


def _concat(g):
    set_scale(g, group_of_input(g, only_node(g, "Concat"), 0), 2**-3)
    return {}


def _add_gap(g):
    add = only_node(g, "Add")
    set_scale(g, group_of_input(g, add, 0), 2**-9)
    set_scale(g, group_of_input(g, add, 1), 2**-1)
    return {}


def _shift_cut(g):
    """res1's weight scale 2^-20 (stored int8 unchanged); its int32 bias moved exactly to ipos + 20."""
    conv = node_named(g, "Conv", "res1.0/Conv")
    weights = group_of_input(g, conv, 1)
    ipos = pos(qparams(g, group_of_input(g, conv, 0)[0])[0])
    set_scale(g, weights, 2**-20)
    bias = group_of_input(g, conv, 2)
    _, q = stored_integers(g, bias)
    bpos = pos(qparams(g, bias[0])[0])
    moved = q.astype(np.int64) << (ipos + 20 - bpos)
    assert np.abs(moved).max() < 2**31
    set_stored(g, bias, moved.astype(np.int32))
    set_scale(g, bias, 2.0 ** -(ipos + 20))
    return {"conv": conv.name}


def _bias_x2(g):
    conv = node_named(g, "Conv", "stem.0/Conv")
    bias = group_of_input(g, conv, 2)
    set_scale(g, bias, qparams(g, bias[0])[0] * 2)
    return {"conv": conv.name}


def _non_pow2_activations(g):
    """Two activations of the FX export: one scale as float_data, one as raw_data."""
    conv = node_named(g, "Conv", "up_conv/Conv")
    mul = only_node(g, "Mul")
    set_scale(g, group_of_output(g, conv), 0.0123, storage="typed")
    set_scale(g, group_of_output(g, mul), 0.0234, storage="raw")
    return {"tensors": [conv.output[0], mul.output[0]]}


def _non_pow2_weight(g):
    gemm = only_node(g, "Gemm")
    set_scale(g, group_of_input(g, gemm, 1), 0.003, storage="typed")
    return {"conv": gemm.name}


def _per_channel(g):
    """res1's weight per output channel: every other channel at twice the scale (its integers halved)."""
    conv = node_named(g, "Conv", "res1.0/Conv")
    weights = group_of_input(g, conv, 1)
    _, q = stored_integers(g, weights)
    scale = float(qparams(g, weights[0])[0])
    coarse = np.arange(q.shape[0]) % 2 == 0
    factor = np.where(coarse, 2, 1).reshape(-1, *([1] * (q.ndim - 1)))
    set_stored(g, weights, np.rint(q / factor).astype(np.int8))
    set_scale(g, weights, np.where(coarse, 2 * scale, scale).astype(np.float32))
    set_zero_point(g, weights, np.zeros(q.shape[0], np.int8))
    for node in weights:
        node.attribute.append(helper.make_attribute("axis", 0))
    return {"conv": conv.name, "scale": scale}


def _zero_point(g):
    set_zero_point(g, group_of_output(g, node_named(g, "Conv", "up_conv/Conv")), np.array(-3, np.int8))
    return {}


def _hard_sigmoid(g):
    set_scale(g, group_of_output(g, node_named(g, "HardSigmoid", "gate/HardSigmoid")), 2**-5)
    return {}


def _swish(g):
    """The gate's output 2^-16: swish shift 5 + 16 - 5 = 16 > 15, while every other rule still holds.

    (Moving the Mul's output instead also breaks the next HardSigmoid's input range or the plain Mul
    write shift, whose fixes run first and leave nothing for QDQ608.)
    """
    set_scale(g, group_of_output(g, node_named(g, "HardSigmoid", "gate/HardSigmoid")), 2.0**-16)
    return {}


def _shift_write_add(g):
    set_scale(g, group_of_output(g, only_node(g, "Add")), 2**-12)  # min(4, 4) - 12 = -8 < -7
    return {}


def _int8_bias(g):
    """stem's int32 bias replaced by an int8 bias at shift_bias 16 (one past the limit)."""
    conv = node_named(g, "Conv", "stem.0/Conv")
    bias = group_of_input(g, conv, 2)
    real, _ = dequantized(g, conv.name, 2)
    ipos = pos(qparams(g, group_of_input(g, conv, 0)[0])[0])
    wpos = pos(qparams(g, group_of_input(g, conv, 1)[0])[0])
    bscale = 2.0 ** -(ipos + wpos - 16)
    set_stored(g, bias, np.clip(np.rint(real / bscale), -128, 127).astype(np.int8))
    set_scale(g, bias, bscale)
    set_zero_point(g, bias, np.array(0, np.int8))
    return {"conv": conv.name}


def _split_initializers(g):
    """The Add output's Q and DQ read separate, equal non-pow2 scales: the Q's raw_data, the DQ's float_data."""
    group = group_of_output(g, only_node(g, "Add"))
    set_scale(g, group[:1], 0.1, storage="raw")
    set_scale(g, group[1:], 0.1, storage="typed")
    return {"nodes": [n.name for n in group]}


def _constant_node(g):
    """up_conv's output scale 0.03 from a Constant node instead of an initializer."""
    group = group_of_output(g, node_named(g, "Conv", "up_conv/Conv"))
    value = numpy_helper.from_array(np.array(0.03, np.float32))
    g.node.insert(0, helper.make_node("Constant", [], ["edited_scale"], value=value, name="edited_scale_constant"))
    for node in group:
        node.input[1] = "edited_scale"
    return {}


def _shared_initializer(g):
    """One non-pow2 initializer read by two unrelated values (the Add's and up_conv's outputs)."""
    add = group_of_output(g, only_node(g, "Add"))
    conv = group_of_output(g, node_named(g, "Conv", "up_conv/Conv"))
    set_scale(g, add + conv, 0.05)
    return {}


def _weight_zero_point(g):
    """stem's stored int8 weight gets zero-point -3 (integers unchanged)."""
    conv = node_named(g, "Conv", "stem.0/Conv")
    set_zero_point(g, group_of_input(g, conv, 1), np.array(-3, np.int8))
    return {"conv": conv.name}


def _gap_flatten_pos6(g):
    """GAP and Flatten outputs at 2^-6 (fc's int32 bias moved to match): the act HardSigmoid feeding the GAP
    needs its output at pos >= 7, so the whole chain HardSigmoid → GAP → Flatten must end at 2^-7.

    onnxruntime writes exactly this when the GAP's calibrated maximum reaches 1.0 (scale 1/127, ceil 2^-6).
    """
    set_scale(g, group_of_output(g, only_node(g, "GlobalAveragePool")), 2**-6)
    set_scale(g, group_of_output(g, only_node(g, "Flatten")), 2**-6)
    bias = group_of_input(g, only_node(g, "Gemm"), 2)
    _, q = stored_integers(g, bias)
    set_stored(g, bias, np.rint(q / 2).astype(np.int32))
    set_scale(g, bias, float(qparams(g, bias[0])[0]) * 2)
    return {}


VARIANTS = {
    "concat": Variant("ort", _concat, "QDQ401", "concat"),
    "add_gap": Variant("ort", _add_gap, "QDQ601", "shift-read"),
    "shift_cut": Variant("ort", _shift_cut, "QDQ604", "shift-cut"),
    "bias_x2": Variant("ort", _bias_x2, "QDQ606", "bias-int32"),
    "non_pow2_activations": Variant("fx", _non_pow2_activations, "QDQ504", "pow2"),
    "non_pow2_weight": Variant("ort", _non_pow2_weight, "QDQ504", "pow2"),
    "per_channel": Variant("ort", _per_channel, "QDQ502", "per-tensor"),
    "zero_point": Variant("ort", _zero_point, "QDQ503", "zero-point"),
    "hard_sigmoid": Variant("ort", _hard_sigmoid, "QDQ607", "hard-sigmoid"),
    "swish": Variant("ort", _swish, "QDQ608", "swish"),
    "shift_write_add": Variant("ort", _shift_write_add, "QDQ602", "shift-write-add"),
    "int8_bias": Variant("ort", _int8_bias, "QDQ605", "shift-bias"),
    "split_initializers": Variant("ort", _split_initializers, "QDQ504", "pow2"),
    "constant_node": Variant("ort", _constant_node, "QDQ504", "pow2"),
    "shared_initializer": Variant("ort", _shared_initializer, "QDQ504", "pow2"),
    "weight_zero_point": Variant("ort", _weight_zero_point, "QDQ503", "zero-point"),
}


# Variants with tests of their own below (regressions); not in the parametrized list.
EXTRA_VARIANTS = {
    "gap_flatten_pos6": Variant("ort", _gap_flatten_pos6, "QDQ402", "in-out"),
}


@dataclass
class Edited:
    path: Path
    facts: dict
    fixed: Fixed


def variant(models: Models, name: str) -> Edited:
    """The edited model, written once, and its `qdq fix` run."""
    key = f"variant_{name}"
    spec = {**VARIANTS, **EXTRA_VARIANTS}[name]
    path = models.folder / f"{key}.onnx"
    if not path.exists():
        base = fix_once(models, "ort", models.ort).out if spec.base == "ort" else models.fx
        proto = onnx.load(str(base))
        facts = spec.edit(proto.graph)
        onnx.checker.check_model(proto, full_check=True)
        onnx.save(proto, str(path))
        (models.folder / f"{key}.facts.json").write_text(json.dumps(facts))
    facts = json.loads((models.folder / f"{key}.facts.json").read_text())
    return Edited(path, facts, fix_once(models, key, path, *spec.options))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_is_flagged_then_fixed(models, name):
    spec = VARIANTS[name]
    edited = variant(models, name)
    before_codes = lint_codes(edited.path)
    before_tags = npu_constraints.tags(npu_constraints.check(edited.path))
    fixed = edited.fixed
    print(f"\n{name}: lint before {sorted(before_codes)}; checker before {sorted(before_tags)}; "
          f"fix {fixed.run.seconds:.2f} s, {fixed.report.get('changes_by_rule')} "
          f"in {fixed.report.get('rounds')} round(s)")
    assert spec.code in before_codes
    if spec.tag is not None:
        assert spec.tag in before_tags
    assert fixed.run.code == 0, fixed.run.out + fixed.run.err
    assert spec.code in fixed.report["changes_by_rule"]
    code, report = lint(fixed.out)
    assert code == 0, report["findings"]
    assert npu_constraints.check(fixed.out) == []
    assert fixed.hash_before == fixed.hash_after


def _effective_weights_within_one_new_step(models, name, fraction=0.5):
    """The fixed model's dequantized weights against the edited model's: within `fraction` of the new step.

    One re-quantization with round-half-to-even moves a weight by at most half a new step; a fix chain
    that re-quantizes twice (QDQ503 then QDQ504) stays within one new step.
    """
    edited = variant(models, name)
    assert edited.fixed.run.code == 0
    node = edited.facts["conv"]
    before, _ = dequantized(onnx.load(str(edited.path)).graph, node, 1)
    after, step = dequantized(onnx.load(str(edited.fixed.out)).graph, node, 1)
    assert step.size == 1
    worst = float(np.abs(after - before).max() / float(step))
    print(f"\n{name}: largest weight move {worst:.3f} of the new step {float(step):g}")
    assert worst <= fraction
    return before, after, float(step)


def test_shift_cut_requantizes_the_stored_weights(models):
    before, after, step = _effective_weights_within_one_new_step(models, "shift_cut")
    assert step == 2**-16  # wpos := 16 + opos - ipos with ipos = opos = 4
    assert np.count_nonzero(after) < np.count_nonzero(before)  # tiny weights round to zero, as they must


def test_shift_cut_keeps_the_int32_bias_at_input_times_weight_scale(models):
    edited = variant(models, "shift_cut")
    assert edited.fixed.run.code == 0
    assert "QDQ606" not in lint_codes(edited.path)  # the bias was consistent before the weight moved
    graph = onnx.load(str(edited.fixed.out)).graph
    conv = next(n for n in graph.node if n.name == edited.facts["conv"])
    scales = [float(qparams(graph, group_of_input(graph, conv, i)[0])[0]) for i in range(3)]
    assert scales[2] == scales[0] * scales[1]  # exactly, not within a tolerance
    bias_before, _ = dequantized(onnx.load(str(edited.path)).graph, conv.name, 2)
    bias_after, bias_step = dequantized(graph, conv.name, 2)
    assert np.all(np.abs(bias_after - bias_before) <= float(bias_step) / 2)
    assert "QDQ606" in edited.fixed.report["changes_by_rule"]


def test_non_pow2_weight_is_requantized_within_one_step(models):
    before, after, step = _effective_weights_within_one_new_step(models, "non_pow2_weight")
    assert step == 2**-8  # ceil(0.003) = 2^-8.4 → 2^-8
    graph = onnx.load(str(variant(models, "non_pow2_weight").fixed.out)).graph
    gemm = only_node(graph, "Gemm")
    scales = [float(qparams(graph, group_of_input(graph, gemm, i)[0])[0]) for i in range(3)]
    assert scales[2] == scales[0] * scales[1]


def test_per_channel_weight_becomes_per_tensor(models):
    before, after, step = _effective_weights_within_one_new_step(models, "per_channel")
    # The coarse channels' integers use half the type, so the one scale is the finest that holds every
    # weight, the fine channels' (not the largest, twice that): every weight is on it and keeps its value.
    assert step == variant(models, "per_channel").facts["scale"]
    np.testing.assert_array_equal(after, before)


# Regression (fixed in 70e9306): the second fix re-quantized the integers the first had replaced, with
# the new scale: weights moved by 3 new steps (the old zero-point), and verification still passed.
def test_weight_zero_point_is_requantized_within_one_step(models):
    edited = variant(models, "weight_zero_point")
    assert [c["code"] for c in edited.fixed.report["changes"]][:2] == ["QDQ503", "QDQ504"]  # two roundings
    _effective_weights_within_one_new_step(models, "weight_zero_point", fraction=1.0)


def _tensor_names(path: Path) -> set[str]:
    graph = onnx.load(str(path)).graph
    return ({t.name for t in graph.initializer} | {i for n in graph.node for i in n.input}
            | {o for n in graph.node for o in n.output} | {v.name for v in graph.input})


# Regression (fixed in 70e9306): the second change of a stored value in one run named the intermediate
# constant the first re-quantization created, a name in neither the input nor the output model.
def test_every_change_names_a_tensor_of_the_input_or_output_model(models):
    edited = variant(models, "weight_zero_point")
    assert edited.fixed.run.code == 0
    known = _tensor_names(edited.path) | _tensor_names(edited.fixed.out)
    unknown = [(c["code"], c["node"], c["tensor"]) for c in edited.fixed.report["changes"] if c["tensor"] not in known]
    assert unknown == []


def test_gap_flatten_variant_is_flagged(models):
    edited = variant(models, "gap_flatten_pos6")
    assert lint_codes(edited.path) == {"QDQ402"}
    assert npu_constraints.tags(npu_constraints.check(edited.path)) == {"in-out"}


# Regression (fixed in 70e9306): the HardSigmoid ceiling capped the GAP group only; the Flatten group
# [GAP out, Flatten out] took the coarser 2^-6 and moved the GAP output back, round after round (10 rounds,
# not converged, exit 1, Flatten left misaligned).
def test_gap_flatten_chain_below_the_hard_sigmoid_floor_converges(models):
    fixed = variant(models, "gap_flatten_pos6").fixed
    print(f"\ngap_flatten_pos6: exit {fixed.run.code}, {fixed.report['rounds']} rounds, converged "
          f"{fixed.report['converged']}, by rule {fixed.report['changes_by_rule']}")
    assert fixed.report["converged"], fixed.report["still_changing"]
    assert fixed.run.code == 0
    assert lint(fixed.out)[0] == 0
    assert npu_constraints.check(fixed.out) == []


def test_q_and_dq_with_separate_initializers_move_together(models):
    edited = variant(models, "split_initializers")
    assert edited.fixed.run.code == 0
    graph = onnx.load(str(edited.fixed.out)).graph
    nodes = [n for n in graph.node if n.name in edited.facts["nodes"]]
    assert len(nodes) == len(edited.facts["nodes"]) >= 2
    scales = {float(qparams(graph, n)[0]) for n in nodes}
    assert scales == {2.0**-3}, scales  # ceil(0.1) for the Q and for every DQ


def test_raw_data_and_float_data_scales_are_both_fixed(models):
    edited = variant(models, "non_pow2_activations")
    graph = onnx.load(str(edited.path)).graph
    inits = {t.name: t for t in graph.initializer}
    storages = {}
    for tensor in edited.facts["tensors"]:
        q = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
        t = inits[q.input[1]]
        storages[tensor] = "raw_data" if t.raw_data else ("float_data" if t.float_data else "?")
    assert sorted(storages.values()) == ["float_data", "raw_data"]
    assert edited.fixed.run.code == 0
    moved = {c["tensor"]: (c["old"], c["new"]) for c in edited.fixed.report["changes"] if c["code"] == "QDQ504"}
    tensors = edited.facts["tensors"]
    assert moved == {tensors[0]: ("0.0123", "2^-6"), tensors[1]: ("0.0234", "2^-5")}
    fixed = onnx.load(str(edited.fixed.out)).graph
    for tensor in tensors:
        for node in fixed.node:
            if node.op_type == "QuantizeLinear" and node.input[0] == tensor:
                scale = float(qparams(fixed, node)[0])
                assert np.frexp(scale)[0] == 0.5, (tensor, scale)


# --- command-line behaviour -------------------------------------------------------------------------------------


@pytest.fixture
def ort_copy(models, tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    shutil.copyfile(models.ort, path)
    return path


def test_output_equal_to_input_is_a_usage_error(ort_copy):
    before = sha(ort_copy)
    run = qdq("fix", ort_copy, "--target", "npu", "-o", ort_copy, "--isolated")
    assert run.code == 2
    assert run.out == "" and run.err.count("\n") == 1 and run.err.startswith("qdq: error:"), run.err
    assert sha(ort_copy) == before


def test_fix_needs_an_output_choice(ort_copy):
    run = qdq("fix", ort_copy, "--target", "npu", "--isolated")
    assert run.code == 2 and run.err.count("\n") == 1 and "-o OUT, --in-place or --dry-run" in run.err
    assert sorted(p.name for p in ort_copy.parent.iterdir()) == ["model.onnx"]


def test_dry_run_writes_nothing(ort_copy, models):
    before = sorted((p.name, sha(p)) for p in ort_copy.parent.iterdir())
    run = qdq("fix", ort_copy, "--target", "npu", "--dry-run", "--inputs", models.calib_npz, "--isolated")
    assert run.code == 0, run.out + run.err
    assert "(dry run, nothing written)" in run.out and "QDQ504" in run.out
    assert sorted((p.name, sha(p)) for p in ort_copy.parent.iterdir()) == before


def test_in_place_overwrites_the_input_after_verification(ort_copy, models):
    run = qdq("fix", ort_copy, "--target", "npu", "--in-place", "--inputs", models.calib_npz, "--isolated")
    assert run.code == 0, run.out + run.err
    assert sorted(p.name for p in ort_copy.parent.iterdir()) == ["model.onnx"]  # no stray temporary files
    assert lint(ort_copy)[0] == 0 and npu_constraints.check(ort_copy) == []
    assert graph_signature(ort_copy) == graph_signature(fix_once(models, "ort", models.ort).out)


def test_in_place_leaves_the_input_when_verification_fails(ort_copy, models):
    before = sha(ort_copy)
    run = qdq("fix", ort_copy, "--target", "npu", "--in-place", "--inputs", models.calib_npz,
              "--min-sqnr", "200", "--isolated")
    assert run.code == 1, run.out + run.err
    assert "outputs moved past tolerance" in run.out and "the input was left unchanged" in run.out
    assert sha(ort_copy) == before
    assert sorted(p.name for p in ort_copy.parent.iterdir()) == ["model.onnx"]


def test_exact_only_applies_exact_fixes_and_lists_what_remains(ort_copy, models, tmp_path):
    out = tmp_path / "exact.onnx"
    run = qdq("fix", ort_copy, "--target", "npu", "-o", out, "--exact-only", "--inputs", models.calib_npz,
              "--format", "json", "--isolated")
    assert run.code == 1, run.err
    report = run.json()
    rules = all_rules()
    assert report["changes"], "the [1]-shaped bias scales have an exact fix"
    assert {rules[c["code"]].fix_safety for c in report["changes"]} == {FixSafety.EXACT}
    assert report["verification"]["identical"]  # exact fixes: bit-identical outputs
    remaining = {f["code"] for f in report["remaining"] if f["severity"] == "error"}
    assert "QDQ504" in remaining
    text = qdq("fix", ort_copy, "--target", "npu", "-o", out, "--exact-only", "--inputs", models.calib_npz,
               "--isolated")
    assert text.code == 1
    not_fixed = [line for line in text.out.splitlines() if "[not fixed" in line]
    assert any("QDQ504" in line for line in not_fixed), text.out
    assert len(not_fixed) == len([f for f in report["remaining"] if f["severity"] in ("error", "warning")])


def test_max_rounds_1_reports_that_the_fixes_did_not_settle(ort_copy, models, tmp_path):
    needs = fix_once(models, "ort", models.ort).report["rounds"]
    assert needs > 2  # the last round is the one that changes nothing
    run = qdq("fix", ort_copy, "--target", "npu", "-o", tmp_path / "one.onnx", "--max-rounds", "1",
              "--inputs", models.calib_npz, "--isolated")
    assert run.code == 1, run.out + run.err
    assert "the fixes did not settle" in run.out
