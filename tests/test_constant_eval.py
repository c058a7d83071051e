"""constant_ancestry: which nodes compute a tensor from constants, in an order onnxruntime can run."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from qdq.constant_eval import MAX_CONSTANT_NODES, constant_ancestry


def chain(start: gs.Tensor, length: int) -> gs.Tensor:
    tensor = start
    for i in range(length):
        out = gs.Variable(f"t{i}")
        gs.Node("Neg", f"n{i}", inputs=[tensor], outputs=[out])
        tensor = out
    return tensor


def test_producers_come_first_in_a_diamond():
    a, b, d = gs.Variable("a"), gs.Variable("b"), gs.Variable("d")
    gs.Node("Neg", "A", inputs=[gs.Constant("c", np.ones(2, np.float32))], outputs=[a])
    gs.Node("Neg", "B", inputs=[a], outputs=[b])
    gs.Node("Add", "D", inputs=[a, b], outputs=[d])
    assert [n.name for n in constant_ancestry(d)] == ["A", "B", "D"]


def test_an_activation_is_not_a_constant_however_long_its_path():
    """A long path back to a graph input ends at the node budget, without recursion."""
    assert constant_ancestry(chain(gs.Variable("x"), 5)) is None
    assert constant_ancestry(chain(gs.Variable("x"), 5000)) is None
    constant = gs.Constant("c", np.ones(2, np.float32))
    assert len(constant_ancestry(chain(constant, MAX_CONSTANT_NODES - 1))) == MAX_CONSTANT_NODES - 1
    assert constant_ancestry(chain(constant, MAX_CONSTANT_NODES + 1)) is None
