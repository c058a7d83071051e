"""How long saving takes to turn a fixed graph back into a ModelProto: qdq's exporter against gs.export_onnx.

    python benchmarks/export.py [--sizes 10000,100000] [--repeats 3] [--json FILE]

For each size, a ladder model of `scale_models.py` is loaded and fixed for the NPU in this process
(the engine's fix, without verification); then the two exports of the same fixed graph take
turns, each timed with the garbage collector paused as `save_model` runs it: qdq's
(`qdq.graph_export.export_model`, which reuses the loaded protobuf where nothing changed) and
`gs.export_onnx` as qdq used it before (`export_with_graphsurgeon`). Prints JSON per size:
nodes, changes, the median seconds of each and their ratio. `to_proto` is this export plus
settling the Q/DQ output types, which is the same either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import onnx
from scale_models import ladder

from qdq.fix import fix
from qdq.graph_export import export_model, export_with_graphsurgeon
from qdq.model import gc_paused, load_model, to_proto
from qdq.ruleset import load_target

EXPORTS = {"qdq": export_model, "graphsurgeon": export_with_graphsurgeon}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="node counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed exports of each kind (default: 3)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="qdq-export-") as folder:
            path = Path(folder) / f"ladder_{size}.onnx"
            onnx.save(ladder(size), str(path))
            model = load_model(path)
            changes = len(fix(model, load_target("npu")).changes)
            to_proto(model)  # settles the Q/DQ output types once, as saving does before either export
            seconds: dict[str, list[float]] = {name: [] for name in EXPORTS}
            for _ in range(args.repeats):
                for name, export in EXPORTS.items():
                    with gc_paused():
                        start = time.perf_counter()
                        export(model.graph, model.proto)
                        seconds[name].append(time.perf_counter() - start)
        row = {"nodes": len(model.graph.nodes), "changes": changes,
               **{f"{name}_s": round(statistics.median(times), 3) for name, times in seconds.items()}}
        row["graphsurgeon_over_qdq"] = round(row["graphsurgeon_s"] / row["qdq_s"], 2)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
