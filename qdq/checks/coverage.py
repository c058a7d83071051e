"""QDQ006: quantization qdq does not read.

qdq checks and rewrites QuantizeLinear/DequantizeLinear. A model that quantizes with anything else
(QONNX's `Quant`, a vendor's own quantize op, integer kernels with their own scales) holds
quantization none of the other rules sees, so it must never read as clean: a CI gate would pass a
model qdq never read. Which ops and domains those are is target knowledge and lives in
`rules/common.toml`, not in the code.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Iterable

from qdq.graph import ir
from qdq.graph.ops import QDQ_DOMAINS, QDQ_OPS
from qdq.rewrite.rule import CheckContext, Finding, Rule, Severity, register

# Domains whose ops are ONNX's or onnxruntime's own: a name pattern never matches there.
_STANDARD_DOMAINS = (None, "", "ai.onnx", "com.microsoft", "ai.onnx.ml")


def _label(node: ir.Node) -> str:
    return node.op if node.domain in (None, "", "ai.onnx") else f"{node.domain} {node.op}"


def unread_ops(nodes: Iterable[ir.Node], params: dict[str, Any]) -> tuple[dict[str, list[ir.Node]], dict[str, list[ir.Node]]]:
    """(quantizers, integer ops) qdq does not read, by label, from the lists of QDQ006's parameters.

    A quantizer decides how a float is rounded (QONNX `Quant`, Quark's `ExtendedQuantizeLinear`, a
    fake-quant custom op); an integer op computes on integers with scales of its own (`QLinearConv`).
    """
    domains = set(params.get("quantizer_domains", ()))
    names = set(params.get("quantizer_ops", ()))
    patterns = [p.lower() for p in params.get("quantizer_name_patterns", ())]
    integer = set(params.get("integer_ops", ()))
    prefixes = tuple(params.get("integer_op_prefixes", ()))
    quantizers: dict[str, list[ir.Node]] = {}
    integers: dict[str, list[ir.Node]] = {}
    for node in nodes:
        if node.op in QDQ_OPS and node.domain in QDQ_DOMAINS:
            continue
        custom = node.domain not in _STANDARD_DOMAINS
        if node.domain in domains or (custom and (node.op in names or any(fnmatchcase(node.op.lower(), p)
                                                                            for p in patterns))):
            quantizers.setdefault(_label(node), []).append(node)
        elif node.op in integer or node.op.startswith(prefixes):
            integers.setdefault(_label(node), []).append(node)
    return quantizers, integers


def describe(found: dict[str, list[ir.Node]]) -> str:
    """'17 qonnx.custom_op.general Quant, 2 Trunc'."""
    return ", ".join(f"{len(nodes)} {label}" for label, nodes in sorted(found.items()))


@register
class UnreadQuantization(Rule):
    """The model quantizes with ops qdq does not read, so no other rule checks that quantization.

    Why: qdq reads QuantizeLinear and DequantizeLinear (ONNX and com.microsoft). QONNX's `Quant`,
    `BipolarQuant` and `Trunc` (Brevitas `export_qonnx`, FINN), a vendor's own quantizers (AMD
    Quark's `ExtendedQuantizeLinear`, Vitis AI's `VitisQuantizeLinear`), fake-quant custom ops and
    integer kernels with scales of their own (`QLinearConv`, `MatMulInteger`) carry quantization
    that none of the target rules sees. Without this finding such a model would lint clean,
    and a CI gate would pass a model qdq never read. `qdq fix` refuses a model with such
    quantizers (exit 2, nothing written); integer kernels stay as they are, with this finding.

    The way out: export Q/DQ instead — Brevitas `export_onnx_qcdq`, QONNX's `QuantToQCDQ`
    transformation (`qonnx.transformation.qonnx_to_qcdq`), onnxruntime's quantizer with
    `quant_format=QuantFormat.QDQ` rather than QOperator.

    Example: a Brevitas model exported with `export_qonnx` holds 17 `qonnx.custom_op.general
    Quant` nodes and no QuantizeLinear: error, no automatic fix.

    The ops and domains are this rule's parameters in `rules/common.toml`.
    """

    code = "QDQ006"
    name = "unread-quantization"
    message = "{what}, first {node}; qdq checks only QuantizeLinear/DequantizeLinear{advice}"
    severity = Severity.ERROR
    runs_without_qdq = True
    parameters = {"quantizer_domains": [], "quantizer_ops": [], "quantizer_name_patterns": [], "integer_ops": [],
                  "integer_op_prefixes": []}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        quantizers, integers = unread_ops(ctx.graph.nodes, ctx.params)
        if quantizers:
            count = sum(map(len, quantizers.values()))
            yield self.finding(
                ctx, _first(ctx.graph, quantizers), what=f"quantized with {count} op(s) qdq does not read ({describe(quantizers)})",
                count=count,
                advice=": export QuantizeLinear/DequantizeLinear (QCDQ) instead, e.g. Brevitas export_onnx_qcdq "
                "or QONNX's QuantToQCDQ transformation",
            )
        if integers:
            count = sum(map(len, integers.values()))
            yield self.finding(
                ctx, _first(ctx.graph, integers), what=f"{count} integer op(s) compute with scales qdq does not check "
                f"({describe(integers)})", count=count,
                advice=": quantize in the QDQ format (e.g. onnxruntime's quant_format=QuantFormat.QDQ) to have them "
                "checked",
            )


def _first(graph: ir.Graph, found: dict[str, list[ir.Node]]) -> ir.Node:
    """The first such node in graph order, where a report points."""
    firsts = {id(nodes[0]) for nodes in found.values()}
    return next(node for node in graph.nodes if id(node) in firsts)
