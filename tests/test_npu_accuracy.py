"""benchmarks/npu_accuracy.py's pairing with Quark: which samples a model loses and wins, and whether that is chance."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location(
    "npu_accuracy", Path(__file__).resolve().parent.parent / "benchmarks" / "npu_accuracy.py")
BENCH = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(BENCH)


def test_a_model_below_quark_on_many_samples_is_no_chance() -> None:
    quark = np.ones(40)
    model = quark.copy()
    model[:12] = 0  # 12 lines Quark reads and the model does not
    paired = BENCH.against(quark, model)
    assert (paired["worse"], paired["better"]) == (12, 0)
    assert paired["p"] < 0.001  # 2 / 2**12
    assert paired["ci95"][1] < 0  # in points, below Quark
    assert BENCH.against(model, quark)["better"] == 12  # the other way round: the model wins


def test_flips_both_ways_say_nothing() -> None:
    quark = np.array([1, 0, 1, 0, 1, 1.0])
    model = np.array([0, 1, 1, 0, 0.5, 1.0])  # a page's F1 counts as a flip too
    paired = BENCH.against(quark, model)
    assert (paired["worse"], paired["better"]) == (2, 1)
    assert paired["p"] == 1.0
    assert paired["ci95"][0] < 0 < paired["ci95"][1]
