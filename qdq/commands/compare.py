"""`qdq compare A.json B.json`: what differs between a reference engine and a candidate, and why.

A and B are `trtexec --exportLayerInfo` files (A: PTQ, FP16 or a good QAT engine; B: the QAT
engine under study). TensorRT 11 builds no PTQ engine: A may be an FP16 engine of the float model,
or, with `--expect MODEL.onnx`, the layout a rule set predicts from the ONNX (`qdq.trt.expected`;
exit 1 where a predicted count differs from the engine's). Exit 0: no --fail-on condition met; 1: a condition met, or --fail-on given and
A and B look like different networks (a gate must not pass on a comparison that means nothing);
2: bad input or usage. Differences alone never fail: FP16 against FP32 differs, and that is no finding.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qdq.commands.args import UsageError, add_logging_args, emit, log
from qdq.engine.ruleset import load_target
from qdq.reports import engine_html, engine_text
from qdq.reports.json import dumps
from qdq.support.files import check_writable
from qdq.trt import expected
from qdq.trt.diff import Comparison, compare
from qdq.trt.layers import Engine, load_layer_info
from qdq.trt.onnx_map import OnnxMapping, map_to_onnx
from qdq.trt.profile import attach_profile, load_profile

EXIT_CLEAN, EXIT_FAILED = 0, 1
CONDITIONS = {
    "qdq-reformat": "a standalone Q/DQ layer only in B",
    "reformat": "a Q/DQ or reformat layer only in B",
    "precision": "a layer INT8 in A but float in B",
    "fusion": "a fusion of A split in B",
    "layers": "B has more layers than A (NoOp/Constant not counted)",
    "slower=PCT": "B's summed averageMs exceeds A's by more than PCT percent (needs both profiles)",
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare",
        help="compare two TensorRT engines' layer info (reference A, candidate B)",
        description="Align the layers of two engines of one network (trtexec --exportLayerInfo JSON), report "
        "Q/DQ and reformat layers only in B, precision changes, split fusions and time differences by network "
        "region, and map each to the qdq trt rule that fixes it where a Q/DQ or INT8 layer is involved. When too "
        "few layers pair (different networks) the differences are listed without rules. Exit 0: no --fail-on "
        "condition met; 1: a condition met, or --fail-on given and A and B look like different networks; 2: bad "
        "input or usage. With --expect MODEL.onnx (no reference engine, as on TensorRT 11), one engine is set "
        "against the layout the --target rule set predicts from the ONNX; exit 1 where a count differs.",
    )
    parser.add_argument("engines", type=Path, nargs="+", metavar="ENGINE.json",
                        help="reference engine layer info (PTQ, FP16 or good QAT) and candidate (the QAT engine); "
                        "with --expect, the candidate only")
    parser.add_argument("--expect", type=Path, metavar="MODEL.onnx",
                        help="no reference engine (TensorRT 11 builds no implicit-INT8 one): compare the candidate with "
                        "the layout --target predicts from this ONNX model (INT8 weighted layers, standalone Q/DQ)")
    parser.add_argument("--target", default="trt11", metavar="NAME",
                        help="rule set that predicts the layout for --expect (default: trt11)")
    parser.add_argument("--profile-a", type=Path, metavar="FILE", help="trtexec --exportProfile output of A")
    parser.add_argument("--profile-b", type=Path, metavar="FILE", help="trtexec --exportProfile output of B")
    parser.add_argument("--onnx", type=Path, metavar="B.onnx", help="the ONNX model B was built from: tie each "
                        "difference to its Q/DQ nodes and lint findings")
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=("text", "json", "html"), default="text", help="report format (default: text)")
    group.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here instead of stdout")
    group.add_argument("--fail-on", metavar="CONDITIONS",
                       help="comma-separated: " + ", ".join(f"{k} ({v})" for k, v in CONDITIONS.items()))
    add_logging_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.expect is not None:
        return run_expected(args)
    if len(args.engines) != 2:
        raise UsageError("compare needs two engine files, A.json and B.json (or one with --expect MODEL.onnx)")
    args.a, args.b = args.engines
    conditions = parse_fail_on(args.fail_on)
    inputs = [p for p in (args.a, args.b, args.profile_a, args.profile_b, args.onnx) if p is not None]
    if args.output is not None:
        check_writable(args.output, inputs=inputs)
    a = load_engine(args.a, args.profile_a)
    b = load_engine(args.b, args.profile_b)
    if "slower" in conditions and not (a.has_times and b.has_times):
        raise UsageError("--fail-on slower needs --profile-a and --profile-b")
    log.info("comparing %s (%d layers) with %s (%d layers)", args.a, len(a.layers), args.b, len(b.layers))
    comparison = compare(a, b)
    mapping = map_to_onnx(comparison, args.onnx) if args.onnx is not None else None
    failed = check_fail_on(comparison, conditions)
    emit(args.output, render(comparison, mapping, failed, args.format))
    return EXIT_FAILED if failed else EXIT_CLEAN


def run_expected(args: argparse.Namespace) -> int:
    """One engine against the layout the rule set predicts from the ONNX: exit 1 where a count differs."""
    if len(args.engines) != 1:
        raise UsageError("with --expect, give one engine file (the one built from MODEL.onnx)")
    if args.fail_on or args.onnx or args.profile_a or args.format == "html":
        raise UsageError("--expect reports counts as text or JSON; --fail-on, --onnx, --profile-a and html do not apply")
    if args.output is not None:
        check_writable(args.output, inputs=[args.engines[0], args.expect])
    ruleset = load_target(args.target)
    engine = load_engine(args.engines[0], args.profile_b)
    report = expected.compare_layout(expected.predict(args.expect, ruleset), engine, ruleset)
    emit(args.output, dumps(report) if args.format == "json" else expected.render_text(report))
    return EXIT_FAILED if any(row["match"] is False for row in report["rows"]) else EXIT_CLEAN


def load_engine(path: Path, profile: Path | None) -> Engine:
    engine = load_layer_info(path)
    if profile is not None:
        attach_profile(engine, load_profile(profile), profile)
    return engine


def render(comparison: Comparison, mapping: OnnxMapping | None, failed: list[str], fmt: str) -> str:
    if fmt == "json":
        document = comparison.to_dict()
        document["onnx"] = mapping.to_dict() if mapping else None
        document["failed"] = failed
        return dumps(document)
    if fmt == "html":
        return engine_html.render(comparison, mapping, failed)
    return engine_text.render_comparison(comparison, mapping, failed)


def parse_fail_on(text: str | None) -> dict[str, float | None]:
    """`qdq-reformat,slower=5` -> {"qdq-reformat": None, "slower": 5.0}."""
    conditions: dict[str, float | None] = {}
    for item in (text or "").split(","):
        name, _, value = item.strip().partition("=")
        if not name:
            continue
        if name == "slower":
            try:
                conditions[name] = float(value)
            except ValueError:
                raise UsageError(f"--fail-on slower={value}: give a percentage, e.g. slower=5") from None
        elif name in CONDITIONS and not value:
            conditions[name] = None
        else:
            raise UsageError(f"--fail-on: unknown condition {item.strip()!r} (use {', '.join(CONDITIONS)})")
    return conditions


def check_fail_on(comparison: Comparison, conditions: dict[str, float | None]) -> list[str]:
    """The conditions met, each as a short sentence for the report; with different networks, only that."""
    if conditions and not comparison.same_network:
        paired, larger = comparison.compute_pairing()
        return [f"different networks: only {paired} of {larger} compute layers pair"]
    n = comparison.breakdown()
    counts = {
        "qdq-reformat": n["qdq_only_in_b"],
        "reformat": n["qdq_only_in_b"] + n["reformats_only_in_b"],
        "precision": n["lost_int8"],
        "fusion": n["split_fusions"],
    }
    failed = [f"{name}: {counts[name]}" for name in counts if name in conditions and counts[name]]
    totals = comparison.totals()
    if "layers" in conditions and totals["b"]["layers_without_noops"] > totals["a"]["layers_without_noops"]:
        failed.append(f"layers: {totals['a']['layers_without_noops']} -> {totals['b']['layers_without_noops']}")
    if "slower" in conditions:
        ta, tb = totals["a"]["total_ms"], totals["b"]["total_ms"]
        if ta and 100 * (tb - ta) / ta > conditions["slower"]:
            failed.append(f"slower: B takes {100 * (tb - ta) / ta:+.1f} % (limit {conditions['slower']:g} %)")
    return failed
