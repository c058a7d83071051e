"""The Q/DQ parameter columns (`qdq.quant.param_table`) against onnx's own decoding, over the whole corpus.

The columns are a fast path: every value they hold must be what `onnx.numpy_helper` reads from the
same TensorProto, the rules that test the columns at once (QDQ001, QDQ002, QDQ504) must report
what their row-by-row checks report on every row, and the scales and positions the NPU rules read
from them (`operands.scale_of`, `pos_of`) must be those read one by one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import numpy_helper
from test_conformance import ENTRIES, Entry

from qdq.checks import formats
from qdq.checks.qparams import _scale_problem, _shape_problem, _zero_point_problem
from qdq.engine.ruleset import load_target
from qdq.graph import ir
from qdq.graph.model import load_model
from qdq.quant import operands, pow2
from qdq.quant.index import PER_TENSOR, QuantIndex
from qdq.quant.param_table import ParamColumn, ParamTable
from qdq.rewrite.rule import CheckContext, Severity
from qdq.support.errors import ModelLoadError


def index_of(entry: Entry) -> QuantIndex:
    try:
        return QuantIndex(load_model(entry.path))
    except ModelLoadError:
        pytest.skip("qdq refuses this model")


def onnx_values(source) -> np.ndarray:
    """What onnx itself decodes from the TensorProto behind a parameter."""
    return numpy_helper.to_array(source.constant.proto).astype(np.float64)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_columns_hold_what_onnx_reads(entry: Entry) -> None:
    index = index_of(entry)
    table = index.table
    assert table.rows == list(index.all_params())
    for which, sources in (("scale", [p.scale_source for p in table.rows]),
                           ("zero_point", [p.zero_point_source for p in table.rows])):
        column: ParamColumn = getattr(table, which)
        for row in np.flatnonzero(column.decoded):
            expected = onnx_values(sources[row])
            got = table.values_of(table.rows[row], which)
            assert got.shape == expected.shape and np.array_equal(got, expected, equal_nan=True), (which, row)
            assert not got.flags.writeable  # rows share one buffer: a fix must never edit one in place
            low, high = column.low[row], column.high[row]
            if np.isnan(expected).any():
                assert math.isnan(low) and math.isnan(high)
            else:
                assert (low, high) == (expected.min(), expected.max())


def test_the_corpus_goes_through_the_columns() -> None:
    """Guards the test above: nearly every corpus parameter is decoded in the columns, not one by one."""
    decoded = total = 0
    for entry in ENTRIES:
        try:
            table = QuantIndex(load_model(entry.path)).table
        except ModelLoadError:
            continue
        decoded += int(table.scale.decoded.sum())
        total += sum(p.scale_source is not None for p in table.rows)
    assert total > 5000 and decoded / total > 0.95, (decoded, total)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_column_checks_report_what_row_checks_report(entry: Entry) -> None:
    """QDQ001, QDQ002 and QDQ504 test the columns first; on every row the answer is the row-by-row one."""
    index = index_of(entry)
    rules = {rule.code: (rule, cfg) for rule, cfg in load_target("npu").enabled()}

    def reported(code: str) -> list[str]:
        rule, cfg = rules[code]
        ctx = CheckContext(model=index.model, index=index, params=cfg.params, severity=Severity.ERROR)
        return [f.message for f in rule.check(ctx)]

    scale_problems = [p for p in index.all_params() if p.scale_source is not None and _scale_problem(p)]
    zero_point_problems = [p for p in index.all_params() if _zero_point_problem(p)]
    assert len(reported("QDQ001")) == len(scale_problems)
    assert len(reported("QDQ002")) == len(zero_point_problems)
    pow2_rows = index.table.scale.every(pow2.exact)
    for row in np.flatnonzero(pow2_rows):
        assert pow2.all_pow2(index.table.rows[row].scale)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_rows_cleared_at_once_are_what_the_row_checks_say(entry: Entry) -> None:
    """`per_tensor` rows have per-tensor granularity; `plain_shapes` rows have no shape problem,
    `scalar_params` rows 0-d parameters, and decoded rows the scale's rank; `same_params` pairs are
    `same_values`-equal.

    The pairs are every Q → DQ of a value (QDQ101's, nearly all equal) and every two neighbouring
    rows (mostly different), so a test that cleared too much would fail here.
    """
    index = index_of(entry)
    table = index.table
    for row in np.flatnonzero(table.per_tensor()):
        assert table.rows[row].granularity == PER_TENSOR
    for row in np.flatnonzero(table.plain_shapes()):
        assert _shape_problem(table.rows[row]) is None
    for row in np.flatnonzero(table.scalar_params()):
        assert table.rows[row].scale_shape == () and table.rows[row].zero_point_shape in (None, ())
    for row in np.flatnonzero(table.scale.decoded):
        assert table.scale.ndim[row] == len(table.rows[row].scale_shape)
    pairs = [(table.row_of[id(qt.quantize)], table.row_of[id(dq)])
             for qt in index.qtensors if qt.quantize is not None for dq in qt.dequantizes]
    pairs += [(row, row + 1) for row in range(len(table.rows) - 1)]
    a, b = np.array(pairs, dtype=np.int64).reshape(-1, 2).T
    for i in np.flatnonzero(table.same_params(a, b)):
        first, second = table.rows[a[i]], table.rows[b[i]]
        assert first.same_values(second) and first.same_values(second, equal_nan=True), (a[i], b[i])


def test_same_params_clears_most_pairs_and_not_all() -> None:
    """Guards the test above: over the corpus the fast test clears most Q → DQ pairs, and not all neighbours."""
    pairs = neighbours = []
    for entry in ENTRIES:
        try:
            index = QuantIndex(load_model(entry.path))
        except ModelLoadError:
            continue
        table, rows = index.table, np.arange(len(index.table.rows))
        q, dq = np.array([(table.row_of[id(qt.quantize)], table.row_of[id(dq)]) for qt in index.qtensors
                          if qt.quantize is not None for dq in qt.dequantizes], dtype=np.int64).reshape(-1, 2).T
        pairs = np.concatenate([pairs, table.same_params(q, dq)])
        neighbours = np.concatenate([neighbours, table.same_params(rows[:-1], rows[1:])])
    assert pairs.size > 2000 and pairs.mean() > 0.9, (pairs.size, pairs.mean())
    assert 0 < neighbours.mean() < 0.9, neighbours.mean()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_scales_and_positions_read_from_the_columns_are_the_one_by_one_ones(entry: Entry, monkeypatch) -> None:
    """`scale_of` and `pos_of` (the NPU rules' operands) answer from `single_scale` where a row is decoded."""
    index = index_of(entry)
    fast = [(operands.scale_of(index, qt), operands.pos_of(index, qt)) for qt in index.qtensors]
    monkeypatch.setattr(ParamTable, "single_scale", lambda self, params: None)
    assert fast == [(operands.scale_of(index, qt), operands.pos_of(index, qt)) for qt in index.qtensors]


def test_most_corpus_scales_are_read_from_the_columns() -> None:
    """Guards the test above: `single_scale` answers for most values, power-of-two, other and not per-tensor
    scales among them."""
    answered, total, kinds = 0, 0, set()
    for entry in ENTRIES:
        try:
            index = QuantIndex(load_model(entry.path))
        except ModelLoadError:
            continue
        for qt in index.qtensors:
            scale = index.table.single_scale(index.params(qt.nodes[0]))
            total += 1
            if scale is not None:
                answered += 1
                kinds.add("not per-tensor" if math.isnan(scale) else "pow2" if pow2.is_pow2(scale) else "other")
    assert total > 2000 and answered / total > 0.9, (answered, total)
    assert kinds == {"not per-tensor", "pow2", "other"}


# The rules that look one by one only at rows a vectorised test did not clear.
PRETESTED = ("QDQ003", "QDQ004", "QDQ101", "QDQ201", "QDQ501", "QDQ502", "QDQ503", "QDQ504", "QDQ506")


@pytest.mark.parametrize("target", ["npu", "trt", "ort"])
def test_pretested_rules_report_what_they_report_looking_at_every_row(target: str, monkeypatch) -> None:
    """Each rule in PRETESTED, with its vectorised test turned off (every row looked at), reports the same."""
    rules = [(rule, cfg) for rule, cfg in load_target(target).enabled() if rule.code in PRETESTED]
    indexes = []
    for entry in ENTRIES:
        try:
            indexes.append(QuantIndex(load_model(entry.path)))
        except ModelLoadError:
            continue

    def reported() -> list[dict]:
        return [f.to_dict() for index in indexes for rule, cfg in rules
                for f in rule.check(CheckContext(model=index.model, index=index, params=cfg.params, severity=cfg.severity))]

    fast = reported()
    every_value = formats._values
    monkeypatch.setattr(formats, "_values", lambda ctx, look=None: every_value(ctx))
    monkeypatch.setattr(ParamTable, "per_tensor", lambda self: np.zeros(len(self.rows), dtype=bool))
    monkeypatch.setattr(ParamTable, "plain_shapes", lambda self: np.zeros(len(self.rows), dtype=bool))
    monkeypatch.setattr(ParamTable, "scalar_params", lambda self: np.zeros(len(self.rows), dtype=bool))
    monkeypatch.setattr(ParamTable, "same_params", lambda self, a, b: np.zeros(len(a), dtype=bool))
    assert len(fast) > 50 and reported() == fast


def test_a_replaced_row_is_read_again(builder, tmp_path) -> None:
    """After a fix swaps a node's scale, the index re-reads it and the column no longer answers for it."""
    x = builder.input("x", [1, 4])
    builder.output(builder.qdq(builder.qdq(x, 0.5, name="a"), 0.25, name="b"), [1, 4])
    index = QuantIndex(load_model(builder.save(tmp_path / "m.onnx")))
    table = index.table
    node = next(p.node for p in table.rows if p.node.name == "b_q")
    row = table.row_of[id(node)]
    assert table.scale.decoded.all() and index.params(node).scale == np.float32(0.25)
    assert table.single_scale(index.params(node)) == 0.25
    node.inputs[1] = ir.Constant("new_scale", np.array(0.125, np.float32))
    index.refresh(node)
    assert not table.scale.decoded[row] and index.params(node).scale == 0.125
    assert table.single_scale(index.params(node)) is None
    assert table.rows[row] is index.params(node)
    # The gap the forgotten row leaves does not shift its neighbours' answers.
    assert table.scale.every(pow2.exact).tolist() == [r != row for r in range(len(table.rows))]


def test_a_constant_replaced_in_place_is_not_read_from_the_columns(builder, tmp_path) -> None:
    """QDQ201 reshapes a scale constant in place: the column still holds the old bytes, so it must not answer."""
    builder.output(builder.qdq(builder.input("x", [1, 4]), 0.5, name="a"), [1, 4])
    table = QuantIndex(load_model(builder.save(tmp_path / "m.onnx"))).table
    params = table.rows[0]
    assert table.values_of(params, "scale") == np.float32(0.5) and table.single_scale(params) == 0.5
    params.scale_source.constant.values = np.array([0.25], np.float32)
    assert table.values_of(params, "scale") is None and table.single_scale(params) is None
