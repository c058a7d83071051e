"""`qdq inspect-engine layer.json`: Q/DQ placement hazards in one TensorRT engine.

Exit 0: no hazard; 1: hazards found (standalone Q/DQ inside the network, reformats to or from INT8
or next to a Q/DQ or INT8 layer, Conv+Add with a float residual, float islands in an INT8 engine,
unfused BatchNorm/Scale); 2: bad input or usage. The Q of a network input and the DQ of a network
output are not hazards, nor are FP32/FP16 reformats and casts away from any Q/DQ: an FP16 engine
without Q/DQ exits 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qdq.commands.args import add_logging_args, emit
from qdq.commands.compare import load_engine
from qdq.reports.engine_text import render_inspection
from qdq.reports.json import dumps
from qdq.support.files import check_writable
from qdq.trt.diff import summary
from qdq.trt.hazards import find_hazards

EXIT_CLEAN, EXIT_HAZARDS = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect-engine",
        help="find Q/DQ placement hazards in one TensorRT engine's layer info",
        description="Read trtexec --exportLayerInfo JSON (and optionally --exportProfile) and report standalone "
        "Q/DQ reformats, float residuals, FP32/FP16 islands in an INT8 engine and the slowest layers, each with "
        "the qdq trt rule that fixes it. FP32/FP16 reformats and casts away from any Q/DQ or INT8 layer are not "
        "hazards (an FP16 engine without Q/DQ is clean). Exit 0: no hazard; 1: hazards; 2: bad input or usage.",
    )
    parser.add_argument("layer_info", type=Path, metavar="layer.json", help="trtexec --exportLayerInfo output")
    parser.add_argument("--profile", type=Path, metavar="FILE", help="trtexec --exportProfile output of the same engine")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="how many slowest layers to list (default: 10)")
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")
    group.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here instead of stdout")
    group.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are hazards")
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_writable(args.output, inputs=[p for p in (args.layer_info, args.profile) if p is not None])
    engine = load_engine(args.layer_info, args.profile)
    found = find_hazards(engine)
    if args.format == "json":
        timed = sorted((layer for layer in engine.layers if layer.time_ms), key=lambda layer: -layer.time_ms)
        document = {
            "version": 1, "tool": "qdq", "command": "inspect-engine", "engine": summary(engine),
            "notes": list(engine.notes),
            "hazards": [{"kind": h.kind, "layers": [layer.name for layer in h.layers], "message": h.message,
                         "rule": h.rule, "qdq_nodes": h.qdq_nodes, "time_ms": h.time_ms} for h in found],
            "slowest": [{"name": layer.name, "time_ms": layer.time_ms} for layer in timed[: args.top]],
        }
        emit(args.output, dumps(document))
    else:
        emit(args.output, render_inspection(engine, found, args.top))
    return EXIT_HAZARDS if found and not args.exit_zero else EXIT_CLEAN
