"""The edit log: each operation changes the graph as graphsurgeon's own mutation does and says what it did,
the fix driver can tell structural edits from swapped constants, and no fix edits a graph behind its back."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest
from test_conformance import ENTRIES, TARGETS, Entry

from qdq.engine.fix import fix
from qdq.engine.ruleset import load_target
from qdq.graph import ir
from qdq.graph.model import load_model
from qdq.rewrite.edits import ADD, ATTRIBUTE, CONSTANT, DETACH, INPUT, OUTPUT, PARAMS, VALUES, EditLog, EditRecord
from qdq.support.errors import QdqError


def _graph() -> tuple[ir.Graph, dict]:
    """x → Q(s, zp) → DQ(s, zp) → Relu → y, with a spare constant and a spare float tensor to rewire to."""
    x = ir.Variable("x", np.float32, [1, 4])
    s, zp = ir.Constant("s", np.array(0.5, np.float32)), ir.Constant("zp", np.array(0, np.int8))
    s_via = ir.Variable("s_via", np.float32, [])  # the scale through an Identity, as PyTorch exports it
    q_out, dq_out, y = ir.Variable("q_out", np.int8, [1, 4]), ir.Variable("dq_out", np.float32, [1, 4]), \
        ir.Variable("y", np.float32, [1, 4])
    nodes = {
        "identity": ir.Node("Identity", "identity", inputs=[s], outputs=[s_via]),
        "q": ir.Node("QuantizeLinear", "q", inputs=[x, s_via, zp], outputs=[q_out]),
        "dq": ir.Node("DequantizeLinear", "dq", inputs=[q_out, s, zp], outputs=[dq_out], attrs={"axis": 1}),
        "relu": ir.Node("Relu", "relu", inputs=[dq_out], outputs=[y]),
    }
    graph = ir.Graph(nodes=list(nodes.values()), inputs=[x], outputs=[y])
    tensors = {"x": x, "s": s, "zp": zp, "s_via": s_via, "q_out": q_out, "dq_out": dq_out, "y": y,
               "s2": ir.Constant("s2", np.array(0.25, np.float32)), "z": ir.Variable("z", np.float32, [1, 4])}
    return graph, {**nodes, **tensors}


def _wiring(graph: ir.Graph, parts: dict) -> dict:
    """Every link both ways (node → tensors, tensor → producers and consumers), attributes and node list."""
    return {
        "nodes": [n.name for n in graph.nodes],
        "node": {n: ([t.name for t in node.inputs], [t.name for t in node.outputs], dict(node.attrs))
                 for n, node in parts.items() if isinstance(node, ir.Node)},
        "tensor": {n: ([p.name for p in t.inputs], [c.name for c in t.outputs])
                   for n, t in parts.items() if isinstance(t, ir.Tensor)},
    }


def _same_as_graphsurgeon(edit, raw) -> tuple[EditLog, list[str]]:
    """Apply `edit(log, parts)` and `raw(graph, parts)` to two copies of the graph; the wiring must agree.

    Returns the log and the nodes it asked to be re-read (`on_params`), in order."""
    graph, parts = _graph()
    raw(graph, parts)
    expected = _wiring(graph, parts)
    graph, parts = _graph()
    refreshed: list[str] = []
    log = EditLog(graph, on_params=lambda node: refreshed.append(node.name))
    edit(log, parts)
    assert _wiring(graph, parts) == expected
    return log, refreshed


def test_set_input_rewires_and_records_the_tensors():
    def raw(graph, p):
        p["relu"].inputs[0] = p["z"]

    log, refreshed = _same_as_graphsurgeon(lambda log, p: log.set_input(p["relu"], 0, p["z"]), raw)
    assert log.records == [EditRecord(INPUT, "relu", 0, "dq_out", "z")]
    assert log.structural and log.touched == {"relu"} and not log.swapped and not refreshed


def test_set_input_pads_with_empty_inputs():
    def raw(graph, p):
        p["relu"].inputs.extend([ir.Variable.empty(), ir.Variable.empty()])
        p["relu"].inputs[2] = p["s2"]

    log, _ = _same_as_graphsurgeon(lambda log, p: log.set_input(p["relu"], 2, p["s2"]), raw)
    assert log.records == [EditRecord(CONSTANT, "relu", 2, None, "s2")]
    assert not log.structural


def test_replace_uses_leaves_graph_outputs_alone():
    graph, p = _graph()
    graph.outputs.append(p["dq_out"])
    log = EditLog(graph)
    log.replace_uses(p["dq_out"], p["x"])
    assert graph.outputs[-1] is p["dq_out"] and p["dq_out"].inputs == [p["dq"]] and p["relu"].inputs[0] is p["x"]
    assert log.records == [EditRecord(INPUT, "relu", 0, "dq_out", "x")]


def test_replace_uses_rewires_every_slot_that_reads_the_tensor():
    graph, p = _graph()
    add = ir.Node("Add", "add", inputs=[p["dq_out"], p["dq_out"]], outputs=[ir.Variable("sum")])
    graph.nodes.append(add)
    log = EditLog(graph)
    log.replace_uses(p["dq_out"], p["x"])
    assert [t.name for t in add.inputs] == ["x", "x"] and p["dq_out"].outputs == []
    assert sorted((r.node, r.slot) for r in log.records) == [("add", 0), ("add", 1), ("relu", 0)]


def test_swap_params_is_one_refresh_and_a_record_per_change():
    def raw(graph, p):
        p["dq"].inputs[1] = p["s2"]
        p["dq"].attrs.pop("axis")
        p["dq"].attrs["output_dtype"] = 3

    log, refreshed = _same_as_graphsurgeon(
        lambda log, p: log.swap_params(p["dq"], p["s2"], axis=None, output_dtype=3), raw)
    assert log.records == [
        EditRecord(PARAMS, "dq", 1, "s", "s2"),
        EditRecord(ATTRIBUTE, "dq", "axis", "1", None),
        EditRecord(ATTRIBUTE, "dq", "output_dtype", None, "3"),
    ]
    assert refreshed == ["dq"] and log.swapped == {"dq"} and not log.structural


def test_a_scale_read_through_an_identity_swapped_for_a_constant_is_a_parameter_swap():
    def raw(graph, p):
        p["q"].inputs[1] = p["s2"]

    log, refreshed = _same_as_graphsurgeon(lambda log, p: log.set_input(p["q"], 1, p["s2"]), raw)
    assert log.records == [EditRecord(PARAMS, "q", 1, "s_via", "s2")]
    assert refreshed == ["q"] and log.swapped == {"q"} and not log.structural


def test_stored_integers_swapped_for_a_constant_are_not_structural():
    """Re-quantized weights: a DQ reads new integers in place of old ones."""
    graph, p = _graph()
    p["dq"].inputs[0] = p["zp"]  # a DQ of stored integers
    log = EditLog(graph, on_params=lambda node: pytest.fail("the parameters did not change"))
    new = ir.Constant("w", np.array(3, np.int8))
    log.set_input(p["dq"], 0, new)
    assert log.records == [EditRecord(CONSTANT, "dq", 0, "zp", "w")] and not log.structural and not log.swapped


def test_a_parameter_rewired_to_a_computed_tensor_is_structural():
    def raw(graph, p):
        p["q"].inputs[1] = p["z"]

    log, refreshed = _same_as_graphsurgeon(lambda log, p: log.set_input(p["q"], 1, p["z"]), raw)
    assert log.records[0].kind == INPUT and log.structural and refreshed == ["q"] and not log.swapped


def test_a_constant_in_place_of_a_computed_tensor_is_structural():
    """QDQ609 folds a dequantized bias into a constant: the DQ falls out of use."""
    def raw(graph, p):
        p["relu"].inputs[0] = p["s2"]

    log, _ = _same_as_graphsurgeon(lambda log, p: log.set_input(p["relu"], 0, p["s2"]), raw)
    assert log.records == [EditRecord(INPUT, "relu", 0, "dq_out", "s2")] and log.structural


def test_add_node_appends_and_refreshes_only_quantizers():
    def node(p, op, name):
        return ir.Node(op, name, inputs=[p["y"], p["s"], p["zp"]] if op == "QuantizeLinear" else [p["y"]],
                       outputs=[ir.Variable(f"{name}_out")])

    def raw(graph, p):
        graph.nodes.append(node(p, "QuantizeLinear", "q2"))
        graph.nodes.append(node(p, "Relu", "relu2"))

    def edit(log, p):
        log.add_node(node(p, "QuantizeLinear", "q2"))
        log.add_node(node(p, "Relu", "relu2"))

    log, refreshed = _same_as_graphsurgeon(edit, raw)
    assert log.records == [EditRecord(ADD, "q2"), EditRecord(ADD, "relu2")]
    assert refreshed == ["q2"] and log.structural and log.touched == {"q2", "relu2"}


def test_detach_unlinks_the_node():
    def raw(graph, p):
        p["relu"].inputs.clear()
        p["relu"].outputs.clear()

    log, _ = _same_as_graphsurgeon(lambda log, p: log.detach(p["relu"]), raw)
    assert log.records == [EditRecord(DETACH, "relu")] and log.structural


def test_set_output_moves_the_output():
    def raw(graph, p):
        p["relu"].outputs[0] = p["z"]

    log, _ = _same_as_graphsurgeon(lambda log, p: log.set_output(p["relu"], 0, p["z"]), raw)
    assert log.records == [EditRecord(OUTPUT, "relu", 0, "y", "z")] and log.structural


def test_set_values_replaces_in_place_and_has_the_readers_re_read():
    graph, p = _graph()
    refreshed = []
    log = EditLog(graph, on_params=lambda node: refreshed.append(node.name))
    log.set_values(p["s"], np.array([0.5], np.float32))
    assert p["s"].values.shape == (1,) and p["dq"].inputs[1] is p["s"]
    assert log.records == [EditRecord(VALUES, None, None, "s", "s")] and log.structural and log.touched == set()
    assert sorted(refreshed) == ["dq", "q"]  # the Q reads the scale through an Identity


def test_set_attr_records_only_a_change():
    graph, p = _graph()
    refreshed = []
    log = EditLog(graph, on_params=lambda node: refreshed.append(node.name))
    log.set_attr(p["relu"], "alpha", 0.1)
    log.set_attr(p["dq"], "axis", 1)
    assert p["relu"].attrs["alpha"] == 0.1
    assert log.records == [EditRecord(ATTRIBUTE, "relu", "alpha", None, "0.1")]
    assert refreshed == ["dq"] and not log.structural


def test_set_attr_compares_array_values_whole():
    graph, p = _graph()
    log = EditLog(graph)
    log.set_attr(p["relu"], "pads", np.array([1, 1]))
    log.set_attr(p["relu"], "pads", np.array([1, 1]))  # the same value again: nothing to record
    log.set_attr(p["relu"], "pads", np.array([1, 2]))
    assert [(r.old, r.new) for r in log.records] == [(None, "[1 1]"), ("[1 1]", "[1 2]")]


def test_records_are_data():
    record = EditRecord(PARAMS, "dq", 1, "s", "s2")
    assert record.to_dict() == {"kind": "params", "node": "dq", "slot": 1, "old": "s", "new": "s2"}
    with pytest.raises(AttributeError):
        record.kind = INPUT


# --- no fix edits a graph behind the log's back -------------------------------------------------------------

def _smallest(entries: list[Entry], per_tool: int = 2) -> list[Entry]:
    """The `per_tool` smallest files of each quantizer (the manifest's `tool`): every family, in ~10 s."""
    by_tool: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_tool[entry.tool].append(entry)
    by_size = (sorted(group, key=lambda e: (e.path.stat().st_size, e.name)) for group in by_tool.values())
    return [entry for group in by_size for entry in group[:per_tool]]


def _wires(graph: ir.Graph) -> dict[str, Counter]:
    """Each node name's (inputs, outputs) by tensor name; a Counter because some exporters repeat names."""
    found: dict[str, Counter] = defaultdict(Counter)
    for node in graph.nodes:
        found[node.name][(tuple(t.name for t in node.inputs), tuple(t.name for t in node.outputs))] += 1
    return found


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("entry", _smallest(ENTRIES), ids=lambda e: e.name)
def test_every_rewired_node_is_in_the_log(entry: Entry, target: str) -> None:
    """Nodes the fixed graph has with other inputs or outputs than the input model's, or new ones, were all
    touched through the log. Nodes the fixed graph lacks are left out: the driver's tidy dropped them because
    nothing read them any more, and the edit that stopped reading them is the one compared."""
    try:
        model = load_model(entry.path)
    except QdqError as exc:  # refusals are the conformance test's business
        pytest.skip(f"qdq refuses this model: {exc}")
    before = _wires(model.graph)
    fixed = fix(model, load_target(target))
    after = _wires(model.graph)
    changed = {name for name, wires in after.items() if before.get(name) != wires}
    touched = {record.node for record in fixed.edits}
    assert changed <= touched, sorted(changed - touched)[:10]


def test_the_fix_report_counts_the_edits_by_kind():
    model = load_model(next(e.path for e in ENTRIES if e.name == "public/onnxruntime/dup_qdq.onnx"))
    fixed = fix(model, load_target("trt"))
    report = fixed.to_dict()
    assert list(report) == ["rounds", "converged", "max_rounds", "exact_only", "still_changing", "changes_by_rule",
                            "changes", "remaining", "edits_by_kind"]
    assert report["edits_by_kind"] == dict(sorted(Counter(e.kind for e in fixed.edits).items()))
    assert {INPUT, PARAMS} <= set(report["edits_by_kind"])  # QDQ102 rewires, QDQ503 and QDQ505 swap parameters
