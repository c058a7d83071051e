"""Every model of the conformance corpus × every target: what qdq promises about models it did not make.

The corpus (`tests/corpus/`, see its README) holds files written by onnxruntime's quantizer,
PyTorch, NNCF, ModelOpt, Quark and public projects. For each file and target this runs the
commands as a user would (`cli.main`) and checks, with onnx and onnxruntime directly rather than
with qdq's own code:

- a model onnxruntime creates a session for is accepted by lint, inspect and fix (exit 0 or 1);
  any exit 2 is one `qdq: error:` line; no traceback or "unexpected" error anywhere;
- a file fix writes passes the full ONNX checker (when the input does) and loads in onnxruntime;
- a failed verification exits 1 (fix runs with `--keep-failed`, so that the refused candidate is
  on disk to be checked; that nothing is written without it is `test_fix_verification.py`'s);
- the numbers fix reports are the ones onnxruntime gives on the same inputs (with its default
  optimisations where the target's verdict runs them): recomputed here from the calibration
  samples; and `qdq verify` on the pair fix wrote gives the same numbers and the same verdict,
  passed or refused;
- the verdict's distances from the float twin are those of a twin built here from its definition
  (`independent_twin.py`, no qdq code), and the verdict follows them and the rule set's margin:
  a passed fix has every output within the allowed distance, a refused one has an output, or
  the network's deepest quantized tensors, beyond it;
- integers at the graph's interface (a Q's output that is a graph output, a graph input a DQ
  reads), and integers another op reads or writes (QLinearConv, QGemm), keep their scale,
  zero-point and type;
- fix on its own output changes nothing; the input files are unchanged; an output's external
  data holds only the bytes its tensors reference;
- a file fix calls lint-clean satisfies the target's rules as an independent checker reads them
  from the target's catalogue (`npu_constraints.py`, `trt_placement.py`, `ort_node_units.py`:
  onnx and numpy only, no qdq code); such runs are the matrix's "ok".

The matrix of results (one cell per model and target) is printed at the end of the run.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import independent_twin
import npu_constraints
import ort_node_units
import trt_placement
from cli_run import Run, qdq

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"
TARGETS = ("npu", "trt", "ort")
# Each target's independent checker of "clean": what it finds wrong in a model (empty when clean).
CHECKERS = {"npu": npu_constraints.check, "trt": trt_placement.violations, "ort": ort_node_units.check}
# Two float32 computations of the same SQNR agree to far better than this.
NUMBER_TOLERANCE = dict(rtol=1e-4, atol=1e-6)
# The verdict's margin on every output, as the shipped rule sets say it (read here, not through qdq).
VERDICT = tomllib.loads((ROOT / "rules" / "common.toml").read_text())["verdict"]
# The twin's distance as the verdict and as `independent_twin` compute it: the same float32 graphs,
# so they agree far closer than this. In float16 (ModelOpt's exports) onnxruntime's results depend on
# the session's graph, not only on the math (the verdict runs pieces of it; an unread QuantizeLinear
# moved a twin's logits by 0.04 %), so there the distances agree to 0.1 % of the outputs' norm.
DISTANCE_TOLERANCE = {False: dict(rtol=2e-4, atol=1e-6), True: dict(rtol=0.0, atol=1e-3)}


@dataclass(frozen=True)
class Entry:
    path: Path
    architecture: str
    tool: str

    @property
    def name(self) -> str:
        return str(self.path.relative_to(CORPUS))


def corpus() -> list[Entry]:
    entries = []
    for manifest in sorted(CORPUS.glob("*/manifest.json")):
        for item in json.loads(manifest.read_text()):
            path = manifest.parent / item["file"]
            if path.suffix == ".onnx":
                entries.append(Entry(path, item.get("architecture", "other"), item.get("tool", "")))
    return entries


ENTRIES = corpus()


def test_the_corpus_is_there():
    """Guards the parametrisation below: an empty or unreadable corpus would test nothing."""
    tools = {entry.path.relative_to(CORPUS).parts[0] for entry in ENTRIES}
    assert {"float", "ort", "torch", "public"} <= tools, tools
    assert len(ENTRIES) >= 40
    for entry in ENTRIES:
        assert entry.path.is_file(), entry.path
        assert entry.path.stat().st_size <= 1 << 20, f"{entry.name} is over 1 MB"


# --- independent facts about a file -----------------------------------------------------------------


def session(path: Path, optimized: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnxruntime_loads(path: Path, optimized: bool = False) -> bool:
    """Whether onnxruntime creates a session: as users run it (`optimized`), or as verification does."""
    try:
        session(path, optimized)
    except Exception:
        return False
    return True


def checker_passes(path: Path, full: bool) -> bool:
    try:
        onnx.checker.check_model(str(path), full_check=full)
    except Exception:
        return False
    return True


def data_files(path: Path) -> dict[Path, list[tuple[int, int]]]:
    """The external data files a model references, with the (offset, length) ranges it uses."""
    proto = onnx.load(str(path), load_external_data=False)
    files: dict[Path, list[tuple[int, int]]] = {}
    for tensor in _tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            target = path.parent / info["location"]
            offset = int(info.get("offset", 0))
            length = int(info.get("length", target.stat().st_size - offset))
            files.setdefault(target, []).append((offset, length))
    return files


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            if attr.HasField("g"):
                yield from _tensors(attr.g)


def digest(path: Path) -> str:
    """The model and its data files, hashed: what `qdq` must never change."""
    hasher = hashlib.sha256(path.read_bytes())
    for data in sorted(data_files(path)):
        hasher.update(data.read_bytes())
    return hasher.hexdigest()


def sample_feeds(path: Path, entry: Entry) -> dict[str, np.ndarray] | None:
    """The first calibration sample of the model's architecture, if it fits the model's one float input."""
    samples = CORPUS / "float" / f"{entry.architecture}.npz"
    if not samples.exists():
        return None
    inputs = session(path).get_inputs()
    if len(inputs) != 1 or inputs[0].type != "tensor(float)":
        return None
    with np.load(samples) as archive:
        first = archive[archive.files[0]][:1]
    shape = inputs[0].shape
    if len(shape) != first.ndim or any(isinstance(d, int) and d != s for d, s in zip(shape, first.shape)):
        return None
    return {inputs[0].name: first}


# --- running qdq as a user does ---------------------------------------------------------------------


def assert_well_behaved(run: Run, accepted: bool, what: str) -> None:
    """Exit codes as documented, one error line, never a traceback."""
    assert "Traceback" not in run.err and "unexpected" not in run.err, f"{what}: {run.err}"
    errors = [line for line in run.err.splitlines() if line.startswith("qdq: error:")]
    if run.code == 2:
        assert len(errors) == 1, f"{what}: exit 2 must say why in one line: {run.err!r}"
        assert not accepted, f"{what} refused a model onnxruntime runs: {errors[0]}"
    else:
        assert run.code in (0, 1) and not errors, f"{what}: exit {run.code}: {run.err}"


def assert_same_numbers(reported: list[dict], independent: list[dict]) -> None:
    assert [o["name"] for o in reported] == [o["name"] for o in independent]
    for mine, theirs in zip(reported, independent):
        for key in ("max_abs_error", "sqnr_db"):
            a, b = float(mine[key]), float(theirs[key])  # JSON writes infinities as strings
            if np.isinf(a) or np.isinf(b):
                assert a == b, (mine["name"], key, a, b)
            else:
                np.testing.assert_allclose(a, b, **NUMBER_TOLERANCE, err_msg=f"{mine['name']} {key}")


@functools.lru_cache(maxsize=24)
def _outputs(path: Path, sample: bytes, optimized: bool, twin: bool) -> dict[str, np.ndarray]:
    feeds = dict(np.load(io.BytesIO(sample)).items())
    model = independent_twin.float_twin(onnx.load(str(path))) if twin else path
    return independent_twin.run(model, feeds, optimized)


def outputs(path: Path, feeds: dict[str, np.ndarray], optimized: bool = False,
            twin: bool = False) -> dict[str, np.ndarray]:
    """Every output of `path` (`twin`: of its independent float twin) on `feeds` in onnxruntime, run once for
    all the checks that need it (the input model's and its twin's once for all three targets)."""
    buffer = io.BytesIO()
    np.savez(buffer, **feeds)
    return _outputs(path, buffer.getvalue(), optimized, twin)


def independent_numbers(reference: Path, candidate: Path, feeds: dict[str, np.ndarray],
                        optimized: bool = False) -> list[dict]:
    """Max abs error and SQNR of every output, from onnxruntime and numpy alone (as the target runs it)."""
    given, fixed = outputs(reference, feeds, optimized), outputs(candidate, feeds, optimized)
    rows = []
    for name, a in given.items():
        a, b = np.asarray(a, np.float64), np.asarray(fixed[name], np.float64)
        noise = float(np.sum((a - b) ** 2))
        signal = float(np.sum(a**2))
        sqnr = np.inf if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else -np.inf)
        rows.append({"name": name, "max_abs_error": float(np.max(np.abs(a - b))) if a.size else 0.0, "sqnr_db": sqnr})
    return rows


def assert_verdict_reproduced(path: Path, out: Path, target: str, inputs: list, feeds: dict | None,
                              verification: dict) -> None:
    """The verdict's numbers are onnxruntime's, its distances the independent twin's, and `qdq verify`
    on the pair fix wrote (passed or refused) says what fix said, with the same numbers."""
    if feeds is not None:
        optimized = verification["runtime"] == "onnxruntime, default optimisations"
        assert_same_numbers(verification["outputs"], independent_numbers(path, out, feeds, optimized))
    assert_twin_distances(path, out, feeds, verification)
    again = qdq("verify", path, out, "--target", target, "--format", "json", *inputs)
    assert again.code in (0, 1), again.err
    assert again.json()["passed"] == verification["passed"], "qdq verify and qdq fix disagree"
    assert_same_numbers(verification["outputs"], again.json()["outputs"])


def computes_in_float16(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer) or any(
        a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for n in model.graph.node if n.op_type == "Cast" for a in n.attribute)


def assert_twin_distances(path: Path, out: Path, feeds: dict[str, np.ndarray] | None, verification: dict) -> None:
    """The verdict's distances from the twin are the independent twin's, and its verdict follows them."""
    rows = [row for row in verification["outputs"] if row.get("input_to_twin") is not None]
    if feeds is None or not rows or any(not row["evidence"] for row in verification["outputs"]):
        return
    twin = outputs(path, feeds, twin=True)
    optimized = verification["runtime"] == "onnxruntime, default optimisations"
    given, fixed = outputs(path, feeds, optimized), outputs(out, feeds, optimized)
    tolerance = DISTANCE_TOLERANCE[computes_in_float16(path)]
    beyond = []
    for row in rows:
        name = row["name"]
        mine = (independent_twin.relative_l2(twin[name], given[name]), independent_twin.relative_l2(twin[name], fixed[name]))
        reported = (float(row["input_to_twin"]), float(row["candidate_to_twin"]))
        np.testing.assert_allclose(reported, mine, **tolerance, err_msg=f"{name}: distances from the twin")
        allowed = mine[0] * (1 + VERDICT["margin"]) + VERDICT["epsilon"]
        np.testing.assert_allclose(float(row["allowed"]), allowed, **tolerance, err_msg=f"{name}: allowed")
        edge = allowed * tolerance["rtol"] + tolerance["atol"]
        if mine[1] > allowed + edge:
            beyond.append(name)
        elif mine[1] >= allowed - edge:
            return  # on the edge: either verdict is the same measurement
    network = verification.get("network")
    deep_beyond = network is not None and float(network["candidate_to_twin"]) > float(network["allowed"])
    if verification["passed"]:
        assert not beyond, f"passed with outputs further from the twin than allowed: {beyond}"
    else:
        assert beyond or deep_beyond, "refused with every output, and the deepest tensors, within the allowed distance"


def held_grids(path: Path) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Scale, zero-point and type of the integers that something besides their own Q/DQ nodes holds.

    First the caller's: each graph output a QuantizeLinear writes and each graph input a
    DequantizeLinear reads. Then other ops': each Q output another op reads and each DQ input
    another op writes (QLinearConv, QGemm, an integer Transpose: they read or write the integers
    on that grid). Pass-through Identity and Cast, and integer Clips (whose two ends fixes move
    together), are not such ops. Parameters are read through Identity and Cast as the node reads
    them; per-axis values that are all equal count as one value."""
    model = onnx.load(str(path), load_external_data=False)
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
                      if a.name == "value"})
    outputs, inputs = {o.name for o in model.graph.output}, {i.name for i in model.graph.input} - set(constants)
    producers = {name: node for node in model.graph.node for name in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def param(name: str) -> tuple | None:
        casts = []
        while name not in constants and name in producers and producers[name].op_type in ("Identity", "Cast"):
            node = producers[name]
            casts += [a.i for a in node.attribute if a.name == "to"]
            name = node.input[0]
        tensor = constants.get(name)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        values = onnx.numpy_helper.to_array(tensor)
        for to in reversed(casts):
            values = values.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
        flat = values.ravel().tolist()
        return (casts[0] if casts else tensor.data_type, flat[:1] if len(set(flat)) == 1 else flat)

    own = {"QuantizeLinear", "DequantizeLinear", "Identity", "Cast", "Clip"}
    interface, held = {}, {}
    for node in model.graph.node:
        found = interface
        if node.op_type == "QuantizeLinear" and node.output[0] in outputs:
            key = f"output {node.output[0]}"
        elif node.op_type == "DequantizeLinear" and node.input[0] in inputs:
            key = f"input {node.input[0]} ({node.name})"
        elif node.op_type == "QuantizeLinear" and any(r.op_type not in own for r in readers.get(node.output[0], [])):
            key, found = f"read by {node.name}", held
        elif node.op_type == "DequantizeLinear" and producers.get(node.input[0]) is not None \
                and producers[node.input[0]].op_type not in own | {"Constant"}:
            key, found = f"written for {node.name}", held
        else:
            continue
        names = list(node.input[1:3]) + [""] * (3 - len(node.input))
        found[key] = tuple(param(name) if name else None for name in names[:2])
    return interface, held


# --- the invariants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_invariants(entry: Entry, target: str, tmp_path: Path, conformance_cell) -> None:
    conformance_cell.update(model=entry.name, target=target)
    path = entry.path
    before = digest(path)
    accepted = onnxruntime_loads(path)

    lint = qdq("lint", path, "--target", target, "--format", "json")
    assert_well_behaved(lint, accepted, "lint")
    if lint.code != 2:
        lint.json()  # stdout holds the report and nothing else (no library warnings)
    inspect = qdq("inspect", path, *(["--target", "trt"] if target == "trt" else []))
    assert_well_behaved(inspect, accepted, "inspect")

    out, report_path = tmp_path / "out.onnx", tmp_path / "report.json"
    feeds = sample_feeds(path, entry) if accepted else None
    inputs = []
    if feeds is not None:
        np.savez(tmp_path / "sample.npz", **feeds)
        inputs = ["--inputs", tmp_path / "sample.npz"]
    fix = qdq("fix", path, "--target", target, "-o", out, "--report", report_path, "--format", "json",
              "--keep-failed", *inputs)
    assert_well_behaved(fix, accepted, "fix")
    assert digest(path) == before, "the input changed"
    if fix.code == 2:
        assert not out.exists(), "exit 2 but a model was written"
        conformance_cell["outcome"] = "refused"
        return
    report = json.loads(report_path.read_text())
    assert fix.json() == report, "stdout and --report disagree"
    verification = report["verification"]
    refused = verification is not None and not verification["passed"]
    assert out.exists(), "fix exited 0/1 but wrote nothing"
    assert fix.code == 1 or not refused, "the verdict refused the fix but fix exited 0"
    if verification is not None:
        assert_verdict_reproduced(path, out, target, inputs, feeds, verification)
    if refused:
        conformance_cell["outcome"] = "not written (verification)"
        return

    # What was written is valid, runs, and is what the report says.
    assert checker_passes(out, full=True) or not checker_passes(path, full=True), "the full ONNX checker refuses the output"
    assert onnxruntime_loads(out) or not accepted, "onnxruntime refuses the output"
    assert onnxruntime_loads(out, optimized=True) or not onnxruntime_loads(path, optimized=True), \
        "onnxruntime refuses the output with its graph optimisations on"
    for data, ranges in data_files(out).items():
        assert data.stat().st_size <= max(o + n for o, n in ranges), f"{data.name} holds bytes no tensor references"
        assert data.stat().st_size - 65536 * len(ranges) <= sum(n for _, n in set(ranges)), f"{data.name} is padded past alignment"
    # Integers a graph takes or hands over, or that other ops read or write, mean what their grid says
    # (a Q/DQ pair a fix removed exactly leaves the other op reading the same integers).
    (interface, held), (interface_out, held_out) = held_grids(path), held_grids(out)
    assert interface_out == interface, "the grid of integers at a graph input or output changed"
    kept = held.keys() & held_out.keys()
    assert {k: held_out[k] for k in kept} == {k: held[k] for k in kept}, \
        "the grid of integers another op reads or writes changed"

    # A second fix of the output has nothing left to change.
    second = qdq("fix", out, "--target", target, "--dry-run", "--no-verify", "--format", "json")
    assert_well_behaved(second, True, "fix of fix's output")
    assert second.json()["changes"] == [], "fix is not idempotent on its own output"
    if report["passed"] and target in CHECKERS:
        violations = CHECKERS[target](onnx.load(str(out)))
        assert violations == [], f"lint-clean, but the independent {target} checker finds: {violations[:5]}"
    conformance_cell["outcome"] = "ok" if report["passed"] else "findings left"
