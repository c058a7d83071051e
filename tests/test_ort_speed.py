"""Smoke test of benchmarks/ort_speed.py: its main path at a tiny size (no float training, 2 QAT
steps, one timing round), checking the printed table and the fusion counts the README quotes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from optional import torch_or_skip

pytest.importorskip("sklearn")  # the benchmark trains on scikit-learn's digits
torch_or_skip()  # and builds its networks in PyTorch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "ort_speed.py"
CONVS = {"resnet": 9, "yolo": 28}


def load_benchmark():
    spec = importlib.util.spec_from_file_location("ort_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ort_speed_tiny_run(tmp_path, capsys, monkeypatch):
    benchmark = load_benchmark()
    monkeypatch.setattr(benchmark, "WARMUP_RUNS", 1)
    load_data = benchmark.networks.load_data

    def small_test_split(*args, **kwargs):
        train_x, train_y, test_x, test_y = load_data(*args, **kwargs)
        return train_x, train_y, test_x[:40], test_y[:40]

    monkeypatch.setattr(benchmark.networks, "load_data", small_test_split)
    out = tmp_path / "results.json"
    benchmark.main(["--epochs", "0", "--qat-steps", "2", "--rounds", "1", "--runs", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.startswith("onnxruntime ")
    results = json.loads(out.read_text())["results"]
    assert [r["network"] for r in results] == ["resnet", "yolo"]
    for result in results:
        name, rows = result["network"], result["variants"]
        assert list(rows) == benchmark.VARIANTS
        assert f"== {name} (" in printed
        for variant, row in rows.items():
            assert any(line.startswith(f"{variant} ") for line in printed.splitlines())
            assert row["t1"]["ms"] > 0 and row["t2"]["ms"] > 0
            assert row["qlinear_conv"] + row["float_conv"] == CONVS[name]
        assert (rows["float"]["qlinear_conv"], rows["float"]["float_conv"]) == (0, CONVS[name])
        # The full fix fuses every Conv; the exact-only fix leaves the ConvBn fold (approximate) undone.
        assert rows["qat_fixed"]["qlinear_conv"] == CONVS[name]
        assert rows["qat_exact"]["qlinear_conv"] <= 1 and rows["qat"]["qlinear_conv"] <= 1
        assert result["fix"]["qat_fixed"]["remaining"] == {}
        assert result["verdict"]["every_conv_fused"]


def test_accuracy_over_seeds_trains_each_seed_apart(tmp_path, capsys, monkeypatch):
    benchmark = load_benchmark()
    load_data, splits = benchmark.networks.load_data, {}

    def small_test_split(channels, *args, seed=0, **kwargs):
        train_x, train_y, test_x, test_y = load_data(channels, *args, seed=seed, **kwargs)
        splits[seed] = test_y[:40]
        return train_x, train_y, test_x[:40], test_y[:40]

    monkeypatch.setattr(benchmark.networks, "load_data", small_test_split)
    monkeypatch.setattr(benchmark, "NETWORKS", ["resnet"])
    out = tmp_path / "seeds.json"
    results = benchmark.main(["--accuracy-seeds", "0,1", "--epochs", "0", "--qat-steps", "2", "--json", str(out)])
    rows = json.loads(out.read_text())["accuracy_over_seeds"]["resnet"]
    assert rows == results[0]["accuracy_over_seeds"] and [r["seed"] for r in rows] == [0, 1]
    assert all(r["images"] == 40 and 0 <= r["qat_fixed"] <= 1 for r in rows)
    assert not (splits[0] == splits[1]).all()  # each seed shuffles its own split
    printed = capsys.readouterr().out
    assert "== resnet: top-1 over training seeds" in printed and printed.count("\n   0 ") + printed.count("\n   1 ") == 2
