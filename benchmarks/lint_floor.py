"""How low `qdq lint` can go on one model: what lint pays before any rule runs, next to the least
any reader of the graph pays in Python.

    python benchmarks/lint_floor.py MODEL [--repeats 5] [--json FILE]

In one process, with the cyclic collector off as in the `qdq` command, medians over repeats:
- `onnx.load` of the file, and `onnx.save` of what it read (the two halves of `scale.py`'s baseline,
  without the interpreter's start and `import onnx`, which every command pays alike);
- the floor of a table read: every node's op, inputs and outputs read from the protobuf into
  integer ids, and the CSR arrays (inputs and consumers per tensor, producer per tensor) built
  with numpy. This is the least that any reader of the graph does in Python;
- what `qdq lint` does before its first rule: reading and checking the file (`load_model`, the
  ONNX checker in a second process at this size), building qdq's graph, and indexing its Q/DQ nodes.

What lint may spend on rules and the report, for a target ratio R to load+save, is R times the
baseline less the non-rule phases; the script prints it for issue 17's R = 4.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's qdq, not an installed copy

from qdq.graph.model import load_model  # noqa: E402
from qdq.quant.index import QuantIndex  # noqa: E402
from qdq.support import progress  # noqa: E402

LINT_RATIO = 4.0  # issue 17
# Interpreter start and `import onnx`, paid by the baseline command and by `qdq lint` alike; qdq's own
# imports come on top (about 0.1 s once byte-compiled).
PROCESS_START = "process start (python -c 'import onnx')"


def table_read(proto: onnx.ModelProto) -> int:
    """Every node's op and tensors as integer ids, and the CSR arrays a columnar table holds; the number of tensors."""
    ids: dict[str, int] = {initializer.name: i for i, initializer in enumerate(proto.graph.initializer)}
    ops: dict[str, int] = {}
    op_ids, inputs, input_counts, outputs, output_counts = [], [], [], [], []
    number = ids.setdefault
    for node in proto.graph.node:
        op_ids.append(ops.setdefault(node.op_type, len(ops)))
        read = [number(name, len(ids)) for name in node.input]
        written = [number(name, len(ids)) for name in node.output]
        inputs += read
        input_counts.append(len(read))
        outputs += written
        output_counts.append(len(written))
    nodes = np.arange(len(op_ids))
    read_by = np.repeat(nodes, input_counts)
    order = np.argsort(np.asarray(inputs, dtype=np.int64), kind="stable")
    consumers = read_by[order]
    consumer_start = np.searchsorted(np.asarray(inputs, dtype=np.int64)[order], np.arange(len(ids) + 1))
    producer = np.full(len(ids), -1, dtype=np.int64)
    producer[np.asarray(outputs, dtype=np.int64)] = np.repeat(nodes, output_counts)
    assert consumers.size == len(inputs) and consumer_start[-1] == len(inputs)
    return len(ids)


def one_run(model: Path) -> dict[str, float]:
    seconds: dict[str, float] = {}
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        proto = onnx.load(str(model), load_external_data=False)
        seconds["onnx.load"] = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            onnx.save(proto, str(Path(folder) / "copy.onnx"))
            seconds["onnx.save"] = time.perf_counter() - start
        start = time.perf_counter()
        table_read(proto)
        seconds["table read (the floor)"] = time.perf_counter() - start
        with progress.timed() as steps:
            loaded = load_model(model)
            progress.step("indexing the Q/DQ nodes")
            QuantIndex(loaded)
            progress.step("done")
        for text, duration in steps:
            if text.startswith("reading") or text.startswith("checking"):
                phase = "qdq: reading and checking"
            elif text.startswith("building"):
                phase = "qdq: building the graph"
            elif text.startswith("indexing"):
                phase = "qdq: indexing the Q/DQ nodes"
            else:
                continue
            seconds[phase] = seconds.get(phase, 0.0) + duration
    finally:
        gc.enable()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the medians as JSON")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs = [one_run(args.model) for _ in range(args.repeats)]
    medians = {phase: statistics.median(run[phase] for run in runs) for phase in runs[0]}
    medians[PROCESS_START] = statistics.median(process_start() for _ in range(args.repeats))
    baseline = medians[PROCESS_START] + medians["onnx.load"] + medians["onnx.save"]
    before_rules = medians[PROCESS_START] + sum(s for phase, s in medians.items() if phase.startswith("qdq:"))
    print(f"{args.model}: medians of {args.repeats} ({time.perf_counter() - start:.0f} s in all)")
    for phase, s in medians.items():
        print(f"  {phase:<52} {s:7.3f} s")
    print(f"  {'baseline (process start, load, save)':<52} {baseline:7.3f} s")
    print(f"  {'lint before its first rule':<52} {before_rules:7.3f} s ({before_rules / baseline:.1f}x the baseline)")
    print(f"  {f'left for the rules and the report at {LINT_RATIO:g}x':<52} {LINT_RATIO * baseline - before_rules:7.3f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({"model": str(args.model), "repeats": args.repeats, "seconds": medians,
                                         "baseline": baseline, "before_rules": before_rules}, indent=2) + "\n")
    return 0


def process_start() -> float:
    """Seconds for a fresh interpreter to import onnx and exit."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import onnx"], check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
