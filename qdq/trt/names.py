"""What TensorRT layer names say about the ONNX nodes inside them.

A fused layer is named after its ONNX nodes: `w.weight + QuantizeLinear_7 + Conv_9 + PWN(Clip_13)`,
`a || b`, `{ForeignNode[first...last]}`. Index-style names (`Conv_9`) change whenever the model is
exported again, so two engines of one network are matched by the names that survive an export:
initializers (`features.3.conv.2.weight`) and path-style node names (`/backbone/conv1/Conv`).
"""

from __future__ import annotations

import re

_FOREIGN = re.compile(r"\{ForeignNode\[(.*)\]\}")
_PROFILE_SUFFIX = re.compile(r" \[profile (\d+)\]$")
_CLONE_SUFFIX = re.compile(r"(_clone_\d+)+$")
_INDEXED = re.compile(r"^(?P<op>[A-Za-z][A-Za-z0-9]*)_\d+$")
_UNNAMED = re.compile(r"^\(Unnamed Layer\* \d+\) \[(?P<op>\w+)\]")
_PATH_LEAF = re.compile(r"^(?P<op>[A-Z][A-Za-z0-9]*?)(_\d+)?$")
# QuantizeLinear_2, /x/_input_quantizer/QuantizeLinear, QuantizeLinear_31_quantize_scale_node,
# DequantizeLinear_291, TensorFlow's QuantLinearNode__838.
_QDQ = re.compile(r"^(?P<dq>De)?[Qq]uant(ize)?(Linear)?(Node)?(_+\d+.*)?$")
_REFORMAT = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to (?P<target>.*)$")

# Ops whose place in a fusion decides speed; activations are left out because TensorRT 8 often
# fuses them without naming them (`w + QuantizeLinear_7 + Conv_9` holds a Relu).
STRUCTURAL_OPS = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Sum", "Concat",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization",
})


def profile_index(name: str) -> int:
    """The optimization profile a layer belongs to (` [profile k]` suffix), 0 without one."""
    match = _PROFILE_SUFFIX.search(name)
    return int(match.group(1)) if match else 0


def reformat_target(name: str) -> str | None:
    """For `Reformatting CopyNode for Input Tensor 0 to <layer>`, the layer it serves."""
    match = _REFORMAT.match(name)
    return match.group("target") if match else None


def onnx_nodes(name: str) -> list[str]:
    """The ONNX node (and initializer) names a fused layer name lists, in order."""
    name = _PROFILE_SUFFIX.sub("", name)
    if reformat_target(name) is not None:
        return []
    nodes: list[str] = []
    for part in _split_top(name, (" + ", " || ")):
        part = part.strip()
        if part.startswith("PWN(") and part.endswith(")"):
            for inner in _split_top(part[4:-1], (",",)):
                nodes += onnx_nodes(inner.strip())
        elif (foreign := _FOREIGN.fullmatch(part)) is not None:
            nodes += [end for end in foreign.group(1).split("...") if end]
        elif part:
            nodes.append(_CLONE_SUFFIX.sub("", part))
    return nodes


def nodes_from_metadata(metadata: str) -> list[str]:
    """ONNX node names from a TRT 8.6+ `Metadata` string (entries split by \\x1e or \\x1f)."""
    names = []
    for entry in re.split("[\x1e\x1f]", metadata):
        match = re.search(r"\[ONNX Layer: ([^\]|]+)", entry)
        if match:
            names.append(match.group(1).strip())
    return names


def qdq_kind(node: str) -> str | None:
    """'Q' or 'DQ' when a node name is a QuantizeLinear or DequantizeLinear node, else None."""
    match = _QDQ.match(node.rsplit("/", 1)[-1])
    if match is None:
        return None
    return "DQ" if match.group("dq") else "Q"


def op_type(node: str) -> str | None:
    """The ONNX op a node name implies (`Conv_9`, `/a/b/Conv_1`, `(Unnamed Layer* 3) [Shuffle]`)."""
    if (match := _UNNAMED.match(node)) is not None:
        return match.group("op")
    if "/" in node:
        match = _PATH_LEAF.match(node.rsplit("/", 1)[-1])
        return match.group("op") if match else None
    match = _INDEXED.match(node)
    return match.group("op") if match else None


def is_stable(node: str) -> bool:
    """Names that survive a re-export: initializers and path-style node names, not `Conv_9`."""
    if node.startswith("("):
        return False
    return node.startswith("/") or ("." in node and " " not in node)


def region_of(node: str) -> str:
    """The module a stable name belongs to, two levels deep: `features.3`, `layer1.0`, `backbone.conv1`."""
    parts = [p for p in re.split(r"[./]", node) if p]
    return ".".join(parts[:-1][:2]) if len(parts) > 1 else node


def _split_top(text: str, separators: tuple[str, ...]) -> list[str]:
    """Split at separators outside parentheses and brackets (names contain `(Unnamed Layer* 3)`)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char in "([":
            depth += 1
        elif char in ")]":
            depth = max(0, depth - 1)
        elif depth == 0:
            sep = next((s for s in separators if text.startswith(s, i)), None)
            if sep is not None:
                parts.append(text[start:i])
                i += len(sep)
                start = i
                continue
        i += 1
    parts.append(text[start:])
    return parts
