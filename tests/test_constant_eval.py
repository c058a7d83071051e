"""Constant evaluation: which nodes compute a tensor from constants, in an order onnxruntime can run,
and the numpy shortcut for DequantizeLinear checked against onnxruntime on the whole corpus."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from qdq.graph import ir
from qdq.graph.model import load_model
from qdq.quant.index import QuantIndex
from qdq.rewrite.constant_eval import MAX_CONSTANT_NODES, constant_ancestry, dequantized_in_numpy, evaluate_in_onnxruntime
from qdq.rewrite.rule import CheckContext, Severity


def chain(start: ir.Tensor, length: int) -> ir.Tensor:
    tensor = start
    for i in range(length):
        out = ir.Variable(f"t{i}")
        ir.Node("Neg", f"n{i}", inputs=[tensor], outputs=[out])
        tensor = out
    return tensor


def test_producers_come_first_in_a_diamond():
    a, b, d = ir.Variable("a"), ir.Variable("b"), ir.Variable("d")
    ir.Node("Neg", "A", inputs=[ir.Constant("c", np.ones(2, np.float32))], outputs=[a])
    ir.Node("Neg", "B", inputs=[a], outputs=[b])
    ir.Node("Add", "D", inputs=[a, b], outputs=[d])
    assert [n.name for n in constant_ancestry(d)] == ["A", "B", "D"]


def test_an_activation_is_not_a_constant_however_long_its_path():
    """A long path back to a graph input ends at the node budget, without recursion."""
    assert constant_ancestry(chain(ir.Variable("x"), 5)) is None
    assert constant_ancestry(chain(ir.Variable("x"), 5000)) is None
    constant = ir.Constant("c", np.ones(2, np.float32))
    assert len(constant_ancestry(chain(constant, MAX_CONSTANT_NODES - 1))) == MAX_CONSTANT_NODES - 1
    assert constant_ancestry(chain(constant, MAX_CONSTANT_NODES + 1)) is None


CORPUS = Path(__file__).resolve().parent / "corpus"
PER_MODEL = 6  # DQs checked per corpus model: enough to meet every tool's layout, cheap in sessions


def test_numpy_dequantization_is_onnxruntimes_bit_for_bit_over_the_corpus():
    """The numpy shortcut for DQ(stored integers) gives what onnxruntime computes, on every tool's files."""
    checked = 0
    for path in sorted(CORPUS.glob("*/*.onnx")):
        model = load_model(path)
        ctx = CheckContext(model, QuantIndex(model), {}, Severity.INFO)
        nodes = [n for n in model.graph.nodes if n.op == "DequantizeLinear" and dequantized_in_numpy(ctx, n) is not None]
        for node in nodes[:: max(1, len(nodes) // PER_MODEL)][:PER_MODEL]:
            fast = dequantized_in_numpy(ctx, node)
            slow = evaluate_in_onnxruntime(ctx, node.outputs[0], [node])
            assert fast.dtype == slow.dtype and fast.shape == slow.shape, (path.name, node.name)
            assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32)), (path.name, node.name)
            checked += 1
    assert checked > 200  # 252 when written: every tool that stores integers
