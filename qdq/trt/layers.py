"""One engine model for every `trtexec --exportLayerInfo` file from TensorRT 8.2 to 11.

The files differ by version (`Format/Datatype` or split fields, `Origin`, `Metadata` separators,
`Bindings` or `I/O Tensors`) and by build verbosity (names-only lists or detailed objects). They are
read here into `Engine` and `Layer`, so alignment and diffing never look at raw JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdq.support.errors import QdqError
from qdq.trt import names

LOW_BIT = frozenset({"INT8", "UINT8", "INT4", "FP8", "FP4"})
FLOAT = frozenset({"FP32", "FP16", "BF16", "FP64"})

# Words of `Format/Datatype` strings and Myelin/TRT 11 dtype names, lower-cased, to one spelling.
_DTYPES = {
    "fp32": "FP32", "float": "FP32", "float32": "FP32", "fp16": "FP16", "half": "FP16", "float16": "FP16",
    "bfloat16": "BF16", "bf16": "BF16", "int8": "INT8", "uint8": "UINT8", "int4": "INT4", "fp8": "FP8",
    "fp4": "FP4", "fp4e2m1": "FP4", "int32": "INT32", "int64": "INT64", "int16": "INT16", "bool": "BOOL",
    "double": "FP64", "fp64": "FP64",
}
_LAYER_SEPARATOR = re.compile(r"^--- Layer \d+ ---\s*$", re.MULTILINE)

# The version of a file whose keys do not tell it (names-only layer lists).
UNKNOWN_VERSION = "unknown"


class EngineFileError(QdqError):
    """A layer-info or profile file that cannot be read as trtexec output."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...] | None
    precision: str | None  # INT8, FP16, FP32, ... (None when the file does not say)
    format: str | None  # the raw format text, for reports


@dataclass
class Layer:
    """One engine layer, whatever file version it came from."""

    index: int
    name: str
    layer_type: str  # LayerType: the kernel class (CaskConvolution, Reformat, Scale, ...)
    kind: str  # ParameterType, else LayerType: the logical op (Convolution, Pooling, Reformat, ...)
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)
    origin: str | None = None  # Reformat origin: REFORMAT, QDQ, SLICE
    tactic: str | None = None
    onnx_nodes: tuple[str, ...] = ()
    weights_int8: bool = False
    scale_mode: str | None = None
    time_ms: float | None = None  # averageMs from the profile
    detailed: bool = True

    @property
    def qdq_nodes(self) -> tuple[str, ...]:
        return tuple(n for n in self.onnx_nodes if names.qdq_kind(n))

    @property
    def stable_nodes(self) -> frozenset[str]:
        """Names that identify the layer across separately exported ONNX files."""
        return frozenset(n for n in self.onnx_nodes if names.is_stable(n) and not names.qdq_kind(n))

    @property
    def ops(self) -> list[str]:
        """ONNX op types fused into the layer, Q/DQ left out."""
        return [op for n in self.onnx_nodes if not names.qdq_kind(n) and (op := names.op_type(n))]

    @property
    def input_precisions(self) -> list[str | None]:
        return [t.precision for t in self.inputs]

    @property
    def output_precisions(self) -> list[str | None]:
        return [t.precision for t in self.outputs]

    @property
    def is_noop(self) -> bool:
        """Zero-cost views and constants, which TREx folds away and this tool does not report."""
        return self.layer_type in ("NoOp", "Constant") or self.kind == "Constant"

    @property
    def is_qdq(self) -> bool:
        """A standalone Q/DQ: an `Origin: QDQ` reformat (8.4+), a Scale with one INT8 side (8.2),
        or, in names-only files, a layer named after one Q/DQ node."""
        if self.origin == "QDQ":
            return True
        if self.kind == "Scale" and self.inputs and self.outputs:
            return (self.inputs[0].precision in LOW_BIT) != (self.outputs[0].precision in LOW_BIT)
        if not self.detailed:
            return len(self.onnx_nodes) == 1 and names.qdq_kind(self.onnx_nodes[0]) is not None
        return False

    @property
    def is_reformat(self) -> bool:
        """A layout or type copy TensorRT inserted (not a Q/DQ, not a zero-cost NoOp)."""
        if self.is_noop or self.is_qdq:
            return False
        return (
            self.layer_type in ("Reformat", "MyelinReformat")
            or names.reformat_target(self.name) is not None
            or self.name.endswith(" copy")
        )

    @property
    def role(self) -> str:
        """qdq, reformat, noop or compute: layers are only ever matched within one role."""
        if self.is_qdq:
            return "qdq"
        if self.is_reformat:
            return "reformat"
        return "noop" if self.is_noop else "compute"

    @property
    def qdq_direction(self) -> str | None:
        """'Q' (float to INT8) or 'DQ' (INT8 to float) for a standalone Q/DQ layer."""
        if not self.is_qdq:
            return None
        if self.inputs and self.outputs:
            return "DQ" if self.inputs[0].precision in LOW_BIT else "Q"
        return names.qdq_kind(self.onnx_nodes[0])

    @property
    def runs_low_bit(self) -> bool:
        """INT8 (or narrower) compute: an INT8 input, or INT8 weights."""
        return self.weights_int8 or any(p in LOW_BIT for p in self.input_precisions)

    @property
    def touches_low_bit(self) -> bool:
        """A Q/DQ, INT8 weights or an INT8 tensor: only such layers can a Q/DQ rule explain."""
        return self.is_qdq or self.weights_int8 or any(t.precision in LOW_BIT for t in self.inputs + self.outputs)

    @property
    def own_region(self) -> str | None:
        stable = sorted(self.stable_nodes, key=self.onnx_nodes.index)
        return names.region_of(stable[0]) if stable else None


@dataclass
class Engine:
    """A parsed layer-info file: the layers in execution order and the network I/O names."""

    path: Path
    layers: list[Layer]
    detailed: bool
    bindings: list[str]
    version: str  # inferred from the keys, e.g. "8.2", "8.4-8.5", "10.x"
    profile_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def quantized(self) -> bool:
        """Has a Q/DQ or INT8 layer; an FP16/FP32 engine has none, and no Q/DQ rule applies to it."""
        return any(layer.touches_low_bit for layer in self.layers)

    @property
    def has_times(self) -> bool:
        return any(layer.time_ms is not None for layer in self.layers)

    def total_ms(self) -> float | None:
        return sum(layer.time_ms or 0.0 for layer in self.layers) if self.has_times else None

    def producers(self) -> dict[str, Layer]:
        return {t.name: layer for layer in self.layers for t in layer.outputs}

    def consumers(self) -> dict[str, list[Layer]]:
        found: dict[str, list[Layer]] = {}
        for layer in self.layers:
            for tensor in layer.inputs:
                found.setdefault(tensor.name, []).append(layer)
        return found


def load_layer_info(path: str | Path) -> Engine:
    """Read a `--exportLayerInfo` file (any version, names-only or detailed) or a `--- Layer N ---` dump."""
    path = Path(path)
    text = read_text(path)
    if _LAYER_SEPARATOR.search(text):
        root: Any = [_json(chunk, path) for chunk in _LAYER_SEPARATOR.split(text) if chunk.strip()]
    else:
        root = _json(text, path)
    raw_layers, bindings = _layers_and_bindings(root, path)
    if not raw_layers:
        raise EngineFileError(f"{path}: the layer list is empty")
    detailed = isinstance(raw_layers[0], dict)
    layers = []
    for i, raw in enumerate(raw_layers):
        if detailed != isinstance(raw, dict) or not isinstance(raw, (dict, str)):
            expected = "a layer object, as Layers[0]" if detailed else "a layer object or a layer name"
            raise EngineFileError(f"{path}: Layers[{i}] is {_describe(raw)}; expected {expected}")
        layers.append(_layer(raw, i, path) if detailed else _named_layer(raw, i))
    engine = Engine(path, layers, detailed, bindings, _version(raw_layers, root, layers))
    _keep_first_profile(engine)
    return engine


def read_text(path: Path) -> str:
    if path.is_dir():
        raise EngineFileError(f"{path}: is a folder, expected a trtexec JSON file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise EngineFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise EngineFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not data.strip():
        raise EngineFileError(f"{path}: the file is empty")
    return data.decode("utf-8", errors="replace")


def _json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        hint = "truncated? " if exc.pos >= len(text.rstrip()) else ""
        raise EngineFileError(f"{path}: not valid JSON ({hint}{exc.msg} at {where})") from None
    except RecursionError:
        raise EngineFileError(f"{path}: not a trtexec JSON file (nested too deeply to read)") from None


def _layers_and_bindings(root: Any, path: Path) -> tuple[list, list[str]]:
    if isinstance(root, list) and root and isinstance(root[0], dict) and "count" in root[0]:
        raise EngineFileError(f"{path}: this is a --exportProfile file; pass it with --profile")
    if isinstance(root, list):
        return root, []
    if not isinstance(root, dict) or not isinstance(root.get("Layers"), list):
        raise EngineFileError(f"{path}: expected a trtexec --exportLayerInfo file: an object with a "
                              f"\"Layers\" list, found {_describe(root)}")
    if isinstance(root.get("I/O Tensors"), list):  # TensorRT 11
        bindings = [t.get("Name") for t in root["I/O Tensors"] if isinstance(t, dict)]
    else:
        bindings = root.get("Bindings") if isinstance(root.get("Bindings"), list) else []
    return root["Layers"], [b for b in bindings if isinstance(b, str)]


def _layer(raw: dict, index: int, path: Path) -> Layer:
    name = raw.get("Name")
    if not isinstance(name, str):
        raise EngineFileError(f"{path}: Layers[{index}] has no \"Name\" string")
    layer_type = str(raw.get("LayerType") or "")
    metadata = raw.get("Metadata")
    nodes = names.nodes_from_metadata(metadata) if isinstance(metadata, str) and metadata else []
    weights = raw.get("Weights") or raw.get("ConvWeights")
    return Layer(
        index=index,
        name=name,
        layer_type=layer_type,
        kind=str(raw.get("ParameterType") or layer_type),
        inputs=_tensors(raw.get("Inputs"), path, index),
        outputs=_tensors(raw.get("Outputs"), path, index),
        origin=raw.get("Origin") if isinstance(raw.get("Origin"), str) else None,
        tactic=raw.get("TacticName") or raw.get("TacticValue") or None,
        onnx_nodes=tuple(nodes or names.onnx_nodes(name)),
        weights_int8=isinstance(weights, dict) and str(weights.get("Type", "")).lower() == "int8",
        scale_mode=raw.get("Mode") if isinstance(raw.get("Mode"), str) else None,
    )


def _named_layer(name: str, index: int) -> Layer:
    return Layer(index=index, name=name, layer_type="", kind="", onnx_nodes=tuple(names.onnx_nodes(name)),
                 detailed=False)


def _tensors(raw: Any, path: Path, index: int) -> list[Tensor]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise EngineFileError(f"{path}: Layers[{index}] inputs/outputs must be lists of tensor objects")
    return [_tensor(t) for t in raw]


def _tensor(raw: dict) -> Tensor:
    dims = raw.get("Dimensions")
    dims = tuple(d for d in dims if isinstance(d, int)) if isinstance(dims, list) else None
    combined = raw.get("Format/Datatype")
    if isinstance(combined, str):
        return Tensor(str(raw.get("Name", "")), dims, precision_of(combined), combined)
    # TensorRT 11 splits the field; the exact spelling of the keys varies.
    dtype = raw.get("Datatype", raw.get("DataType"))
    fmt = raw.get("Format")
    # The dtype key, else the format text's dtype word ("Row major linear FP16 format (kLINEAR)").
    precision = precision_of(str(dtype if dtype is not None else fmt or ""))
    text = " ".join(str(v) for v in (fmt, dtype) if v is not None) or None
    return Tensor(str(raw.get("Name", "")), dims, precision, text)


def precision_of(text: str) -> str | None:
    """The dtype word of `Thirty-two wide channel vectorized row major Int8 format`, `Half`, `kINT8`."""
    for word in re.split(r"[\s,()]+", text):
        key = word.lower()
        if key not in _DTYPES and key.startswith("k"):
            key = key[1:]
        if key in _DTYPES:
            return _DTYPES[key]
    return None


def _version(raw_layers: list, root: Any, layers: list[Layer]) -> str:
    """Inferred from the keys (see the reference: no version string is written)."""
    if isinstance(root, dict) and "I/O Tensors" in root:
        return "11.x"
    if not layers[0].detailed:
        return UNKNOWN_VERSION  # a names-only file has no keys to tell versions apart
    metadata = "".join(str(r.get("Metadata", "")) for r in raw_layers)
    types = {str(r.get("LayerType")) for r in raw_layers}
    if "\x1f" in metadata or types & {"kgen", "gemm", "shape_call"}:
        return "10.x"
    if metadata:
        return "8.6"
    if any(r.get("Origin") == "QDQ" for r in raw_layers) or any(
        "Location" in t for r in raw_layers for t in (r.get("Inputs") or []) if isinstance(t, dict)
    ):
        return "8.4-8.5"
    return "8.2" if any(layer.kind == "Scale" and layer.is_qdq for layer in layers) else "8.x"


def _keep_first_profile(engine: Engine) -> None:
    """Engines with several optimization profiles repeat every layer with ` [profile k]`; keep profile 0."""
    others = [layer for layer in engine.layers if names.profile_index(layer.name) > 0]
    if others:
        engine.layers = [layer for layer in engine.layers if names.profile_index(layer.name) == 0]
        for i, layer in enumerate(engine.layers):
            layer.index = i
        engine.notes.append(f"{engine.path.name}: kept optimization profile 0, dropped {len(others)} layers of other profiles")


def _describe(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")
