"""Loading and saving ONNX models safely.

A model is loaded without its external weights (they are only referenced, never read unless a
rule asks for a value) and checked before any rule sees it, so every malformed input ends in a
one-line `ModelLoadError`. Saving is atomic and keeps external weights in external files.
"""

from __future__ import annotations

import gc
import logging
import math
import os
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper

from qdq.graph import ir
from qdq.graph.checker_process import CheckerProcess, start_checker, start_session
from qdq.graph.normalize import normalize
from qdq.graph.ops import DEQUANTIZE, QDQ_DOMAINS, QDQ_OPS
from qdq.graph.read import default_opset, import_graph
from qdq.graph.spill import Spill
from qdq.graph.write import export_model
from qdq.support import progress
from qdq.support.errors import InvalidOutputError, ModelLoadError, OutputError
from qdq.support.files import atomic_write_bytes, check_writable, same_file

log = logging.getLogger("qdq")

# QuantizeLinear and DequantizeLinear exist from opset 10 on.
MIN_OPSET = 10
_LFS_POINTER_PREFIX = b"version https://git-lfs"
# Tensors a fix creates that are larger than this go to external data when the model uses it.
_EXTERNAL_THRESHOLD_BYTES = 1024
# Where onnx's own writer aligns external tensors: tensors of 1 MiB and more start at 64 KiB boundaries.
_ALIGN_THRESHOLD_BYTES, _ALIGNMENT = 1 << 20, 1 << 16
_COPY_BLOCK_BYTES = 16 << 20
# Up to this size a written file's verification runs beside onnxruntime's load of it in a second process.
_BESIDE_SESSION_BYTES = 512 << 20
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
    """An ONNX model as qdq works on it: its graph (`qdq.graph.ir`) plus where it came from."""

    graph: ir.Graph
    path: Path
    opset: int
    proto: onnx.ModelProto = field(repr=False)
    # What qdq repaired or tolerated while reading the file (`qdq.graph.normalize`), one line each.
    notes: list[str] = field(default_factory=list)
    # The data files its external tensors point at, as `load_model` found them when it checked them.
    data_files: list[Path] = field(default_factory=list)
    _spill: Spill | None = field(default=None, init=False, repr=False)

    @property
    def base_dir(self) -> Path:
        """The folder external-data locations are relative to."""
        return self.path.parent

    @property
    def uses_external_data(self) -> bool:
        return bool(self.data_files)

    @property
    def input_files(self) -> list[Path]:
        """The model file and the external data files it points at: what an output must never replace."""
        return [self.path, *self.data_files]

    def constant_values(self, tensor: ir.Constant) -> np.ndarray:
        """The values of a constant, reading external data relative to the model, not the cwd."""
        proto = tensor.proto
        if not isinstance(proto, TensorProto):
            return np.asarray(tensor.values)
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

    def new_constant(self, name: str, values: np.ndarray) -> ir.Constant:
        """A constant holding values a fix computed (a re-quantized or folded weight).

        In a model with external data, large values go straight to a scratch data file
        (`qdq.graph.spill`) and are saved as external data, so a fix of gigabytes of weights holds
        one weight in memory at a time.
        """
        values = np.asarray(values)
        if not self.uses_external_data or values.nbytes <= _EXTERNAL_THRESHOLD_BYTES or values.dtype not in _RAW_DTYPES.values():
            return ir.Constant(name, values)
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
    data_files = _check_external_data(proto, path)
    checker = start_checker(path, len(proto.graph.node))
    if checker is None:
        notes = _checked(proto, path)
        graph = _imported(proto, path)
    else:
        proto, graph, notes = _imported_beside(checker, proto, path)
    for note in notes:  # reports carry them too (lint and inspect notes, fix's report)
        log.warning("%s: %s", path, note)
    return Model(graph=graph, path=path, opset=opset, proto=proto, notes=notes, data_files=data_files)


def _checked(proto: onnx.ModelProto, path: Path) -> list[str]:
    """The ONNX checker (and repairs) in this process; `normalize`'s notes."""
    progress.step(f"checking {path.name} with the ONNX checker")
    return _repaired_and_checked(proto, path)


def _imported(proto: onnx.ModelProto, path: Path) -> ir.Graph:
    progress.step(f"building the graph of {path.name} ({len(proto.graph.node)} nodes)")
    with gc_paused():
        try:
            return import_graph(proto)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot import the graph: {_first_line(exc)}") from None


def _imported_beside(checker: CheckerProcess, proto: onnx.ModelProto,
                     path: Path) -> tuple[onnx.ModelProto, ir.Graph, list[str]]:
    """The graph built while a child process runs the ONNX checker on the file.

    Most files pass, so the graph is built as for a checked file. If the checker refuses this
    one, that work is dropped and the file is read again and checked in process, so what a
    refused file gets (repairs, onnxruntime's verdict, the refusal's message) does not depend
    on where the checker ran.
    """
    with checker:
        try:
            notes = normalize(proto, checked=True)
            graph = _imported(proto, path)
        except Exception as exc:  # the checker's verdict decides which error the user sees
            failure = exc
        else:
            failure = None
        progress.step(f"checking {path.name} with the ONNX checker (in a second process)")
        accepted = checker.accepted()
    if accepted:
        if failure is not None:
            raise failure
        return proto, graph, notes
    proto = onnx.load(str(path), load_external_data=False)  # normalize may have changed the first copy
    notes = _checked(proto, path)
    return proto, _imported(proto, path), notes


def save_model(
    model: Model, out_path: str | os.PathLike, in_place: bool = False, check: Callable[[Path, list], None] | None = None
) -> None:
    """Write the model atomically, checked; external weights stay external and are never overwritten.

    Before the file is moved into place it must pass the full ONNX checker and load in
    onnxruntime (`_check_output`), so qdq never writes a model it made invalid. In a model with
    external data the output gets one data file of its own holding exactly the bytes its tensors
    reference (unchanged weights copied from the input's files, weights a fix computed), so the
    input's data is never touched and superseded weights are not carried along. The output may
    not be the input model (unless `in_place`) or one of its data files. If anything fails, the
    files this call created are removed again and an existing output is left as it was.

    `check` runs on the complete temporary file once the ONNX checker and onnxruntime accept it
    (`qdq fix` verifies the numbers there, in onnxruntime's session of it); it may raise to stop the write.
    """
    out_path = Path(out_path)
    protected = [f for f in model.input_files if not (in_place and same_file(Path(f), model.path))]
    check_writable(out_path, inputs=protected)
    progress.step(f"writing {out_path.name}")
    with gc_paused():  # the walk makes a Python object per tensor: collections over a large graph would cost seconds
        proto = to_proto(model)
        tensors = list(all_tensor_protos(proto.graph))
    created: list[Path] = []
    try:
        if any(_is_external(t) for t in tensors) or model.uses_external_data:
            created.append(_write_data_file(tensors, model.base_dir, out_path))
        atomic_write_bytes(out_path, proto.SerializeToString(),
                           check=lambda tmp: _check_output(model, tmp, out_path, check, bool(created)))
    except BaseException as exc:
        for path in created:
            with suppress(OSError):
                path.unlink()
        if isinstance(exc, OSError):
            raise OutputError(f"{out_path}: cannot write: {exc.strerror or exc}") from None
        raise


def to_proto(model: Model) -> onnx.ModelProto:
    """The model as an ONNX protobuf: the input's, with the graph's changes (what `save_model` writes)."""
    _settle_element_types(model.graph)
    with gc_paused():
        return export_model(model.graph, model.proto)


def _settle_element_types(graph: ir.Graph) -> None:
    """Give each Q/DQ output the element type its parameters now imply.

    A fix that moves a Q from uint8 to int8 changes its zero-point; the output tensor would keep
    the old type in `value_info`, and onnxruntime refuses a model whose declared and actual
    types differ. Tensors without a declared type are left without one.
    """
    for node in graph.nodes:
        if node.op not in QDQ_OPS or node.domain not in QDQ_DOMAINS or not node.outputs or len(node.inputs) < 2:
            continue
        out = node.outputs[0]
        if out.dtype is None:
            continue
        if node.op == DEQUANTIZE:
            implied = node.inputs[1].dtype
        else:
            implied = node.inputs[2].dtype if len(node.inputs) > 2 and node.inputs[2].name else None
        if implied is not None:  # a parameter from a Constant node has no declared type
            out.dtype = implied


def _check_output(model: Model, written: Path, out_path: Path, check: Callable[[Path, list], None] | None,
                  external: bool) -> None:
    """Refuse to move a model into place that the full ONNX checker or onnxruntime refuses.

    Such a model is qdq's fault, not the user's: the message says so. An input that fails the
    same check itself (the checker is stricter than onnxruntime) only has to be no worse. The
    checker holds the interpreter lock (seconds at 100k nodes): a large model's is run in a second
    process while onnxruntime builds its session. A large model's session is built in a second process
    too (`SessionProcess`), and `check` runs meanwhile, unless the file's weights are external or large
    (memory would hold them twice); its outcome stands only once onnxruntime has accepted the file.
    `check` is handed onnxruntime's session of the written file in a one-item list when this process built
    it: a verdict may take it and run it rather than build the model again, and the session is freed once
    taken and run.
    """
    progress.step(f"checking {out_path.name} before writing it")
    opened: list = []
    failure: Exception | None = None
    nodes = len(model.graph.nodes)
    with start_checker(written, nodes, full_check=True) or nullcontext() as child, \
            start_session(written, nodes) or nullcontext() as runtime:
        if runtime is None:
            runtime_problem = _onnxruntime_refusal(written, opened)
        elif check is not None and not external and written.stat().st_size <= _BESIDE_SESSION_BYTES:
            try:
                check(written, opened)
            except Exception as exc:  # raised once onnxruntime has accepted the file
                failure = exc
            check = None
        if runtime is not None:
            runtime_problem = None if runtime.accepted(f"onnxruntime loading {out_path.name}") \
                else _onnxruntime_refusal(written)
        checker_problem = None if child is not None and child.accepted() else _checker_refusal(written)
    _refuse_if_worse(model, out_path, "the ONNX checker", checker_problem, _checker_refusal)
    _refuse_if_worse(model, out_path, "onnxruntime", runtime_problem, _onnxruntime_refusal)
    if failure is not None:
        raise failure
    if check is not None:
        check(written, opened)


def _refuse_if_worse(model: Model, out_path: Path, name: str, problem: str | None,
                     refusal: Callable[[Path], str | None]) -> None:
    if problem is not None and refusal(model.path) is None:
        raise InvalidOutputError(
            f"{out_path}: not written: {name} refuses the fixed model ({problem}); this is a bug in qdq, please report it"
        )


def _checker_refusal(path: Path) -> str | None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        return _first_line(exc)
    return None


def _onnxruntime_refusal(path: Path, opened: list | None = None) -> str | None:
    """Why onnxruntime cannot create a session for the file (CPU, graph optimisations off), or None;
    the session is appended to `opened` when given (building it again would cost as much: a minute at 100k nodes).

    Optimisations off, as verification runs: with them on, session creation costs four times as
    much (3.4 s against 0.8 s at 10k nodes). That onnxruntime's QDQ fusions accept what qdq
    writes is checked over the corpus (tests/test_conformance.py) instead.
    """
    from qdq.support.runtime import session

    try:
        made = session(path)
    except Exception as exc:
        return _first_line(exc)
    if opened is not None:
        opened.append(made)
    return None


def _repaired_and_checked(proto: onnx.ModelProto, path: Path) -> list[str]:
    """`normalize`'s notes once the ONNX checker accepts the model, or onnxruntime does when the checker does not.

    The file is checked before any repair: most pass, and for them normalize skips what the
    checker has already proved. The checker is stricter than the runtime users deploy on: what
    onnxruntime runs, qdq reads.
    """
    try:
        _check(proto, path, repaired=False)
    except Exception as exc:
        refusal = exc
    else:
        return normalize(proto, checked=True)
    notes = normalize(proto)
    if notes:
        try:
            _check(proto, path, repaired=True)
            return notes
        except Exception as exc:
            refusal = exc
    if _onnxruntime_refusal(path) is not None:
        raise ModelLoadError(f"{path}: invalid ONNX model: {_first_line(refusal)}") from None
    notes.append(f"the ONNX checker refuses it ({_first_line(refusal)}), but onnxruntime loads it")
    return notes


def _check(proto: onnx.ModelProto, path: Path, repaired: bool) -> None:
    """The ONNX checker on the file, or on the repaired model when `normalize` changed it.

    The checker resolves external-data locations against the working folder when it is given a
    model rather than a path, so the repaired model is checked from the model's own folder.
    """
    if not repaired:
        onnx.checker.check_model(str(path))
        return
    with _working_folder(path.parent):
        onnx.checker.check_model(proto)


@contextmanager
def _working_folder(folder: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


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


def _check_external_data(proto: onnx.ModelProto, path: Path) -> list[Path]:
    """The data files the model's external tensors point at; refuse references that are missing, out
    of bounds or outside the model folder."""
    base = path.parent.resolve()
    locations = set()
    for tensor in all_tensor_protos(proto.graph):
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
        if ".." in Path(location).parts:  # the ONNX checker refuses these even when they come back in
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} external data location {location!r} has '..' segments; refused"
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
        locations.add(location)
    return [path.parent / location for location in sorted(locations)]


def external_range(tensor: TensorProto, folder: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor's bytes; without a length, to the file's end."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    source = (Path(folder) / info["location"]).resolve()
    offset = int(info.get("offset", 0))
    length = int(info["length"]) if "length" in info else source.stat().st_size - offset
    return source, offset, length


def _is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def all_tensor_protos(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto in a graph: initializers (sparse ones' values and indices too), Constant
    attributes, and those of subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from all_tensor_protos(attr.g)
            for sub in attr.graphs:
                yield from all_tensor_protos(sub)


def _write_data_file(tensors: list[TensorProto], source_dir: Path, out_path: Path) -> Path:
    """Write the output's one data file: the bytes its external tensors reference, and new large tensors.

    Each external tensor's range is copied from wherever it lies (the input's data files, a fix's
    scratch file with an absolute location) once, even when several tensors share it; tensors a
    fix created inline that are larger than `_EXTERNAL_THRESHOLD_BYTES` move out too. Every
    tensor is then pointed at the new file. Large tensors start at a 64 KiB boundary, as onnx
    aligns them, so onnxruntime can map them. The file gets a name no existing file has.
    """
    out_dir = out_path.parent.resolve()
    name = _free_name(out_dir, f"{out_path.stem}.data", out_path.stem)
    tmp = out_dir / f".{name}.tmp"
    copied: dict[tuple[str, int, int], int] = {}
    try:
        with open(tmp, "wb") as handle:
            for tensor in tensors:
                if _is_external(tensor):
                    source, offset, length = external_range(tensor, source_dir)
                    key = (str(source), offset, length)
                    if key not in copied:
                        copied[key] = _aligned(handle, length)
                        _copy_range(source, offset, length, handle)
                    _point_at(tensor, name, copied[key], length)
                elif tensor.ByteSize() > _EXTERNAL_THRESHOLD_BYTES:
                    payload = _raw_bytes(tensor)
                    start = _aligned(handle, len(payload))
                    handle.write(payload)
                    tensor.ClearField("raw_data")
                    _point_at(tensor, name, start, len(payload))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out_dir / name)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    return out_dir / name


def _aligned(handle, length: int) -> int:
    """Pad the file so a tensor of `length` bytes starts where onnx would put it; its offset."""
    position = handle.tell()
    if length >= _ALIGN_THRESHOLD_BYTES and position % _ALIGNMENT:
        handle.write(b"\0" * (_ALIGNMENT - position % _ALIGNMENT))
    return handle.tell()


def _copy_range(source: Path, offset: int, length: int, handle) -> None:
    """Copy `length` bytes from `source` at `offset`, a block at a time (weights may be gigabytes)."""
    with open(source, "rb") as reader:
        reader.seek(offset)
        left = length
        while left:
            progress.tick()
            block = reader.read(min(left, _COPY_BLOCK_BYTES))
            if not block:
                raise OSError(f"{source} ends before the {length} bytes a tensor references")
            handle.write(block)
            left -= len(block)


def _point_at(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL


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

