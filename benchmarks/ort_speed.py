"""How fast FX QAT models run on onnxruntime CPU before and after `qdq fix --target ort`.

For the ResNet- and YOLO-style networks of examples/networks.py (trained briefly on the digits
set) it builds, in one temporary folder:

- `float`: the float model;
- `qat`: the FX QAT export (symmetric int8, Conv → Div → BN kept) as exported;
- `qat_fixed`: `qat` after `qdq fix --target ort`, without calibration data;
- `qat_exact`: `qat` after `qdq fix --target ort --exact-only`;
- `ptq`: onnxruntime's `quantize_static` of the float model (uint8 activations, QDQ).

Then, in one process, it times all variants of a network interleaved round-robin (alternating the
order each round) at batch 1 with 1 and then 2 intra-op threads, and prints per variant the median
latency, its ratio to float and to PTQ, top-1 accuracy with onnxruntime's optimizations on and off,
logit SQNR against the float model, how many Convs onnxruntime fused into QLinearConv (read
from the optimized graph it writes with `optimized_model_filepath`), and per Conv how many adjacent
weight pairs can saturate the 16-bit pair sums of u8×s8 kernels without VNNI, over the raw input
range the test images give and over any input (`saturation`, onnx and numpy only).

    python benchmarks/ort_speed.py [--rounds 15] [--runs 100] [--epochs 2] [--qat-steps 60] [--json FILE]
    python benchmarks/ort_speed.py --accuracy-seeds 0,1,2,3,4,5    # top-1 only, per training seed
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))

import networks  # noqa: E402

from qdq.engine.fix import fix  # noqa: E402
from qdq.engine.lint import lint  # noqa: E402
from qdq.engine.ruleset import load_target  # noqa: E402
from qdq.graph.model import load_model, save_model  # noqa: E402
from qdq.verification.verify import compare_arrays  # noqa: E402

NETWORKS = ["resnet", "yolo"]
VARIANTS = ["float", "qat", "qat_fixed", "qat_exact", "ptq"]
THREADS = [1, 2]
FLOAT_CONVS = {"Conv", "FusedConv", "NhwcFusedConv", "NchwcConv"}
SATURATION_ROWS = 64
WARMUP_RUNS = 10


# --------------------------------------------------------------------------- building the variants


def build_variants(name: str, epochs: int, qat_steps: int, folder: Path, seed: int = 0) -> tuple[dict[str, Path], dict]:
    """Train, export, quantize and fix one network; the files by variant, and what the fix did."""
    data = networks.load_data(networks.INPUT_CHANNELS[name], seed=seed)
    model = networks.build(name, seed=seed, epochs=epochs, data=data)
    paths = {"float": networks.export_float(model, folder / f"{name}_float.onnx")}
    paths["ptq"] = networks.quantize_ort_default(
        paths["float"], folder / f"{name}_ptq.onnx", networks.calibration_batches(data))
    paths["qat"] = networks.fx_qat_export(model, data, folder / f"{name}_qat.onnx", qat_steps)
    target = load_target("ort")
    before = lint(load_model(paths["qat"]), target)
    report = {"findings_before": dict(Counter(f.code for f in before.findings))}
    for variant, exact_only in (("qat_fixed", False), ("qat_exact", True)):
        fixed = load_model(paths["qat"])
        result = fix(fixed, target, exact_only=exact_only)  # no calibration data
        paths[variant] = folder / f"{name}_{variant}.onnx"
        save_model(fixed, paths[variant])
        report[variant] = {"changes_by_rule": result.by_rule(), "converged": result.converged,
                           "remaining": dict(Counter(f.code for f in result.result.findings))}
    return {v: paths[v] for v in VARIANTS}, {"data": data, "fix": report}


# --------------------------------------------------------------------------- onnxruntime


def session(path: Path, threads: int = 1, optimized_file: Path | None = None) -> ort.InferenceSession:
    """A CPU session as timed: ORT_ENABLE_ALL, sequential, `threads` intra-op threads, 1 inter-op."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if optimized_file is not None:
        options.optimized_model_filepath = str(optimized_file)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def fused_ops(path: Path) -> dict:
    """QLinearConv and float Conv counts, and the other integer ops, in onnxruntime's optimized graph."""
    optimized = path.with_suffix(".optimized.onnx")
    session(path, optimized_file=optimized)
    ops = Counter(node.op_type for node in onnx.load(str(optimized)).graph.node)
    integer = {op: n for op, n in sorted(ops.items()) if op.startswith("QLinear") or op == "QGemm"}
    return {"qlinear_conv": ops["QLinearConv"], "float_conv": sum(ops[op] for op in FLOAT_CONVS),
            "integer_ops": {op: n for op, n in integer.items() if op != "QLinearConv"}}


def saturation(path: Path, x: np.ndarray) -> dict[str, tuple[int, int]]:
    """Per Conv, Gemm and MatMul with int8 weights, how many adjacent weight pairs can saturate a 16-bit pair sum
    (u8×s8 without VNNI): over the raw input range its input takes on `x` (one row at a time, the QAT
    batch of 1), and over every input the kernel can be given (0..255).

    Independent of qdq: the weights and grids are read with onnx alone. onnxruntime lays a Conv's
    reduction out as (kernel position, input channel), the channel fastest, a Gemm's along K, and
    a 2-D MatMul weight's along K too, and `pmaddubsw` adds products 0+1, 2+3, ... of it (checked on this
    CPU with one-hot weight pairs);
    an int8 input reaches the kernel 128 higher. Ops with uint8 weights run u8×u8, and depthwise
    Convs (one input and one output channel per group) another kernel: neither is listed.
    """
    proto = onnx.load(str(path))
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    constants.update({node.output[0]: onnx.numpy_helper.to_array(a.t) for node in proto.graph.node
                      if node.op_type == "Constant" for a in node.attribute if a.name == "value"})
    for node in proto.graph.node:  # exporters read qparams through Identity (in graph order)
        if node.op_type == "Identity" and node.input[0] in constants:
            constants[node.output[0]] = constants[node.input[0]]
    producer = {out: node for node in proto.graph.node for out in node.output}
    convs = []
    for node in proto.graph.node:
        dqs = [producer.get(name) for name in node.input[:2]]
        if node.op_type not in ("Conv", "Gemm", "MatMul") or any(dq is None or dq.op_type != "DequantizeLinear"
                                                                 for dq in dqs):
            continue
        integers = _weight_integers(dqs[1], constants, producer)
        input_type = _zero_point(dqs[0], constants).dtype
        attrs = {a.name: a.i for a in node.attribute}
        if integers is None or integers.dtype != np.int8 or input_type not in (np.uint8, np.int8) or \
                node.op_type == "Conv" and integers.shape[1] == 1 and integers.shape[0] == attrs.get("group", 1) or \
                node.op_type == "MatMul" and integers.ndim != 2:
            continue
        if node.op_type in ("Gemm", "MatMul"):  # B is [K, N], or [N, K] with transB
            rows = (integers if attrs.get("transB", 0) else integers.T).astype(np.int64)
        else:
            rows = np.moveaxis(integers.astype(np.int64), 1, -1).reshape(integers.shape[0], -1)
        convs.append((node.name, dqs[0].input[0], rows, 128 if input_type == np.int8 else 0))
    known = {o.name for o in proto.graph.output}
    for tensor in {c[1] for c in convs} - known:
        proto.graph.output.append(onnx.ValueInfoProto(name=tensor))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    runner = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in runner.get_outputs()]
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for row in x:
        for name, value in zip(names, runner.run(None, {runner.get_inputs()[0].name: row[None]})):
            if value.dtype in (np.uint8, np.int8):
                low[name] = min(low.get(name, 255), int(value.min()))
                high[name] = max(high.get(name, -128), int(value.max()))
    return {conv: (saturating_pairs(rows, low[tensor] + shift, high[tensor] + shift), saturating_pairs(rows, 0, 255))
            for conv, tensor, rows, shift in convs}


def _zero_point(dq: onnx.NodeProto, constants: dict[str, np.ndarray]) -> np.ndarray:
    return constants[dq.input[2]] if len(dq.input) > 2 and dq.input[2] else np.zeros((), np.uint8)


def _weight_integers(dq: onnx.NodeProto, constants: dict, producer: dict) -> np.ndarray | None:
    """The integers a weight DQ reads: stored, or what a Q makes of a float constant."""
    if dq.input[0] in constants:
        return constants[dq.input[0]]
    q = producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear" or q.input[0] not in constants:
        return None
    real, scale, zero_point = constants[q.input[0]], constants[q.input[1]], _zero_point(q, constants)
    axis = next((a.i for a in q.attribute if a.name == "axis"), 1)
    shape = [1] * real.ndim
    if scale.size > 1:
        shape[axis] = -1
    values = np.rint(real / scale.reshape(shape)) + zero_point.reshape(shape).astype(np.float64)
    return np.clip(values, -128, 127).astype(zero_point.dtype)


def saturating_pairs(rows: np.ndarray, low: int, high: int, limit: int = 32767) -> int:
    """How many adjacent weight pairs of rows [outputs, reduction] can sum past the 16-bit range with raw
    inputs in [low, high]: `pmaddubsw`'s w1 · x1 + w2 · x2, largest and least over the range."""
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), rows.dtype)], axis=1)
    first, second = rows[:, 0::2], rows[:, 1::2]
    largest = np.maximum(first * low, first * high) + np.maximum(second * low, second * high)
    least = np.minimum(first * low, first * high) + np.minimum(second * low, second * high)
    return int(np.count_nonzero((largest > limit) | (least < -limit - 1)))


def time_variants(paths: dict[str, Path], x: np.ndarray, threads: int, rounds: int, runs: int) -> dict[str, dict]:
    """Per variant: median ms over rounds, best round, and median per-round ratios to float and PTQ.

    Each round runs every variant `runs` times, in alternating order. Ratios are taken within a
    round and then the median over rounds, so load from other processes that drifts between
    rounds cancels out.
    """
    sessions = {v: session(p, threads) for v, p in paths.items()}
    feeds = {v: {s.get_inputs()[0].name: x} for v, s in sessions.items()}
    for v, s in sessions.items():
        for _ in range(WARMUP_RUNS):
            s.run(None, feeds[v])
    per_round: dict[str, list[float]] = {v: [] for v in sessions}
    order = list(sessions)
    for r in range(rounds):
        for v in (order if r % 2 == 0 else order[::-1]):
            s, feed, times = sessions[v], feeds[v], []
            for _ in range(runs):
                start = time.perf_counter()
                s.run(None, feed)
                times.append(time.perf_counter() - start)
            per_round[v].append(statistics.median(times) * 1e3)

    def ratio(v: str, base: str) -> float:
        return round(statistics.median(a / b for a, b in zip(per_round[v], per_round[base])), 3)

    return {v: {"ms": round(statistics.median(m), 4), "best_round_ms": round(min(m), 4),
                "x_float": ratio(v, "float"), "x_ptq": ratio(v, "ptq")} for v, m in per_round.items()}


# --------------------------------------------------------------------------- one network


def measure(name: str, epochs: int, qat_steps: int, rounds: int, runs: int, folder: Path) -> dict:
    start = time.perf_counter()
    paths, built = build_variants(name, epochs, qat_steps, folder)
    data = built["data"]
    test_x = data[2]
    logits = {variant: networks.predict_onnx(path, test_x) for variant, path in paths.items()}
    rows = {}
    for variant, path in paths.items():
        rows[variant] = {
            "accuracy": float((logits[variant].argmax(1) == data[3].numpy()).mean()),
            "accuracy_unoptimized": networks.accuracy(path, data, optimize=False),
            "sqnr_db_vs_float": sqnr(logits["float"], logits[variant]),
            "sqnr_db_vs_qat": sqnr(logits["qat"], logits[variant]),
            **fused_ops(path),
            "saturating_pairs": saturation(path, test_x[:SATURATION_ROWS].numpy()),
        }
    x = test_x[:1].numpy()
    for threads in THREADS:
        for variant, timed in time_variants(paths, x, threads, rounds, runs).items():
            rows[variant][f"t{threads}"] = timed
    return {"network": name, "fix": built["fix"], "variants": rows, "seconds": round(time.perf_counter() - start, 1)}


def accuracy_over_seeds(name: str, seeds: list[int], epochs: int, qat_steps: int, folder: Path) -> list[dict]:
    """Top-1 of the QAT export and of its fix, per training seed (split, initialisation and batches all change).

    Why: 360 test images put one image at 0.28 points, so a single network cannot tell a fix that
    costs accuracy from a seed that happens to favour one file; the same comparison over seeds can.
    """
    rows = []
    for seed in seeds:
        seed_folder = folder / f"{name}_seed{seed}"
        seed_folder.mkdir()
        paths, built = build_variants(name, epochs, qat_steps, seed_folder, seed)
        data = built["data"]
        row = {"seed": seed, "images": len(data[3])}
        for variant in ("qat", "qat_fixed"):
            row[variant] = networks.accuracy(paths[variant], data)
            row[f"{variant}_unoptimized"] = networks.accuracy(paths[variant], data, optimize=False)
        rows.append(row)
    return rows


def print_seeds(name: str, rows: list[dict]) -> None:
    print(f"\n== {name}: top-1 over training seeds (images the fix gains or loses against the QAT export)")
    print(f"{'seed':>4} {'QAT':>6} {'fixed':>6} {'±img':>5}   {'QAT noopt':>9} {'fixed noopt':>11} {'±img':>5}")
    for r in rows:
        gained = [round((r[f"qat_fixed{k}"] - r[f"qat{k}"]) * r["images"]) for k in ("", "_unoptimized")]
        print(f"{r['seed']:>4} {r['qat']:6.3f} {r['qat_fixed']:6.3f} {gained[0]:+5d}   {r['qat_unoptimized']:9.3f} "
              f"{r['qat_fixed_unoptimized']:11.3f} {gained[1]:+5d}")
    means = {k: statistics.mean(r[k] for r in rows) for k in ("qat", "qat_fixed", "qat_unoptimized", "qat_fixed_unoptimized")}
    print(f"mean {means['qat']:6.4f} {means['qat_fixed']:6.4f}         {means['qat_unoptimized']:9.4f} "
          f"{means['qat_fixed_unoptimized']:11.4f}")


def sqnr(reference: np.ndarray, candidate: np.ndarray) -> float | None:
    """Logit SQNR in dB; None for a model against itself."""
    if reference is candidate:
        return None
    return round(compare_arrays("logits", reference, candidate, atol=np.inf, rtol=0.0).sqnr_db, 2)


def verdict(result: dict) -> dict:
    """The acceptance test: fixed QAT no slower than PTQ at 1 thread, accuracy ≥ QAT, error against float at most
    1.06 × QAT's (SQNR at most 20·log10(1.06) = 0.51 dB lower), all Convs fused, no pair that can saturate."""
    rows = result["variants"]
    fixed, qat = rows["qat_fixed"], rows["qat"]
    return {
        "not_slower_than_ptq": fixed["t1"]["x_ptq"] <= 1.0,
        "accuracy_at_least_qat": fixed["accuracy"] >= qat["accuracy"],
        "accuracy_at_least_qat_unoptimized": fixed["accuracy_unoptimized"] >= qat["accuracy_unoptimized"],
        "error_at_most_1.06x_qat": bool(fixed["sqnr_db_vs_float"] >= qat["sqnr_db_vs_float"] - 20 * np.log10(1.06)),
        "every_conv_fused": fixed["float_conv"] == 0,
        "no_pair_can_saturate": not any(worst for _, worst in fixed["saturating_pairs"].values()),
    }


# --------------------------------------------------------------------------- output


def cpu_flags() -> list[str]:
    """The CPU's SIMD flags that decide onnxruntime's int8 kernels (VNNI: u8×s8 without saturation)."""
    wanted = {"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(wanted.intersection(flags))


def header(args: argparse.Namespace) -> dict:
    flags = cpu_flags()
    return {
        "onnxruntime": ort.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
        "cpu_flags": flags, "vnni": any("vnni" in f for f in flags),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "rounds": args.rounds, "runs": args.runs, "epochs": args.epochs, "qat_steps": args.qat_steps,
    }


def print_report(head: dict, results: list[dict]) -> None:
    print(f"onnxruntime {head['onnxruntime']}, {head['cpus']} CPUs, flags: {' '.join(head['cpu_flags']) or 'none'}"
          f" (VNNI: {'yes' if head['vnni'] else 'no'}), load average at start {head['load_average']}")
    print(f"{head['rounds']} rounds × {head['runs']} runs per variant, batch 1, ORT_ENABLE_ALL, sequential, "
          f"inter-op 1; float epochs {head['epochs']}, QAT steps {head['qat_steps']}")
    print("ms = median of per-round medians, best = lowest round, ×float/×PTQ = median of per-round ratios; "
          "dB/flt, dB/qat = logit SQNR against float, qat; noopt = top-1 without graph optimizations")
    for result in results:
        fix_report = result["fix"]
        print(f"\n== {result['network']} ({result['seconds']} s)")
        print(f"lint before: {fix_report['findings_before']}")
        for variant in ("qat_fixed", "qat_exact"):
            r = fix_report[variant]
            print(f"{variant}: changes by rule {r['changes_by_rule']}; lint after: {r['remaining'] or 'clean'}")
        print(f"{'variant':<14} {'top-1':>6} {'noopt':>6} {'dB/flt':>7} {'dB/qat':>7} "
              f"{'t1 ms':>7} {'best':>7} {'×float':>6} {'×PTQ':>5} {'t2 ms':>7} {'best':>7} {'×float':>6} {'×PTQ':>5}"
              f"  QLinearConv/Conv  other integer ops")
        for variant, r in result["variants"].items():
            decibels = ["–" if r[k] is None else f"{r[k]:.2f}" for k in ("sqnr_db_vs_float", "sqnr_db_vs_qat")]
            timings = " ".join(f"{t['ms']:7.4f} {t['best_round_ms']:7.4f} {t['x_float']:6.2f} {t['x_ptq']:5.2f}"
                               for t in (r["t1"], r["t2"]))
            others = ", ".join(f"{op} {n}" for op, n in r["integer_ops"].items()) or "–"
            print(f"{variant:<14} {r['accuracy']:6.3f} {r['accuracy_unoptimized']:6.3f} {decibels[0]:>7} "
                  f"{decibels[1]:>7} {timings}  {r['qlinear_conv']:>5} / {r['float_conv']:<9} {others}")
        print("adjacent weight pairs that can saturate 16-bit sums (u8×s8 without VNNI), per Conv/Gemm with int8 weights: "
              "over the raw input range of the test images / over any input:")
        for variant, r in result["variants"].items():
            for which, label in ((0, "test images"), (1, "any input")):
                at_risk = {conv: n[which] for conv, n in r["saturating_pairs"].items() if n[which]}
                print(f"  {variant:<12} {label:<11} {sum(at_risk.values()):4d} in {len(at_risk)} of "
                      f"{len(r['saturating_pairs'])} Convs/Gemms"
                      + (f": {', '.join(f'{c} {n}' for c, n in at_risk.items())}" if at_risk and which == 0 else ""))
        checks = result["verdict"]
        print("done-when (qat_fixed): " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in checks.items()))
    print(f"\nload average at end {[round(v, 2) for v in os.getloadavg()]}")
    if not head["vnni"]:
        print("\nNo VNNI: onnxruntime's u8×s8 kernels (vpmaddubsw) saturate pairs of products at int16, so fused "
              "models can lose accuracy with optimizations on ('top-1') that they keep with them off ('noopt'); "
              "in qat_fixed, QDQ508 narrows the weight grid of the output channels that could saturate (uint8 weights "
              "for a Conv reading one channel), so none can.")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timing rounds per thread count")
    parser.add_argument("--runs", type=int, default=100, help="runs per variant in each round")
    parser.add_argument("--epochs", type=int, default=2, help="float training epochs per network")
    parser.add_argument("--qat-steps", type=int, default=60, help="FX QAT training batches")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--accuracy-seeds", metavar="S,S,...",
                        help="instead of timing: top-1 of the QAT export and its fix for each of these training seeds")
    args = parser.parse_args(argv)
    head = header(args)
    if args.accuracy_seeds:
        seeds = [int(s) for s in args.accuracy_seeds.split(",")]
        with tempfile.TemporaryDirectory(prefix="qdq-ort-seeds-") as folder:
            by_network = {name: accuracy_over_seeds(name, seeds, args.epochs, args.qat_steps, Path(folder))
                          for name in NETWORKS}
        for name, rows in by_network.items():
            print_seeds(name, rows)
        if args.json:
            args.json.write_text(json.dumps({"header": head, "accuracy_over_seeds": by_network}, indent=2) + "\n")
        return [{"network": name, "accuracy_over_seeds": rows} for name, rows in by_network.items()]
    with tempfile.TemporaryDirectory(prefix="qdq-ort-speed-") as folder:
        results = [measure(name, args.epochs, args.qat_steps, args.rounds, args.runs, Path(folder))
                   for name in NETWORKS]
    for result in results:
        result["verdict"] = verdict(result)
    print_report(head, results)
    if args.json:
        args.json.write_text(json.dumps({"header": head, "results": results}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
