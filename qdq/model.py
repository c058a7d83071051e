"""Loading and saving ONNX models safely.

A model is loaded without its external weights (they are only referenced, never read unless a
rule asks for a value) and checked before any rule sees it, so every malformed input ends in a
one-line `ModelLoadError`. Saving is atomic and keeps external weights in external files.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper

from qdq import progress
from qdq.errors import ModelLoadError, OutputError
from qdq.files import atomic_write_bytes, check_writable, same_file
from qdq.graph_import import import_graph
from qdq.spill import Spill

# QuantizeLinear and DequantizeLinear exist from opset 10 on.
MIN_OPSET = 10
_LFS_POINTER_PREFIX = b"version https://git-lfs"
# Tensors a fix creates that are larger than this go to external data when the model uses it.
_EXTERNAL_THRESHOLD_BYTES = 1024
# Element types whose raw_data is the little-endian numpy layout as it is.
_RAW_DTYPES = {
    TensorProto.FLOAT: np.dtype("<f4"),
    TensorProto.DOUBLE: np.dtype("<f8"),
    TensorProto.FLOAT16: np.dtype("<f2"),
    TensorProto.INT8: np.dtype("i1"),
    TensorProto.UINT8: np.dtype("u1"),
    TensorProto.INT16: np.dtype("<i2"),
    TensorProto.UINT16: np.dtype("<u2"),
    TensorProto.INT32: np.dtype("<i4"),
    TensorProto.INT64: np.dtype("<i8"),
}


@dataclass
class Model:
    """An ONNX model as qdq works on it: a graphsurgeon graph plus where it came from."""

    graph: gs.Graph
    path: Path
    opset: int
    proto: onnx.ModelProto = field(repr=False)
    _spill: Spill | None = field(default=None, init=False, repr=False)

    @property
    def base_dir(self) -> Path:
        """The folder external-data locations are relative to."""
        return self.path.parent

    @cached_property
    def uses_external_data(self) -> bool:
        return any(_is_external(t) for t in _all_tensor_protos(self.proto.graph))

    @property
    def input_files(self) -> list[Path]:
        """The model file and the external data files it points at: what an output must never replace."""
        return [self.path, *_external_files(self.proto, self.base_dir)]

    def constant_values(self, tensor: gs.Constant) -> np.ndarray:
        """The values of a constant, reading external data relative to the model, not the cwd."""
        lazy = tensor._values
        if not isinstance(lazy, gs.ir.tensor.LazyValues):
            return np.asarray(lazy)
        proto = lazy.tensor
        dtype = _RAW_DTYPES.get(proto.data_type)
        if dtype is None:
            return numpy_helper.to_array(proto, base_dir=str(self.base_dir))
        shape = tuple(proto.dims)
        expected = math.prod(shape) * dtype.itemsize
        if proto.data_location == TensorProto.EXTERNAL:
            # Mapped, not read: a rule that looks at one weight of a multi-GB model costs no memory.
            info = {entry.key: entry.value for entry in proto.external_data}
            self._check_size(proto, int(info.get("length", expected)), expected)
            if expected == 0:
                return np.zeros(shape, dtype=dtype)
            return np.memmap(self.base_dir / info["location"], dtype=dtype, mode="r",
                             offset=int(info.get("offset", 0)), shape=shape)
        raw = proto.raw_data
        if not raw:
            return numpy_helper.to_array(proto, base_dir=str(self.base_dir))
        # The common case (a scale, a zero-point, an int8 weight) without numpy_helper's per-call
        # overhead, which dominates on models with 100k Q/DQ parameters.
        self._check_size(proto, len(raw), expected)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def _check_size(self, proto: TensorProto, size: int, expected: int) -> None:
        """The ONNX checker refuses data shorter than the shape says, not longer (nor external lengths)."""
        if size != expected:
            raise ModelLoadError(f"{self.path}: tensor {proto.name!r} holds {size} bytes, "
                                 f"not the {expected} its shape {list(proto.dims)} needs")

    def new_constant(self, name: str, values: np.ndarray) -> gs.Constant:
        """A constant holding values a fix computed (a re-quantized or folded weight).

        In a model with external data, large values go straight to a scratch data file
        (`qdq.spill`) and are saved as external data, so a fix of gigabytes of weights holds
        one weight in memory at a time.
        """
        values = np.asarray(values)
        if not self.uses_external_data or values.nbytes <= _EXTERNAL_THRESHOLD_BYTES or values.dtype not in _RAW_DTYPES.values():
            return gs.Constant(name, values)
        if self._spill is None:
            self._spill = Spill(self.path.stem)
        return self._spill.constant(name, values)


def load_model(path: str | os.PathLike) -> Model:
    """Read and validate an ONNX model; raise ModelLoadError with a one-line reason if unusable."""
    path = Path(path)
    _check_model_file(path)
    progress.step(f"reading {path.name}")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, TypeError) as exc:
        raise ModelLoadError(f"{path}: not a valid ONNX model (protobuf parse failed: {_first_line(exc)})") from None
    except Exception as exc:  # protobuf raises assorted internal errors on garbage input
        raise ModelLoadError(f"{path}: not a valid ONNX model ({type(exc).__name__}: {_first_line(exc)})") from None
    if not proto.HasField("graph") or len(proto.graph.node) == 0:
        raise ModelLoadError(f"{path}: not a valid ONNX model (no graph or no nodes)")
    opset = default_opset(proto)
    if opset is None:
        raise ModelLoadError(f"{path}: the model imports no default-domain (ai.onnx) opset")
    if opset < MIN_OPSET:
        raise ModelLoadError(
            f"{path}: opset {opset} is older than {MIN_OPSET}, the first with QuantizeLinear/DequantizeLinear"
        )
    _check_external_data(proto, path)
    progress.step(f"checking {path.name} with the ONNX checker")
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: invalid ONNX model: {_first_line(exc)}") from None
    progress.step(f"building the graph of {path.name} ({len(proto.graph.node)} nodes)")
    with gc_paused():
        try:
            graph = import_graph(proto)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot import the graph: {_first_line(exc)}") from None
    return Model(graph=graph, path=path, opset=opset, proto=proto)


def save_model(model: Model, out_path: str | os.PathLike, in_place: bool = False) -> None:
    """Write the model atomically; external weights stay external and are never overwritten.

    Unchanged external tensors keep pointing at their data file. When the output goes to another
    folder the data file is copied next to it (under a new name if that name is taken), so the
    input's data is never touched. Large tensors that a fix created are written to a new data file.
    The output may not be the input model (unless `in_place`) or one of its data files. If anything
    fails, the files this call created are removed again and an existing output is left as it was.
    """
    out_path = Path(out_path)
    protected = [f for f in model.input_files if not (in_place and same_file(Path(f), model.path))]
    check_writable(out_path, inputs=protected)
    progress.step(f"writing {out_path.name}")
    with gc_paused():
        proto = gs.export_onnx(model.graph)
    proto.ir_version = model.proto.ir_version
    proto.producer_name = model.proto.producer_name or proto.producer_name
    del proto.metadata_props[:]
    proto.metadata_props.extend(model.proto.metadata_props)
    tensors = list(_all_tensor_protos(proto.graph))
    created: list[Path] = []
    try:
        if any(_is_external(t) for t in tensors) or model.uses_external_data:
            _place_external_data(tensors, model.base_dir, out_path, created)
        atomic_write_bytes(out_path, proto.SerializeToString())
    except BaseException as exc:
        for path in created:
            with suppress(OSError):
                path.unlink()
        if isinstance(exc, OSError):
            raise OutputError(f"{out_path}: cannot write: {exc.strerror or exc}") from None
        raise


def default_opset(proto: onnx.ModelProto) -> int | None:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return None


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building millions of small graph objects."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check_model_file(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_LFS_POINTER_PREFIX))
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read: {exc.strerror}") from None
    if not head:
        raise ModelLoadError(f"{path}: file is empty")
    if head == _LFS_POINTER_PREFIX:
        raise ModelLoadError(f"{path}: is a Git LFS pointer, not the model; run `git lfs pull` first")


def _check_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Refuse external-data references that are missing, out of bounds or outside the model folder."""
    base = path.parent.resolve()
    for tensor in _all_tensor_protos(proto.graph):
        if not _is_external(tensor):
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} has external data with no location")
        if "\x00" in location:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} external data location {location!r} is not a valid path"
            )
        if os.path.isabs(location):
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} external data location {location!r} is absolute; refused"
            )
        target = (base / location).resolve()
        if target != base and base not in target.parents:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} external data {location!r} points outside the model folder; refused"
            )
        if not target.is_file():
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} external data file {location!r} is missing")
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} has a non-numeric external data offset or length") from None
        size = target.stat().st_size
        if offset < 0 or offset > size or (length is not None and (length < 0 or offset + length > size)):
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} external data range lies beyond the end of {location!r}"
            )


def _is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def _all_tensor_protos(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto in a graph: initializers, Constant attributes, and those of subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensor_protos(attr.g)
            for sub in attr.graphs:
                yield from _all_tensor_protos(sub)


def _external_files(proto: onnx.ModelProto, base_dir: Path) -> list[Path]:
    """The data files a model's external tensors point at."""
    locations = set()
    for tensor in _all_tensor_protos(proto.graph):
        if _is_external(tensor):
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    return [base_dir / location for location in sorted(locations)]


def _place_external_data(tensors: list[TensorProto], source_dir: Path, out_path: Path, created: list[Path]) -> None:
    """Make every external reference valid relative to the output, and externalise new big tensors.

    Files written here are appended to `created`, so the caller can remove them if saving fails.
    """
    out_dir = out_path.parent.resolve()
    source_dir = source_dir.resolve()
    copied: dict[str, str] = {}
    new_data: list[TensorProto] = []
    for tensor in tensors:
        if _is_external(tensor):
            info = {entry.key: entry for entry in tensor.external_data}
            location = info["location"].value
            if out_dir == source_dir and not os.path.isabs(location):  # absolute: a fix's scratch file
                continue
            if location not in copied:
                # A fix's scratch file takes the output's name; the input's data files keep theirs.
                name = f"{out_path.stem}.data" if os.path.isabs(location) else Path(location).name
                copied[location] = _copy_data_file(source_dir / location, out_dir, name, out_path.stem)
                created.append(out_dir / copied[location])
            info["location"].value = copied[location]
        elif tensor.ByteSize() > _EXTERNAL_THRESHOLD_BYTES:
            new_data.append(tensor)
    if new_data:
        created.append(out_dir / _write_new_external_file(new_data, out_dir, out_path.stem))


def _copy_data_file(source: Path, out_dir: Path, name: str, stem: str) -> str:
    """Copy an external data file next to the output under a name that overwrites nothing.

    A real copy, not a hard link: onnx appends to an existing data file when it re-saves a model,
    and through a shared inode that would change the input's weights.
    """
    name = _free_name(out_dir, name, stem)
    tmp = out_dir / f".{name}.tmp"
    try:
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, out_dir / name)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    return name


def _write_new_external_file(tensors: list[TensorProto], out_dir: Path, stem: str) -> str:
    name = _free_name(out_dir, f"{stem}.data", stem)
    tmp = out_dir / f".{name}.tmp"
    offset = 0
    try:
        with open(tmp, "wb") as handle:
            for tensor in tensors:
                payload = _raw_bytes(tensor)
                handle.write(payload)
                tensor.ClearField("raw_data")
                del tensor.external_data[:]
                for key, value in (("location", name), ("offset", str(offset)), ("length", str(len(payload)))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
                tensor.data_location = TensorProto.EXTERNAL
                offset += len(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out_dir / name)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    return name


def _raw_bytes(tensor: TensorProto) -> bytes:
    """The tensor's data as raw bytes, moving typed fields (float_data, …) to raw form."""
    if not tensor.HasField("raw_data"):
        array = numpy_helper.to_array(tensor)
        converted = numpy_helper.from_array(array, tensor.name)
        tensor.CopyFrom(converted)
    return tensor.raw_data


def _free_name(folder: Path, name: str, stem: str) -> str:
    if not (folder / name).exists():
        return name
    index = 1
    while (folder / f"{stem}.{index}.data").exists():
        index += 1
    return f"{stem}.{index}.data"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]

