"""Numerical comparison of two ONNX models in onnxruntime: a reference and a candidate, same inputs.

Both models run on the CPU provider with graph optimisations off, so what runs is what each file
says; their outputs are compared by name with max abs error, relative L2, cosine similarity, SQNR
and an element-wise `atol + rtol*|a|` tolerance. This is not polygraphy's Comparator because we
need cosine and SQNR, which it does not report, and the metrics are a few lines of numpy.

Every problem the user can fix (unreadable inputs file, mismatched outputs, a model onnxruntime
cannot load or run) is a `QdqError` with a one-line message; a graph input the chosen inputs cannot
feed is an `UnfeedableInput`, which `qdq fix` reports as a skipped verification.
"""

from __future__ import annotations

import logging
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from qdq.graph.ops import QDQ_DOMAINS, QUANTIZE
from qdq.quant.dtypes import quant_type, type_name
from qdq.support import progress
from qdq.support.errors import QdqError

log = logging.getLogger("qdq")

# Element types make_inputs can generate values for.
_FLOAT_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}
_INT_TYPES = {
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
    TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64,
}
_NUMPY_TYPES = {**_FLOAT_TYPES, **_INT_TYPES, TensorProto.BOOL: np.bool_}
# A declared input shape larger than this is refused for random inputs rather than allocated.
_MAX_RANDOM_INPUT_BYTES = 1 << 30
_SCALE_TYPES = {*_FLOAT_TYPES, TensorProto.BFLOAT16}


class UnfeedableInput(QdqError):
    """A graph input the chosen inputs cannot feed (its type, no shape, too large): `qdq fix` skips
    its verification and says why; `qdq verify`, asked to compare, stops."""

    def __init__(self, model: Path, reason: str):
        super().__init__(f"{model}: {reason}")
        self.reason = reason


class CandidateFailed(QdqError):
    """The reference ran but the candidate cannot be loaded, run or compared output by output."""


class RunFailed(QdqError):
    """onnxruntime created a session but could not run it on the feeds."""

    def __init__(self, model: Path, detail: str):
        super().__init__(f"{model}: onnxruntime failed to run the model: {detail}")
        self.detail = detail


@dataclass
class OutputComparison:
    """How one output of the candidate compares with the reference's (`a` reference, `b` candidate)."""

    name: str
    shape: tuple[int, ...]
    max_abs_error: float
    relative_l2: float  # ||b-a|| / ||a||; 0 if both are zero, inf if only a is
    cosine: float  # of the flattened outputs; 1.0 if both are all-zero
    sqnr_db: float  # 10*log10(||a||^2 / ||a-b||^2); inf when the values are equal
    mismatched: int  # elements failing |a-b| <= atol + rtol*|a|
    identical: bool  # bit-identical (NaNs in the same places count as equal)
    passed: bool
    nonfinite: int = 0  # elements where b is NaN/inf and a is finite (each one fails the output)
    # The verdict against the float twin (`qdq.verification.verdict`): relative L2 of reference and candidate
    # from the twin, and the most the candidate's may be; None where no twin was run.
    input_to_twin: float | None = None
    candidate_to_twin: float | None = None
    allowed: float | None = None
    # Why the output carries no information on the inputs used ("the input model writes 0 everywhere"); "" when it does.
    no_evidence: str = ""
    # What the verdict's own criterion found wrong, for the report ("" when it held or was not applied).
    verdict_failure: str = ""

    @property
    def evidence(self) -> bool:
        return not self.no_evidence

    def to_dict(self) -> dict:
        """Without evidence the distances from the twin judge nothing: they are null, kept as measured under
        `unjudged`, and `no_evidence` says why."""
        twin = {"input_to_twin": self.input_to_twin, "candidate_to_twin": self.candidate_to_twin}
        unjudged = not self.evidence and self.input_to_twin is not None
        return {
            "name": self.name,
            "shape": list(self.shape),
            "max_abs_error": self.max_abs_error,
            "relative_l2": self.relative_l2,
            "cosine": self.cosine,
            "sqnr_db": self.sqnr_db,
            "mismatched": self.mismatched,
            "nonfinite": self.nonfinite,
            "identical": self.identical,
            **({key: None for key in twin} if unjudged else twin),
            "allowed": None if unjudged else self.allowed,
            "evidence": self.evidence,
            "no_evidence": self.no_evidence or None,
            **({"unjudged": twin} if unjudged else {}),
            "passed": self.passed,
        }


@dataclass
class VerifyResult:
    reference: str
    candidate: str
    inputs: str  # "random (seed 0)" or the .npz file
    atol: float
    rtol: float
    min_sqnr: float | None
    outputs: list[OutputComparison] = field(default_factory=list)
    # What the verdict compared against and how (`qdq.verification.verdict`); empty for a plain comparison.
    twin: str = ""
    criterion: str = ""
    runtime: str = "onnxruntime, optimisations off"
    # A change that claims to be exact: the quantized tensors compared as integers, and those that differ.
    integers: list[str] = field(default_factory=list)
    integers_differing: list[str] = field(default_factory=list)
    # The network's deepest quantized tensors, judged as one more output (`qdq.verification.verdict`); None when not judged.
    network: OutputComparison | None = None

    @property
    def judged(self) -> list[OutputComparison]:
        """The rows the verdict rests on: every output, and the network's deepest tensors when judged. An
        output without evidence still fails: tensors upstream of it cannot say what it would have done."""
        return self.outputs + ([self.network] if self.network is not None else [])

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.judged) and not self.integers_differing

    @property
    def inconclusive(self) -> bool:
        """Failed for want of evidence alone: every failing row carries no information on the inputs used."""
        failed = [o for o in self.judged if not o.passed]
        return bool(failed) and not self.integers_differing and all(not o.evidence for o in failed)

    @property
    def identical(self) -> bool:
        return all(o.identical for o in self.outputs)

    def to_dict(self) -> dict:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "inputs": self.inputs,
            "atol": self.atol,
            "rtol": self.rtol,
            "min_sqnr": self.min_sqnr,
            "twin": self.twin,
            "criterion": self.criterion,
            "runtime": self.runtime,
            "passed": self.passed,
            "identical": self.identical,
            "outputs": [o.to_dict() for o in self.outputs],
            "network": self.network.to_dict() if self.network is not None else None,
            "integers": {"compared": self.integers, "differing": self.integers_differing},
        }


# --- inputs ------------------------------------------------------------------------------------------


def make_inputs(
    model_path: Path,
    seed: int = 0,
    shapes: dict[str, tuple[int, ...]] | None = None,
    range_from: Path | None = None,
    amplitude: float = 1.0,
    smooth: bool = False,
) -> dict[str, np.ndarray]:
    """Random values for every graph input of the model, reproducible for a seed (`RandomInputs`)."""
    return RandomInputs(model_path, shapes, range_from).draw(seed, amplitude, smooth)


class RandomInputs:
    """Random values for every graph input of a model, reproducible for a seed; the model is read once
    for any number of draws.

    Dynamic dimensions become 1 unless `shapes` gives the input's shape. A float input that a
    QuantizeLinear reads is sampled uniformly over the float range that Q represents; other float
    inputs are standard normal. An integer input that indexes a Gather of a constant table (token
    ids) is uniform over the table's rows, one that a one-hot compares with a constant (magika's bytes)
    over the constant's values; other integer inputs are zeros and bool inputs False
    (random bits in a mask or a shape would change what the model computes). `range_from` is a
    second model to take that Q range from when this model's input has no Q (a float reference
    compared with its quantized candidate). An input of another type, without a shape, or too
    large raises `UnfeedableInput` when drawn.
    """

    def __init__(self, model_path: Path, shapes: dict[str, tuple[int, ...]] | None = None,
                 range_from: Path | None = None, graph: onnx.GraphProto | None = None):
        """`graph`: the model's graph when the caller has read it already (reading a 100k-node file costs a second)."""
        self.model_path = Path(model_path)
        self.graph = graph if graph is not None else _load_graph(self.model_path)
        self.inputs = _graph_inputs(self.graph)
        self.shapes = dict(shapes or {})
        _check_shapes(self.inputs, self.shapes, self.model_path)
        self.quantizers = Quantizers(self.graph, self.model_path.parent)
        self.range_from = Path(range_from) if range_from is not None else None
        self._range_from_quantizers: Quantizers | None = None

    def draw(self, seed: int = 0, amplitude: float = 1.0, smooth: bool = False) -> dict[str, np.ndarray]:
        """One draw. `amplitude` < 1 narrows float values around the middle of their range (or the
        normal's spread); `smooth` makes image-like inputs (rank 4, at least 8×8) spatially smooth, as
        pictures are (`qdq.verification.meant_inputs`)."""
        model_path, rng = self.model_path, np.random.default_rng(seed)
        feeds: dict[str, np.ndarray] = {}
        for value in self.inputs:
            elem_type = _elem_type(value, model_path)
            if elem_type not in _NUMPY_TYPES:
                raise _cannot_feed(model_path, value.name, elem_type)
            dtype = _NUMPY_TYPES[elem_type]
            shape = _input_shape(value, self.shapes.get(value.name), model_path)
            if math.prod(shape) * np.dtype(dtype).itemsize > _MAX_RANDOM_INPUT_BYTES:
                raise UnfeedableInput(
                    model_path, f"input {value.name!r} of shape {shape_text(shape)} is too large for random inputs; "
                    "give --inputs FILE.npz"
                )
            if elem_type in _FLOAT_TYPES:
                bounds = self._bounds(value.name, shape)
                if amplitude != 1.0 or smooth:
                    center, half = ((bounds[0] + bounds[1]) / 2, (bounds[1] - bounds[0]) / 2) if bounds is not None \
                        else (0.0, 1.0)
                    noise = smooth_noise(rng, shape) if smooth else rng.uniform(-1.0, 1.0, size=shape)
                    feeds[value.name] = (center + amplitude * half * noise).astype(dtype)
                elif bounds is not None:
                    low, high = bounds
                    log.debug("input %r: uniform over the Q range [%g, %g]", value.name, np.min(low), np.max(high))
                    feeds[value.name] = rng.uniform(low, high, size=shape).astype(dtype)
                else:
                    log.debug("input %r: standard normal", value.name)
                    feeds[value.name] = rng.standard_normal(shape).astype(dtype)
            elif (rows := _index_rows(self.graph, value.name)) and elem_type != TensorProto.BOOL:
                log.debug("input %r: uniform over the %d rows of the table it indexes", value.name, rows)
                feeds[value.name] = rng.integers(0, rows, size=shape).astype(dtype)
            elif elem_type != TensorProto.BOOL and (classes := _compared_values(self.graph, value.name)) is not None:
                log.debug("input %r: uniform over [%d, %d], the values a one-hot compares it with",
                          value.name, *classes)
                feeds[value.name] = rng.integers(classes[0], classes[1] + 1, size=shape).astype(dtype)
            else:
                feeds[value.name] = np.zeros(shape, dtype=dtype)
        return feeds

    def _bounds(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """The float range of the input's Q in this model, else in `range_from`: that model is read only when
        this one has no such Q (reading a 100k-node graph's quantizers costs about a second)."""
        bounds = self.quantizers.range_of(name, shape)
        if bounds is None and self.range_from is not None:
            if self._range_from_quantizers is None:
                self._range_from_quantizers = Quantizers(_load_graph(self.range_from), self.range_from.parent)
            bounds = self._range_from_quantizers.range_of(name, shape)
        return bounds


def smooth_noise(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values in [-1, 1]: uniform noise, except for image-like shapes (N, C, H, W with H, W >= 8),
    where it is blurred over H and W and shared in part between channels, as in pictures."""
    if len(shape) != 4 or min(shape[2:]) < 8:
        return rng.uniform(-1.0, 1.0, size=shape)
    n, c, h, w = shape
    field = 0.7 * rng.uniform(-1.0, 1.0, size=(n, 1, h, w)) + 0.3 * rng.uniform(-1.0, 1.0, size=shape)
    width = max(2, min(h, w) // 8)
    for axis in (2, 3):
        for _ in range(2):  # two box blurs: close to a Gaussian
            field = _box_blur(field, axis, width)
    peak = np.max(np.abs(field), axis=(1, 2, 3), keepdims=True)
    return field / np.where(peak > 0, peak, 1.0)


def _box_blur(values: np.ndarray, axis: int, width: int) -> np.ndarray:
    """Mean over a window of `width` along `axis`, same size (edges padded by reflection)."""
    pad = [(0, 0)] * values.ndim
    pad[axis] = (width // 2, width - 1 - width // 2)
    padded = np.pad(values, pad, mode="reflect")
    total = np.cumsum(padded, axis=axis)
    total = np.concatenate([np.zeros_like(np.take(total, [0], axis=axis)), total], axis=axis)
    size = values.shape[axis]
    return (np.take(total, np.arange(width, width + size), axis=axis) - np.take(total, np.arange(size), axis=axis)) / width


def _index_rows(graph: onnx.GraphProto, name: str) -> int:
    """The fewest rows of the constant tables that `name` indexes through a Gather (0 if none)."""
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    shapes |= {n.output[0]: list(a.t.dims) for n in graph.node if n.op_type == "Constant"
               for a in n.attribute if a.name == "value"}
    rows = []
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == name and node.input[0] in shapes:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            table = shapes[node.input[0]]
            if -len(table) <= axis < len(table) and table[axis] > 0:
                rows.append(table[axis])
    return min(rows, default=0)


# Ops that move or repeat an input's values without computing new ones.
_CARRIERS = frozenset({"Reshape", "Expand", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Identity", "Cast"})


def _compared_values(graph: onnx.GraphProto, name: str) -> tuple[int, int] | None:
    """The range of the integer constant that `name` (or a reshaped copy of it) is compared with by an
    Equal: the classes of a one-hot (magika's bytes, 0-256). None when it is compared with none."""
    constants = {t.name: t for t in graph.initializer}
    constants |= {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                  if a.name == "value"}
    carried, found = {name}, []
    for node in graph.node:  # topological order: a carrier's output is seen before what reads it
        if node.op_type in _CARRIERS and node.input and node.input[0] in carried:
            carried.update(node.output)
        elif node.op_type == "Equal" and len(node.input) == 2 and any(i in carried for i in node.input):
            other = node.input[1] if node.input[0] in carried else node.input[0]
            if other in constants and constants[other].data_type in _INTEGER_TYPES:
                values = numpy_helper.to_array(constants[other])
                if values.size:
                    found.append((int(values.min()), int(values.max())))
    return (min(f[0] for f in found), max(f[1] for f in found)) if found else None


_INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16,
                            TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64})


def check_input_shapes(model_path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse shapes given for inputs the model does not have, or that contradict its declared ones."""
    if shapes:
        _check_shapes(_graph_inputs(_load_graph(Path(model_path))), shapes, Path(model_path))


def _check_shapes(inputs: list[onnx.ValueInfoProto], shapes: dict[str, tuple[int, ...]], path: Path) -> None:
    unknown = sorted(set(shapes) - {i.name for i in inputs})
    if unknown:
        names = ", ".join(i.name for i in inputs) or "none"
        raise QdqError(f"{path}: no graph input named {', '.join(map(repr, unknown))} (inputs: {names})")
    for value in inputs:
        if value.name in shapes:
            _input_shape(value, shapes[value.name], path)


def load_inputs(npz_path: Path, model_path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, checked against the model's graph inputs (names, dtypes, ranks)."""
    npz_path, model_path = Path(npz_path), Path(model_path)
    return _checked(_read_npz(npz_path), _graph_inputs(_load_graph(model_path)), npz_path, model_path)


def load_samples(npz_path: Path, model_path: Path) -> list[dict[str, np.ndarray]]:
    """The samples of an .npz file, as feeds: calibration sets hold N samples, models often a batch of 1.

    Where an input's batch axis is fixed at 1 and its array has N there, axis 0 is the sample
    axis and each sample is fed alone; an input with a dynamic batch takes all N in one run.
    """
    npz_path, model_path = Path(npz_path), Path(model_path)
    arrays = _read_npz(npz_path)
    inputs = _graph_inputs(_load_graph(model_path))
    counts = {a.shape[0] for a in (arrays.get(i.name) for i in inputs if _batch_of_one(i))
              if a is not None and a.ndim and a.shape[0] != 1}
    if len(counts) > 1:
        raise QdqError(f"{npz_path}: inputs with a batch of 1 hold different sample counts {sorted(counts)} on axis 0")
    if not counts:
        return [_checked(arrays, inputs, npz_path, model_path)]
    one = {i.name for i in inputs if _batch_of_one(i)}
    return [_checked({k: a[n:n + 1] if k in one else a for k, a in arrays.items()}, inputs, npz_path, model_path)
            for n in range(counts.pop())]


def _batch_of_one(value: onnx.ValueInfoProto) -> bool:
    dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []
    return bool(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1


def _checked(
    arrays: dict[str, np.ndarray], inputs: list[onnx.ValueInfoProto], npz_path: Path, model_path: Path
) -> dict[str, np.ndarray]:
    """`arrays` by graph input, after checking names, dtypes and shapes against the inputs."""
    expected = {i.name for i in inputs}
    missing = [i.name for i in inputs if i.name not in arrays]
    extra = sorted(set(arrays) - expected)
    if missing:
        raise QdqError(f"{npz_path}: no array for the model input(s) {', '.join(map(repr, missing))}")
    if extra:
        raise QdqError(f"{npz_path}: array(s) {', '.join(map(repr, extra))} match no input of {model_path}")
    for value in inputs:
        array = arrays[value.name]
        elem_type = _elem_type(value, model_path)
        if elem_type == TensorProto.STRING:  # numpy holds strings as str_ or bytes_ arrays, both fed as they are
            if array.dtype.kind not in "US":
                raise QdqError(f"{npz_path}: input {value.name!r} is {array.dtype}, the model expects strings")
        elif elem_type not in _NUMPY_TYPES:
            raise _cannot_feed(model_path, value.name, elem_type)
        elif array.dtype != _NUMPY_TYPES[elem_type]:
            want = np.dtype(_NUMPY_TYPES[elem_type])
            raise QdqError(
                f"{npz_path}: input {value.name!r} is {array.dtype}, the model expects {want} (no casting is done)"
            )
        tensor_type = value.type.tensor_type
        if tensor_type.HasField("shape"):
            dims = list(tensor_type.shape.dim)
            if array.ndim != len(dims):
                raise QdqError(
                    f"{npz_path}: input {value.name!r} has rank {array.ndim} (shape {shape_text(array.shape)}), "
                    f"the model expects rank {len(dims)}"
                )
            for axis, (dim, size) in enumerate(zip(dims, array.shape)):
                if dim.HasField("dim_value") and dim.dim_value >= 0 and dim.dim_value != size:
                    raise QdqError(
                        f"{npz_path}: input {value.name!r} has shape {shape_text(array.shape)}, "
                        f"the model expects {dim.dim_value} on axis {axis}"
                    )
    return {i.name: arrays[i.name] for i in inputs}


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        raise QdqError(f"{path}: no such file")
    if path.is_dir():
        raise QdqError(f"{path}: is a directory, not an .npz file")
    try:
        with open(path, "rb") as handle:  # our own handle: np.load leaks its own when the zip is corrupt
            head = handle.read(6)
            if head == b"\x93NUMPY":
                raise QdqError(f"{path}: is an .npy file (one unnamed array); save the inputs by name with numpy.savez")
            if not head.startswith(b"PK"):
                raise QdqError(f"{path}: not an .npz archive (numpy.savez) of named arrays")
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
    except QdqError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise QdqError(f"{path}: cannot read as .npz: {_first_line(exc)}") from None


# --- running and comparing ---------------------------------------------------------------------------


def compare(
    reference: Path,
    candidate: Path,
    feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]],
    atol: float = 1e-4,
    rtol: float = 1e-3,
    min_sqnr: float | None = None,
    inputs_label: str = "",
) -> VerifyResult:
    """Run both models on `feeds` (or on each of a list of samples, `load_samples`) and compare their outputs by name.

    Over several samples each output is compared as the samples' outputs concatenated on axis 0.
    """
    samples = [feeds] if isinstance(feeds, dict) else feeds
    reference, candidate = Path(reference), Path(candidate)
    ref_session, cand_session = _sessions(reference, candidate)
    ref_names = [o.name for o in ref_session.get_outputs()]
    cand_names = [o.name for o in cand_session.get_outputs()]
    check_same_outputs(reference, candidate, ref_names, cand_names)
    try:
        ref_out = run_all(ref_session, reference, ref_names, samples)
    except RunFailed as exc:
        # The reference itself cannot run on these inputs (a declared -1 dimension, a shape check
        # only made at run time): nothing qdq did is at fault, and there is nothing to compare with.
        where = f" on {inputs_label}" if inputs_label else ""
        raise UnfeedableInput(reference, f"onnxruntime cannot run the model{where} ({exc.detail}); give --inputs") from None
    try:
        cand_out = run_all(cand_session, candidate, cand_names, samples)
    except RunFailed as exc:
        raise CandidateFailed(str(exc)) from None
    result = VerifyResult(
        reference=str(reference), candidate=str(candidate), inputs=inputs_label,
        atol=atol, rtol=rtol, min_sqnr=min_sqnr,
    )
    for name in ref_names:
        a = as_array(ref_out[name], name, reference)
        b = as_array(cand_out[name], name, candidate)
        check_same_shape(name, a, b, reference, candidate)
        result.outputs.append(compare_arrays(name, a, b, atol, rtol, min_sqnr))
    return result


def check_same_outputs(reference: Path, candidate: Path, ref_names, cand_names) -> None:
    """The candidate must have the reference's outputs, by name (qdq's fixes never add or drop one)."""
    if set(ref_names) != set(cand_names):
        only_ref = [n for n in ref_names if n not in cand_names]
        only_cand = [n for n in cand_names if n not in ref_names]
        parts = ([f"only in {reference}: {', '.join(only_ref)}"] if only_ref else []) + \
                ([f"only in {candidate}: {', '.join(only_cand)}"] if only_cand else [])
        raise CandidateFailed(f"the models have different outputs ({'; '.join(parts)})")


def check_same_shape(name: str, a: np.ndarray, b: np.ndarray, reference: Path, candidate: Path) -> None:
    if a.shape != b.shape:
        raise CandidateFailed(f"output {name!r} has shape {shape_text(a.shape)} in {reference} but "
                              f"{shape_text(b.shape)} in {candidate}")


def compare_arrays(
    name: str, a: np.ndarray, b: np.ndarray, atol: float = 1e-4, rtol: float = 1e-3, min_sqnr: float | None = None
) -> OutputComparison:
    """The metrics of one output pair of the same shape (`a` reference, `b` candidate)."""
    identical = _bit_identical(a, b)
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    with np.errstate(all="ignore"):
        nonfinite = int(np.count_nonzero(np.isfinite(a64) & ~np.isfinite(b64)))
        # Elements equal in both (same value, same inf, both NaN) count as zero error, so a NaN or
        # inf the two outputs agree on does not poison the norms; a disagreeing one does.
        agree = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        a64 = np.where(agree & ~np.isfinite(a64), 0.0, a64)
        b64 = np.where(agree & ~np.isfinite(b64), 0.0, b64)
        diff = a64 - b64
        abs_diff = np.abs(diff)
        max_abs = float(np.max(abs_diff)) if abs_diff.size else 0.0  # NaN if any element disagrees by NaN
        norm_a, norm_b, norm_d = (float(np.linalg.norm(v)) for v in (a64, b64, diff))
        mismatched = int(np.count_nonzero(~(abs_diff <= atol + rtol * np.abs(a64))))
        if norm_a == 0.0:
            relative_l2 = 0.0 if norm_d == 0.0 else math.inf
        else:
            relative_l2 = norm_d / norm_a
        if norm_d == 0.0 or (norm_a == 0.0 and norm_b == 0.0):
            cosine = 1.0  # equal values (or both all-zero): exactly 1, not 1 - rounding
        elif norm_a == 0.0 or norm_b == 0.0:
            cosine = 0.0
        else:
            cosine = float(np.clip(np.dot(a64, b64) / (norm_a * norm_b), -1.0, 1.0))
        if norm_d == 0.0:
            sqnr = math.inf
        elif norm_a == 0.0:
            sqnr = -math.inf
        else:
            sqnr = float(20.0 * np.log10(norm_a / norm_d))  # = 10*log10(||a||^2/||a-b||^2), without overflow
    passed = mismatched == 0 and nonfinite == 0 and (min_sqnr is None or sqnr >= min_sqnr)
    return OutputComparison(
        name=name, shape=tuple(int(d) for d in a.shape), max_abs_error=max_abs, relative_l2=float(relative_l2),
        cosine=cosine, sqnr_db=sqnr, mismatched=mismatched, identical=identical, passed=passed, nonfinite=nonfinite,
    )


def _bit_identical(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        return bool(np.array_equal(nan_a, nan_b)) and a[~nan_a].tobytes() == b[~nan_b].tobytes()
    return a.tobytes() == b.tobytes()


def _sessions(reference: Path, candidate: Path):
    """Both models' sessions, built side by side; the reference's refusal first, as the input is at fault then."""
    from qdq.support.runtime import sessions  # imported here: the rest of qdq does not need onnxruntime

    ref_session, cand_session = sessions(reference, candidate)
    if isinstance(ref_session, Exception):
        raise QdqError(cannot_load(reference, ref_session))
    if isinstance(cand_session, Exception):
        raise CandidateFailed(cannot_load(candidate, cand_session))
    return ref_session, cand_session


def cannot_load(path: Path, exc: Exception) -> str:
    return f"{path}: onnxruntime cannot load the model: {_first_line(exc)}"


def run_all(session, path: Path, names: list[str], samples: list[dict[str, np.ndarray]]) -> dict[str, object]:
    """The outputs `names` (some or all of the session's); over several samples, their tensors concatenated on axis 0."""
    runs = [_run(session, path, feeds, names) for feeds in samples]
    if len(runs) == 1:
        return dict(zip(names, runs[0]))
    return {name: np.concatenate([np.atleast_1d(as_array(run[i], name, path)) for run in runs])
            for i, name in enumerate(names)}


def _run(session, path: Path, feeds: dict[str, np.ndarray], names: list[str]) -> list:
    needed = [i.name for i in session.get_inputs()]
    missing = [n for n in needed if n not in feeds]
    if missing:
        raise QdqError(f"{path}: no value given for the input(s) {', '.join(map(repr, missing))}")
    unused = sorted(set(feeds) - set(needed))
    if unused:
        log.info("%s does not read the input(s) %s", path, ", ".join(unused))
    from qdq.support.runtime import run

    declared = {i.name: _FLOAT_BY_ORT_TYPE.get(i.type) for i in session.get_inputs()}
    try:
        return run(session, names, {n: _as_declared(feeds[n], declared[n]) for n in needed})
    except Exception as exc:
        raise RunFailed(path, _first_line(exc)) from None


_FLOAT_BY_ORT_TYPE = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def _as_declared(value: np.ndarray, dtype) -> np.ndarray:
    """A float feed in the float type the model declares: a candidate with an FP16 interface (the trt11
    fix's `fp16_io`) takes the same values the FP32 input model took, rounded to FP16 as its caller would."""
    if dtype is not None and isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.dtype != dtype:
        return value.astype(dtype)
    return value


def as_array(value: object, name: str, path: Path) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise QdqError(f"{path}: output {name!r} is a {type(value).__name__}, not a tensor; only tensors are compared")
    if value.dtype.kind not in "biuf":
        raise QdqError(f"{path}: output {name!r} has dtype {value.dtype}, which cannot be compared numerically")
    return value


# --- graph inputs ------------------------------------------------------------------------------------


def _load_graph(path: Path) -> onnx.GraphProto:
    try:
        return onnx.load(str(path), load_external_data=False).graph
    except FileNotFoundError:
        raise QdqError(f"{path}: no such file") from None
    except Exception as exc:
        raise QdqError(f"{path}: not a valid ONNX model ({_first_line(exc)})") from None


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in initializers]


def _elem_type(value: onnx.ValueInfoProto, path: Path) -> int:
    if not value.type.HasField("tensor_type"):
        kind = (value.type.WhichOneof("value") or "unknown").replace("_type", "")
        raise UnfeedableInput(path, f"input {value.name!r} is a {kind}, not a tensor; verification feeds tensors only")
    elem_type = value.type.tensor_type.elem_type
    if elem_type == TensorProto.UNDEFINED:
        raise UnfeedableInput(path, f"input {value.name!r} has no element type")
    return elem_type


def _cannot_feed(path: Path, name: str, elem_type: int) -> UnfeedableInput:
    if elem_type == TensorProto.STRING:  # numpy holds strings: an .npz file can feed them
        return UnfeedableInput(
            path, f"input {name!r} is string, which random inputs cannot feed; give --inputs FILE.npz"
        )
    return UnfeedableInput(
        path, f"input {name!r} is {type_name(elem_type)}, which neither random inputs nor an .npz file can feed"
    )


def _input_shape(value: onnx.ValueInfoProto, given: tuple[int, ...] | None, path: Path) -> tuple[int, ...]:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        if given is None:
            raise UnfeedableInput(
                path, f"input {value.name!r} has no declared shape; give --input-shape {value.name}:DIMS or --inputs"
            )
        return tuple(given)
    dims = list(tensor_type.shape.dim)
    if given is None:
        return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else 1 for d in dims)
    given = tuple(int(s) for s in given)
    if len(given) != len(dims):
        raise QdqError(
            f"input {value.name!r}: shape {shape_text(given)} has rank {len(given)}, the model expects rank {len(dims)}"
        )
    for axis, (dim, size) in enumerate(zip(dims, given)):
        if dim.HasField("dim_value") and dim.dim_value >= 0 and dim.dim_value != size:
            raise QdqError(
                f"input {value.name!r}: shape {shape_text(given)} has {size} on axis {axis}, "
                f"the model fixes it to {dim.dim_value}"
            )
    return given


class Quantizers:
    """The float range each graph input's QuantizeLinear represents, in one model.

    Any reader of the input may be that Q, in the ONNX or the com.microsoft domain. Its scale and
    zero-point may be initializers or Constant nodes, behind Identity and Cast nodes (Vitis AI,
    opset-12 and torch exports write them so). Only integer Q types count, per tensor or per axis;
    a blocked Q (block_size) does not. A Clip with constant bounds that alone reads the Q's
    integers (PyTorch's reduced-range quantizer, `Q → Clip(0, 127) → DQ`) narrows the range.
    """

    def __init__(self, graph: onnx.GraphProto, folder: Path):
        self.folder = str(folder)
        self._constants: dict[str, tuple[np.ndarray, int] | None] = {}
        self.initializers = {t.name: t for t in graph.initializer}
        # Each walk over a 100k-node graph takes a second: the progress line ticks along them.
        self.producers = {out: node for node in progress.each(graph.node, None) for out in node.output if out}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in progress.each(graph.node, None):
            if node.op_type == QUANTIZE and node.domain in QDQ_DOMAINS and len(node.input) >= 2:
                self.readers.setdefault(node.input[0], []).append(node)
        # The readers of each QuantizeLinear's integers (`_integer_bounds` asks for nothing else).
        integers = {name for node in graph.node if node.op_type == QUANTIZE for name in node.output[:1]}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in progress.each(graph.node, None):
            for name in set(node.input) & integers:
                self.consumers.setdefault(name, []).append(node)

    def range_of(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """(low, high) of the first Q of `name` whose range is known, broadcasting over `shape`; else None."""
        return next((r for q in self.readers.get(name, []) if (r := self.range_of_node(q, name, shape)) is not None), None)

    def range_of_node(self, q: onnx.NodeProto, name: str, shape: tuple[int, ...]):
        """(low, high) of the floats this Q represents, broadcasting over `shape`; None if unknown."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in q.attribute}
        if attrs.get("block_size", 0):
            return None
        has_zp = len(q.input) > 2 and bool(q.input[2])
        scale = self.constant(q.input[1])
        zp = self.constant(q.input[2]) if has_zp else None
        if scale is None or scale[1] not in _SCALE_TYPES or (has_zp and zp is None):
            return None
        qtype = quant_type(zp[1] if zp is not None else (attrs.get("output_dtype") or TensorProto.UINT8))
        if qtype is None or qtype.is_float:
            log.debug("input %r feeds a Q to a type without an integer range; sampling standard normal", name)
            return None
        scale = scale[0].astype(np.float64)
        zp = zp[0].astype(np.float64) if zp is not None else np.zeros_like(scale)
        if zp.shape != scale.shape and zp.size != 1:
            return None
        if scale.size != 1:  # per-axis: a 1-D scale along `axis`
            axis = attrs.get("axis", 1)
            axis = axis + len(shape) if axis < 0 else axis
            if scale.ndim != 1 or not 0 <= axis < len(shape) or shape[axis] != scale.size:
                return None
            broadcast = [1] * len(shape)
            broadcast[axis] = scale.size
            scale, zp = scale.reshape(broadcast), np.broadcast_to(zp.reshape(-1), scale.shape).reshape(broadcast)
        else:
            scale, zp = scale.reshape(()), zp.reshape(())
        qmin, qmax = self._integer_bounds(q, qtype)
        first, second = (qmin - zp) * scale, (qmax - zp) * scale
        return np.minimum(first, second), np.maximum(first, second)

    def _integer_bounds(self, q: onnx.NodeProto, qtype) -> tuple[float, float]:
        """The integers the Q's output can hold after the Clip that alone reads it, if there is one."""
        readers = self.consumers.get(q.output[0], [])
        clip = readers[0] if len(readers) == 1 and readers[0].op_type == "Clip" else None
        qmin, qmax = qtype.qmin, qtype.qmax
        if clip is None or clip.domain not in ("", "ai.onnx"):
            return qmin, qmax
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in clip.attribute}  # opset < 11
        bounds = [attrs.get("min"), attrs.get("max")]
        for slot in (1, 2):
            if len(clip.input) > slot and clip.input[slot]:
                found = self.constant(clip.input[slot])
                if found is None:
                    return qmin, qmax
                bounds[slot - 1] = float(found[0].ravel()[0])
        low, high = bounds
        return (qmin if low is None else max(qmin, math.ceil(low)),
                qmax if high is None else min(qmax, math.floor(high)))

    def constant(self, name: str) -> tuple[np.ndarray, int] | None:
        """The value and element type of `name` if constants alone make it, through Identity and Cast.
        Read once per name: a Q and its DQs share their scale, and the twin's saturation probe asks again."""
        if name not in self._constants:
            self._constants[name] = self._read_constant(name)
        return self._constants[name]

    def _read_constant(self, name: str) -> tuple[np.ndarray, int] | None:
        cast_to, seen = None, set()
        while name not in self.initializers:
            node = self.producers.get(name)
            if node is None or name in seen or node.domain not in ("", "ai.onnx"):
                return None
            seen.add(name)
            if node.op_type == "Constant":
                found = _constant_node_value(node)
                return (found[0], cast_to or found[1]) if found is not None else None
            if node.op_type not in ("Identity", "Cast") or not node.input:
                return None
            if node.op_type == "Cast" and cast_to is None:  # the Cast nearest the Q decides the type
                cast_to = next((a.i for a in node.attribute if a.name == "to"), None)
            name = node.input[0]
        tensor = self.initializers[name]
        return numpy_helper.to_array(tensor, base_dir=self.folder), cast_to or tensor.data_type


def _constant_node_value(node: onnx.NodeProto) -> tuple[np.ndarray, int] | None:
    """The value and element type a Constant node holds in the model file (never in external data)."""
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(attr.t), attr.t.data_type
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.float32), TensorProto.FLOAT
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.int64), TensorProto.INT64
    return None


# --- text report -------------------------------------------------------------------------------------


def render_text(result: VerifyResult) -> str:
    """Header lines (what was compared, on what, by which criterion), one aligned row per output, a summary line."""
    tolerance = f"atol {result.atol:g}, rtol {result.rtol:g}"
    if result.min_sqnr is not None:
        tolerance += f", min SQNR {result.min_sqnr:g} dB"
    if result.criterion:
        lines = [f"reference {result.reference}, candidate {result.candidate}; {result.twin}; {result.runtime}",
                 f"inputs: {result.inputs or 'given'}", f"criterion: {result.criterion}"]
    else:
        lines = [f"reference {result.reference}, candidate {result.candidate}; inputs {result.inputs or 'given'}; "
                 f"{tolerance}"]
    shown = result.judged
    twin = any(o.input_to_twin is not None for o in shown)
    head = ("input→twin", "candidate→twin", "allowed") if twin else ()
    rows = [("output", "shape", *head, "max abs err", "rel L2", "cosine", "SQNR dB", "result")]
    for o in shown:
        figures = (_num(o.input_to_twin), _num(o.candidate_to_twin), _num(o.allowed)) if twin else ()
        figures += (_num(o.max_abs_error), _num(o.relative_l2), _num(o.cosine, "{:.6f}"), _num(o.sqnr_db, "{:.1f}"))
        if not o.evidence:  # distances on inputs that tell nothing judge nothing: none is shown
            figures = ("-",) * len(figures)
        rows.append((o.name, shape_text(o.shape), *figures, _status(o, result)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:-1], widths[2:-1])]
        cells.append(row[-1])
        lines.append("  ".join(cells).rstrip())
    if result.integers:
        differing = result.integers_differing
        lines.append(f"quantized tensors: {len(result.integers)} compared as integers, " + (
            f"{len(differing)} differ: {', '.join(differing[:5])}{' …' if len(differing) > 5 else ''}"
            if differing else "all identical"))
    total = len(result.judged)
    failed = [o.name for o in result.judged if not o.passed]
    unknown = [o.name for o in shown if not o.evidence]
    if result.integers_differing:
        lines.append(f"FAIL: the change claims to be exact, and {len(result.integers_differing)} quantized tensor(s) "
                     "differ")
    elif result.identical and not unknown:
        lines.append(f"identical: all {len(result.outputs)} output(s) are bit-identical")
    elif not failed:
        deepest = " and the network's deepest quantized tensors" if result.network is not None else ""
        lines.append(f"PASS: all {len(result.outputs)} output(s){deepest} within tolerance")
    elif result.inconclusive:
        reasons = [(o.name, o.no_evidence) for o in shown if not o.evidence]
        why = reasons[0][1] if len(reasons) == 1 else "; ".join(f"{name}: {reason}" for name, reason in reasons)
        lines.append(f"INCONCLUSIVE: {', '.join(unknown)} carr{'y' if len(unknown) > 1 else 'ies'} no information on "
                     f"these inputs ({why}); give --inputs with samples the model is meant to see")
    else:
        named = [f"{name} (no evidence)" if name in unknown else name for name in failed]
        lines.append(f"FAIL: {len(failed)} of {total} judged past tolerance: {', '.join(named)}")
    return "\n".join(lines) + "\n"


def _status(o: OutputComparison, result: VerifyResult) -> str:
    if not o.evidence:
        return f"no evidence: {o.no_evidence}"
    if o.identical:
        return "identical"
    if o.passed:
        return "PASS"
    reasons = []
    if o.mismatched:
        reasons.append(f"{o.mismatched} of {math.prod(o.shape)} mismatched")
    if o.nonfinite:
        reasons.append(f"{o.nonfinite} NaN/inf")
    if result.min_sqnr is not None and not o.sqnr_db >= result.min_sqnr:
        reasons.append("SQNR too low")
    if o.verdict_failure:
        reasons.append(o.verdict_failure)
    return f"FAIL ({', '.join(dict.fromkeys(reasons))})" if reasons else "FAIL"


def _num(value: float | None, fmt: str = "{:.3g}") -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return fmt.format(value)


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
