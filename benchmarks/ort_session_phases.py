"""Where onnxruntime spends the time of creating a session: the floor under every `qdq fix`.

    python benchmarks/ort_session_phases.py MODEL... [--config KEY=VALUE ...] [--json FILE]

Each model is opened as qdq's check of a written file opens it (CPU, graph optimisations off), in
a fresh process with onnxruntime's verbose log on; the phases are the gaps between the log lines
that open and close them, by their timestamps. A phase whose lines this onnxruntime version does
not print is left out, and the rest of the time is "other". `--config` adds session config
entries, to see what one changes (e.g. `session.disable_quant_qdq=1`, which skips
EnsureUniqueDQForNodeUnit: qdq's check keeps it, since every session a user creates runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

# Phase name -> (log text that opens it, log text that closes it), in onnxruntime 1.31's words.
PHASES = {
    "reading and resolving the graph": ("ConstructorCommon", "Initializing session."),
    "EnsureUniqueDQForNodeUnit": ("AOT Inlining", "EnsureUniqueDQForNodeUnit modified"),
    "transformers and placement": ("EnsureUniqueDQForNodeUnit modified", "All nodes placed on"),
    "allocation planning": ("Use DeviceBasedPartition", "Saving initialized tensors."),
    "initializers": ("Saving initialized tensors.", "Done saving initialized tensors"),
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\d* \[")
SESSION = """
import sys, onnxruntime as ort
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
options.log_severity_level = 0
for entry in sys.argv[2:]:
    options.add_session_config_entry(*entry.split("=", 1))
ort.set_default_logger_severity(0)
ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", type=Path, nargs="+")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a session config entry (repeatable)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the phases as JSON")
    args = parser.parse_args(argv)
    results = {}
    for model in args.models:
        log = subprocess.run([sys.executable, "-c", SESSION, str(model), *args.config],
                             capture_output=True, text=True, check=True).stderr
        results[str(model)] = phases(log)
        print(render(model, results[str(model)]))
    if args.json is not None:
        args.json.write_text(json.dumps({"config": args.config, "seconds": results}, indent=2) + "\n")
    return 0


def phases(log: str) -> dict[str, float]:
    """Seconds per phase found in the log, "other" for the rest, and "total" from first line to last."""
    lines = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp(), line)
             for line in log.splitlines() if (m := STAMP.match(line))]
    seconds: dict[str, float] = {}
    for phase, (opens, closes) in PHASES.items():
        start = next((t for t, line in lines if opens in line), None)
        end = next((t for t, line in lines if closes in line and start is not None and t >= start), None)
        if start is not None and end is not None:
            seconds[phase] = end - start
    total = lines[-1][0] - lines[0][0] if lines else 0.0
    seconds["other"] = max(total - sum(seconds.values()), 0.0)
    seconds["total"] = total
    return seconds


def render(model: Path, seconds: dict[str, float]) -> str:
    rows = [f"{model}: {seconds['total']:.2f} s"]
    rows += [f"  {phase:<34} {value:7.2f} s" for phase, value in seconds.items() if phase != "total"]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
