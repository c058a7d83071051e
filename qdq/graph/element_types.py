"""Each tensor's element type, as onnx's shape inference tells it.

Also a script (`python element_types.py MODEL OUT.json`), so that `qdq.graph.checker_process` can run
the inference of a large model in a child process; it imports onnx only.
"""

from __future__ import annotations

import json
import sys

import onnx


def inferred_element_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of each tensor the inference types (it raises where it fails on the model)."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


if __name__ == "__main__":
    with open(sys.argv[2], "w") as out:
        json.dump(inferred_element_types(onnx.load(sys.argv[1])), out)
