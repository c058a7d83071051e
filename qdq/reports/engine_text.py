"""Terminal reports of `qdq compare` and `qdq inspect-engine`."""

from __future__ import annotations

from collections import Counter

from qdq.trt.diff import Comparison, summary
from qdq.trt.hazards import RULES, Hazard
from qdq.trt.layers import UNKNOWN_VERSION, Engine
from qdq.trt.onnx_map import OnnxMapping


def render_comparison(comparison: Comparison, mapping: OnnxMapping | None, failed: list[str]) -> str:
    a, b = comparison.a, comparison.b
    lines = [f"A (reference): {a.path}  [{tensorrt(a)}]", f"B (candidate): {b.path}  [{tensorrt(b)}]", ""]
    lines += _totals_table(comparison)
    lines.append("")
    # Notes first: they say how far the differences below can be trusted.
    notes = comparison.notes + (mapping.notes if mapping else [])
    lines += [f"note: {note}" for note in notes] + ([""] if notes else [])
    diffs = comparison.differences
    if not diffs:
        lines.append("No differences in Q/DQ or reformat layers, precisions or fusions.")
    else:
        lines.append("Differences by network region (B against A):")
        by_region = {row["region"]: row for row in comparison.regions()}
        region = None
        for diff in diffs:
            if diff.region != region:
                region = diff.region
                lines.append(f"  {region}{_region_time(by_region[region], comparison)}")
            delta = diff.delta_ms
            time = f"  ({delta:+.4f} ms)" if delta is not None and _timed(comparison) else ""
            rule = f"  -> {diff.rule}" if diff.rule else ""
            lines.append(f"    {diff.kind:<9} {diff.message}{time}{rule}")
            for finding in diff.findings:
                lines.append(f"              lint {finding['code']} {finding['node'] or ''}: {finding['message']}")
    lines.append("")
    lines.append(_summary(comparison))
    lines += _next_step(comparison, mapping)
    if failed:
        lines.append("Failed --fail-on: " + "; ".join(failed))
    return "\n".join(lines) + "\n"


def _totals_table(comparison: Comparison) -> list[str]:
    sa, sb = summary(comparison.a), summary(comparison.b)
    rows = [("layers (without NoOp/Constant)", sa["layers_without_noops"], sb["layers_without_noops"]),
            ("standalone Q/DQ layers", sa["qdq_layers"], sb["qdq_layers"]),
            ("reformat layers", sa["reformat_layers"], sb["reformat_layers"])]
    if sa["int8_layers"] is not None and sb["int8_layers"] is not None:
        rows.append(("INT8 compute layers", sa["int8_layers"], sb["int8_layers"]))
    lines = [f"  {'':<32}{'A':>10}{'B':>10}{'B - A':>10}"]
    lines += [f"  {label:<32}{x:>10}{y:>10}{y - x:>+10}" for label, x, y in rows]
    if _timed(comparison):
        ta, tb = sa["total_ms"], sb["total_ms"]
        pct = f" ({100 * (tb - ta) / ta:+.1f} %)" if ta else ""
        lines.append(f"  {'time, sum of averageMs (ms)':<32}{ta:>10.4f}{tb:>10.4f}{tb - ta:>+10.4f}{pct}")
    lines.append(f"  {comparison.totals()['paired']} layers paired")
    return lines


def _region_time(row: dict, comparison: Comparison) -> str:
    if not _timed(comparison):
        return ""
    return f"  (A {row['a_ms']:.4f} ms, B {row['b_ms']:.4f} ms, {row['b_ms'] - row['a_ms']:+.4f} ms)"


def _timed(comparison: Comparison) -> bool:
    return comparison.a.has_times and comparison.b.has_times


def _summary(comparison: Comparison) -> str:
    n = comparison.breakdown()
    parts = [f"{n['qdq_only_in_b']} standalone Q/DQ layer(s) only in B", f"{n['reformats_only_in_b']} reformat(s) only in B",
             f"{n['lost_int8']} layer(s) with an INT8 input or output in A that is float in B "
             f"({n['float_residual']} Conv+Add with a float residual)",
             f"{n['split_fusions']} fusion(s) of A split in B",
             f"{n['only_in_a']} non-NoOp layer(s) only in A"]
    if n["gained_int8"]:
        parts.append(f"{n['gained_int8']} layer(s) float in A but INT8 in B")
    if n["other_precision"]:
        parts.append(f"{n['other_precision']} layer(s) with other data types and no INT8 on either side (e.g. FP32 -> FP16)")
    return "Summary: " + ", ".join(parts) + "."


def _next_step(comparison: Comparison, mapping: OnnxMapping | None) -> list[str]:
    rules = Counter(d.rule for d in comparison.differences if d.rule)
    if not rules:
        return []
    lines = ["Q/DQ placement rules of the trt set that address these differences:"]
    lines += [f"  {code} x{n}: {RULES[code]}" for code, n in sorted(rules.items())]
    onnx = str(mapping.model) if mapping else "<B.onnx>"
    if mapping is not None:
        lines.append(f"{onnx}: {mapping.findings} lint finding(s) with rule set '{mapping.target}'; "
                     f"attached to differences: {', '.join(mapping.addressed) or 'none'}")
    lines.append(f"Next: run `qdq fix --target trt {onnx} -o fixed.onnx`, rebuild the engine and compare again.")
    return lines


def render_inspection(engine: Engine, found: list[Hazard], top: int) -> str:
    s = summary(engine)
    lines = [f"{engine.path}  [{tensorrt(engine)}, {'detailed' if engine.detailed else 'names only'}]",
             f"  {s['layers_without_noops']} layers (+{s['layers'] - s['layers_without_noops']} NoOp/Constant), "
             f"{s['qdq_layers']} standalone Q/DQ, {s['reformat_layers']} reformats"
             + (f", {s['int8_layers']} INT8 compute layers" if s["int8_layers"] is not None else "")
             + (f", {s['total_ms']:.4f} ms summed averageMs" if s["total_ms"] is not None else "")]
    lines += [f"note: {note}" for note in engine.notes]
    if not engine.detailed:
        lines.append("note: names-only layer info: only Q/DQ and reformat layers by name are checked; rebuild with "
                     "--profilingVerbosity=detailed for precisions")
    if not engine.quantized:
        lines.append("note: no Q/DQ or INT8 layer: a float engine; its reformats and casts between float types are "
                     "TensorRT's precision choices, not Q/DQ hazards")
    lines.append("")
    if found:
        lines.append("Hazards:")
        for hazard in found:
            time = f"  ({hazard.time_ms:.4f} ms)" if hazard.time_ms is not None else ""
            rule = f"  -> {hazard.rule}" if hazard.rule else ""
            where = "" if hazard.kind == "float-island" else f"{hazard.layers[0].name}: "
            lines.append(f"  {hazard.kind:<14} {where}{hazard.message}{time}{rule}")
    else:
        lines.append("No hazards: no standalone Q/DQ inside the network, no float residuals, no float islands.")
    timed = sorted((layer for layer in engine.layers if layer.time_ms), key=lambda layer: -layer.time_ms)[:top]
    if timed:
        total = engine.total_ms() or 1.0
        lines += ["", f"Slowest {len(timed)} layers:"]
        lines += [f"  {layer.time_ms:9.4f} ms {100 * layer.time_ms / total:5.1f} %  {layer.name}" for layer in timed]
    counts = Counter(h.kind for h in found)
    lines += ["", "Summary: " + (", ".join(f"{n} {kind}" for kind, n in counts.items()) or "clean")]
    return "\n".join(lines) + "\n"


def tensorrt(engine: Engine) -> str:
    """`TensorRT 8.2`, or `TensorRT version unknown` for a file whose keys do not tell it."""
    return "TensorRT version unknown" if engine.version == UNKNOWN_VERSION else f"TensorRT {engine.version}"
