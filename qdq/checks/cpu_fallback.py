"""QDQ811: compute ops outside the quantized graph, which an integer-only accelerator leaves to the CPU.

The AMD NPU runs an op only between DequantizeLinear and QuantizeLinear: an op with a float
input or a float output (a Conv or Add nobody quantized, a SiLU island of Sigmoid and Mul) is
partitioned to the CPU, which Ryzen AI reports only as "N nodes on CPU". A model can satisfy
every NPU rule and still run half of its convs there: this rule names each such op, and lint's
count by rule says how many there are.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from qdq.graph import ir
from qdq.quant.index import resolve_constant
from qdq.quant.operands import WEIGHT_INPUT, input_value, output_value
from qdq.rewrite.rule import CheckContext, Finding, Rule, Severity, register


@register
class CpuFallback(Rule):
    """A compute op the target runs only on integers should read DQs and write a Q, or it runs on the CPU.

    Why: the AMD NPU compiler assigns an op to the NPU only when every data input comes from a
    DequantizeLinear and its output goes to a QuantizeLinear (after a fused activation, or the
    DPU's multiply after a pool, `output_through` and `output_through_mul`). Anything else, a
    float Conv, Add or Concat, a Sigmoid and Mul SiLU left float, stays on the CPU with a
    conversion at each border. Constant inputs (weights aside) and ops on integer shapes are
    not the op's data. `ops` lists the ops the target would run (rules/npu.toml).

    Example: `DQ → Conv → Sigmoid → Mul → Q`: the Conv writes float (no Q after it) and the
    Sigmoid and Mul read float, so all three run on the CPU. No fix: which scale each new Q/DQ
    takes needs calibration data (`qdq fix --calibrate` where another rule asks for one), or
    the quantizer's settings.
    """

    code = "QDQ811"
    name = "cpu-fallback"
    message = "{node}: {op} {why}, so the target leaves it to the CPU"
    severity = Severity.INFO
    parameters = {"ops": [], "output_through": [], "output_through_mul": []}

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        through, through_mul = ctx.params["output_through"], ctx.params["output_through_mul"]
        for node in ctx.index.nodes_of(ctx.params["ops"]):
            if not node.outputs or not _data(node) or _dpu_multiply(node, through_mul):
                continue
            float_inputs = [t for i, t in enumerate(node.inputs)
                            if t is not None and t.name and input_value(ctx.index, node, i) is None
                            and not (resolve_constant(t) is not None and i != WEIGHT_INPUT.get(node.op))]
            if float_inputs:
                why = f"reads float {', '.join(t.name for t in float_inputs)}"
            elif output_value(ctx.index, node, through, through_mul) is None:
                why = f"writes float {node.outputs[0].name} (no QuantizeLinear after it)"
            else:
                continue
            yield self.finding(ctx, node, [*float_inputs, node.outputs[0]], op=node.op, why=why)


def _data(node: ir.Node) -> bool:
    """Whether the op computes on float data at run time: not on integer shapes (a shape's
    Concat, whose output type the model may not state), not on constants alone."""
    dtypes = [getattr(t, "dtype", None) for t in [*node.outputs[:1], *node.inputs] if t is not None and t.name]
    known = [d for d in dtypes if isinstance(d, np.dtype)]
    computed = any(resolve_constant(t) is None for t in node.inputs if t is not None and t.name)
    return computed and all(np.issubdtype(d, np.floating) for d in known)


def _dpu_multiply(node: ir.Node, through_mul: Iterable[str]) -> bool:
    """The Mul the DPU appends to a pool or HardSigmoid: part of that op, its output the op's output."""
    producer = node.inputs[0].inputs[0] if node.op == "Mul" and node.inputs and node.inputs[0].inputs else None
    return producer is not None and producer.op in set(through_mul) and len(producer.outputs[0].outputs) == 1
