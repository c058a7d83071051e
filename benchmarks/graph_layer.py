"""qdq's graph layer against onnx-graphsurgeon's: reading a model, tidying it, writing it back.

    python benchmarks/graph_layer.py [--sizes 10000,100000] [--repeats 3] [--json FILE]

qdq holds graphs in its own representation (`qdq.graph.ir`); it used graphsurgeon's objects before.
For each size, a ladder model of `scale_models.py` is fixed for the NPU (the engine's fix,
without verification) and written to a ModelProto. Then, taking turns, each library reads that
proto into its graph (`qdq.graph.read.import_graph` / `gs.import_onnx`), drops dead nodes and
sorts (`qdq.graph.tidy.tidy` / `cleanup().toposort()`) and writes a ModelProto again
(`qdq.graph.write.export_model`, which reuses the read protobuf where nothing changed /
`gs.export_onnx`), each step timed with the garbage collector paused, as qdq runs them. Prints
JSON per size: nodes, changes, and per step the median seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from scale_models import ladder

from qdq.engine.fix import fix
from qdq.engine.ruleset import load_target
from qdq.graph.model import gc_paused, load_model, to_proto
from qdq.graph.read import import_graph
from qdq.graph.tidy import tidy
from qdq.graph.write import export_model

STEPS = ("read", "tidy", "write")


def _tidy_with_graphsurgeon(graph: gs.Graph) -> None:
    graph.cleanup().toposort()


# Per library: read a ModelProto into a graph, drop dead nodes and sort it, write it back.
LIBRARIES = {
    "qdq": (import_graph, tidy, export_model),
    "graphsurgeon": (gs.import_onnx, _tidy_with_graphsurgeon, lambda graph, proto: gs.export_onnx(graph)),
}


def timed_steps(read, clean, write, proto: onnx.ModelProto) -> dict[str, float]:
    """Seconds each step of one library takes on `proto`."""
    times = {}
    start = time.perf_counter()
    graph = read(proto)
    times["read"] = time.perf_counter() - start
    start = time.perf_counter()
    clean(graph)
    times["tidy"] = time.perf_counter() - start
    start = time.perf_counter()
    write(graph, proto)
    times["write"] = time.perf_counter() - start
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="node counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each library (default: 3)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="qdq-graph-") as folder:
            path = Path(folder) / f"ladder_{size}.onnx"
            onnx.save(ladder(size), str(path))
            model = load_model(path)
            changes = len(fix(model, load_target("npu")).changes)
            proto = to_proto(model)
        seconds: dict[str, dict[str, list[float]]] = {name: {step: [] for step in STEPS} for name in LIBRARIES}
        for _ in range(args.repeats):
            for name, steps in LIBRARIES.items():
                with gc_paused():
                    for step, took in timed_steps(*steps, proto).items():
                        seconds[name][step].append(took)
        row = {"nodes": len(proto.graph.node), "changes": changes}
        for step in STEPS:
            medians = {name: statistics.median(seconds[name][step]) for name in LIBRARIES}
            row.update({f"{name}_{step}_s": round(median, 3) for name, median in medians.items()})
            row[f"{step}_graphsurgeon_over_qdq"] = round(medians["graphsurgeon"] / medians["qdq"], 2)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
