"""The one place that decides whether a changed model is acceptable: `qdq fix` and `qdq verify` both ask it.

A quantized model already differs from the float computation it approximates; the user accepted
that difference. So a change is judged against the input model's float twin (`qdq.verification.twin`): per
output, on the same inputs,

    PASS when  d(candidate, twin) <= d(input, twin) * (1 + margin) + epsilon

with d the relative L2 distance. A fix that brings the model closer to its float computation
passes even when it moves the outputs a lot (a clip point moved to where the data is); a fix
that doubles the quantization error fails even when the outputs moved little. `margin` and
`epsilon` are the rule set's `[verdict]` parameters; the network's deepest quantized tensors,
judged as one more row, have their own (`deep_margin`, `deep_epsilon`). Where no twin can be built (no activation
Q/DQ pair, quantization in ops qdq does not read), the candidate is compared with the input
directly and must keep `fallback_min_sqnr` dB; the report says so. A change that claims to be
exact must give bit-identical outputs, and the quantized integers it computes must stand for the
input's (every QuantizeLinear output of the changed region that the input model also has: the
same scale, the same integers less their zero point, so an int8 ↔ uint8 conversion is exact), in
onnxruntime with optimisations off.

The inputs are the user's samples (`--inputs`), or random inputs the model is meant to see
(`qdq.verification.meant_inputs`). A reference whose outputs carry no information on them (constant, all zero,
NaN) is no evidence: other inputs are tried, and an output still without evidence never passes.
The runtime is what the rule set's `runtime` says stands in for the target: onnxruntime with its
default optimisations for `ort` (the fused integer kernels users run), the file's own semantics
(optimisations off) for the others.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from qdq.engine.ruleset import RuleSet
from qdq.support import progress
from qdq.support.errors import QdqError, RuleSetError
from qdq.verification.change import changed_region, whole
from qdq.verification.meant_inputs import meant_inputs, watch
from qdq.verification.pieces import (PieceFailed, Pieces, element_types, joined, small_weights, start_element_types,
                                     uncuttable)
from qdq.verification.twin import Twin, float_twin
from qdq.verification.verify import (
    CandidateFailed, OutputComparison, Quantizers, RandomInputs, UnfeedableInput, VerifyResult, as_array, cannot_load,
    check_same_outputs, check_same_shape, compare_arrays,
)

log = logging.getLogger("qdq")


class _OptimizedRefused(Exception):
    """onnxruntime refuses the input model with its default optimisations (a fused kernel's own checks)."""


@dataclass(frozen=True)
class Criterion:
    """How a candidate is judged: the rule set's `[verdict]` (values in rules/common.toml), and the gates a user adds."""

    margin: float
    epsilon: float
    deep_margin: float  # for the row of the network's deepest quantized tensors (`_network`)
    deep_epsilon: float
    fallback_min_sqnr: float
    samples: int
    max_saturation: float
    runtime: str  # "exact": optimisations off; "optimized": onnxruntime's defaults
    # Gates a user adds on the direct comparison of input and candidate (`--atol`, `--rtol`, `--min-sqnr`).
    atol: float = math.inf
    rtol: float = 0.0
    min_sqnr: float | None = None

    @classmethod
    def of(cls, ruleset: RuleSet, **gates) -> Criterion:
        settings = dict(ruleset.verdict)
        keys = {"margin", "epsilon", "deep_margin", "deep_epsilon", "fallback_min_sqnr", "samples", "max_saturation",
                "runtime"}
        if set(settings) - keys:
            raise RuleSetError(f"[verdict] has unknown key(s) {', '.join(sorted(set(settings) - keys))}")
        if keys - set(settings):
            raise RuleSetError(f"rule set {ruleset.name!r} has no [verdict] {', '.join(sorted(keys - set(settings)))} "
                               "(extend a shipped set, such as common, to inherit them)")
        for key in ("margin", "epsilon", "deep_margin", "deep_epsilon", "fallback_min_sqnr", "max_saturation"):
            if not isinstance(settings[key], (int, float)) or isinstance(settings[key], bool) or settings[key] < 0:
                raise RuleSetError(f"[verdict] {key} must be a number >= 0, got {settings[key]!r}")
        if not isinstance(settings["samples"], int) or isinstance(settings["samples"], bool) or settings["samples"] < 1:
            raise RuleSetError(f"[verdict] samples must be a whole number >= 1, got {settings['samples']!r}")
        if settings["runtime"] not in ("exact", "optimized"):
            raise RuleSetError(f"[verdict] runtime must be \"exact\" or \"optimized\", got {settings['runtime']!r}")
        return cls(**settings, **{k: v for k, v in gates.items() if v is not None})

    def allowed(self, input_to_twin: float, deep: bool = False) -> float:
        """The farthest a candidate may be from the float twin, given how far the input is: an output's,
        or (`deep`) the network's deepest quantized tensors'."""
        if deep:
            return input_to_twin * (1 + self.deep_margin) + self.deep_epsilon
        return input_to_twin * (1 + self.margin) + self.epsilon

    def describe(self, twin: bool, deep: bool = False) -> str:
        """The criterion line of the report; `deep` when the deepest quantized tensors were judged too."""
        if twin:
            text = f"distance from the float twin at most the input's × {1 + self.margin:g} + {self.epsilon:g}"
            if deep:
                text += (f" per output, × {1 + self.deep_margin:g} + {self.deep_epsilon:g} for the deepest "
                         "quantized tensors")
        else:
            text = f"SQNR against the input >= {self.fallback_min_sqnr:g} dB"
        gates = [f"atol {self.atol:g}, rtol {self.rtol:g}"] if math.isfinite(self.atol) else []
        gates += [f"SQNR >= {self.min_sqnr:g} dB"] if self.min_sqnr is not None else []
        return text + "".join(f"; {g}" for g in gates)


def judge(
    reference: Path,
    candidate: Path,
    ruleset: RuleSet,
    criterion: Criterion,
    samples: list[dict[str, np.ndarray]] | None = None,
    inputs_label: str = "",
    seed: int = 0,
    shapes: dict[str, tuple[int, ...]] | None = None,
    exact: bool = False,
    opened: list | None = None,
    twin: Twin | None = None,
) -> VerifyResult:
    """Run the reference (the input model), its float twin and the candidate, and decide per output.

    `samples` are the user's feeds; without them random inputs the model is meant to see are drawn
    (`seed`, `shapes` for dynamic dimensions). `exact`: the change claims to keep every output bit for bit.
    `opened`: a one-item list holding onnxruntime's session of the candidate file (optimisations off),
    when the caller has built one (`qdq fix` has, to check the file it writes); the verdict takes it.
    `twin`: the reference's float twin, when the caller has built it (`qdq fix --calibrate`, for its search);
    the verdict adds outputs to it.
    """
    reference, candidate = Path(reference), Path(candidate)
    proto = onnx.load(str(reference), load_external_data=False)
    progress.tick()  # each read of a 100k-node file takes about a second
    fixed = onnx.load(str(candidate), load_external_data=False)
    progress.tick()
    optimized = criterion.runtime == "optimized" and not exact
    # The caller's session of the candidate file may stand for the fixed model's run (optimisations off, outputs
    # only, weights small enough to keep it while the others run); otherwise it is freed here.
    built = opened.pop() if opened else None
    if built is not None and (optimized or exact or not small_weights(fixed)):
        built = None
    with start_element_types(proto) as typing:  # on a large model, in a child while the twin is built
        if exact:
            twin = Twin(None, 0, "the change claims to be exact")
        elif twin is None:
            twin = float_twin(proto, ruleset.params_of("QDQ006"), reference.parent)
        if twin.model is not None and samples is None:
            watch(twin)  # the twin also outputs what its quantizers read: random inputs are chosen on it
        deep = _deepest(proto, fixed, twin) if twin.model is not None and not optimized else []
        types = element_types(proto, typing)  # the twin's and the region's tensors are the input's, where they have its names
    observe = (criterion, samples, inputs_label, seed, shapes, proto.graph)
    runtime = "onnxruntime, default optimisations" if optimized else "onnxruntime, optimisations off"
    try:
        runs = _Runs(reference, proto, candidate, fixed, twin, optimized, exact, deep, types, built)
        del built  # held by the fixed model's pieces when they run in it, otherwise freed now
        samples, inputs_label, (ref_out, cand_out, twin_out) = _observe(runs, *observe)
    except _OptimizedRefused as refused:  # the input itself does not run as users run it: judge what the file says
        runtime = f"onnxruntime, optimisations off (the input model fails with its default optimisations: {refused})"
        runs = _Runs(reference, proto, candidate, fixed, twin, False, exact, deep, types)
        samples, inputs_label, (ref_out, cand_out, twin_out) = _observe(runs, *observe)
    runs.close()
    result = VerifyResult(
        reference=str(reference), candidate=str(candidate), inputs=inputs_label, atol=criterion.atol,
        rtol=criterion.rtol, min_sqnr=criterion.min_sqnr,
        twin=f"float twin ({twin.pairs} activation Q/DQ pair(s) removed)" if twin_out is not None
        else f"no float twin: {twin.reason}",
        runtime=runtime,
    )
    if exact:
        result.integers = sorted(runs.integers)
        result.integers_differing = [name for name in result.integers if not runs.same_integers(name)]
    for name in runs.output_names:
        a, b = ref_out[name], cand_out[name]
        check_same_shape(name, a, b, reference, candidate)
        row = compare_arrays(name, a, b, criterion.atol, criterion.rtol, criterion.min_sqnr)
        basis = twin_out[name] if twin_out is not None else a
        row.no_evidence = _no_evidence(name, ref_out, twin_out, len(samples))
        if exact:
            held, row.verdict_failure = row.identical, "not bit-identical"
        elif twin_out is not None:
            row.input_to_twin = _distance(a, basis)
            row.candidate_to_twin = _distance(b, basis)
            row.allowed = criterion.allowed(row.input_to_twin)
            held, row.verdict_failure = row.candidate_to_twin <= row.allowed, "further from the float twin"
        else:
            held, row.verdict_failure = row.sqnr_db >= criterion.fallback_min_sqnr, "SQNR too low"
        if held:
            row.verdict_failure = ""
        gates = exact or row.passed  # the user's --atol/--rtol/--min-sqnr; an exact claim is held to identity alone
        row.passed = gates and row.evidence and held
        result.outputs.append(row)
    if runs.deep and twin_out is not None:
        result.network = _network(runs.deep, ref_out, cand_out, twin_out, len(samples), criterion)
    result.criterion = "bit-identical outputs and quantized integers" if exact else \
        criterion.describe(twin_out is not None, result.network is not None)
    return result


def _network(names: list[str], ref_out: dict, cand_out: dict, twin_out: dict, samples: int,
             criterion: Criterion) -> OutputComparison | None:
    """The network's deepest quantized tensors judged as one output: each scaled by its twin value's norm
    and all joined, so the row's distance from the twin is the root mean square of theirs. A fix that
    breaks a layer shows here even where the outputs barely move on the inputs used (a recognizer's
    softmax on noise is mostly 'blank'). Tensors without evidence on these inputs are left out."""
    told = [n for n in names if _evidence(n, ref_out, twin_out, samples)]
    if not told:
        return None
    scale = {n: 1.0 / float(np.linalg.norm(twin_out[n].astype(np.float64))) for n in told}
    a, b, t = (np.concatenate([values[n].astype(np.float64).ravel() * scale[n] for n in told])
               for values in (ref_out, cand_out, twin_out))
    row = compare_arrays(f"deepest {len(told)} quantized tensors", a, b, math.inf, 0.0, None)
    row.shape = (len(told),)
    row.input_to_twin, row.candidate_to_twin = _distance(a, t), _distance(b, t)
    row.allowed = criterion.allowed(row.input_to_twin, deep=True)
    row.passed = row.candidate_to_twin <= row.allowed
    row.verdict_failure = "" if row.passed else "further from the float twin"
    return row


def _observe(runs: _Runs, criterion: Criterion, samples: list | None, label: str, seed: int, shapes: dict | None,
             graph: onnx.GraphProto):
    """(samples, label, (input's, candidate's, twin's outputs)) on the user's samples; without them on random
    inputs the model is meant to see, and when those tell nothing, on white noise over the whole input range.
    `graph` is the input model's, already read."""
    if samples is not None:
        return samples, label, runs.outputs(samples, label)
    progress.step("choosing random inputs")
    drawn = RandomInputs(runs.reference, shapes, range_from=runs.candidate, graph=graph)
    attempts = ((runs.twin, runs.twin_pieces, seed), (Twin(None, 0), None, seed + 1))
    for number, (chosen, probe, first) in enumerate(attempts, 1):
        samples, label, twin_out = meant_inputs(drawn, chosen, probe, criterion, first, shapes)
        # The twin ran first, on these samples: where its outputs already tell nothing, so will the three together,
        # and the input and fixed models need not run on them.
        told = twin_out is None or all(_evidence(name, twin_out, None, len(samples)) for name in runs.output_names)
        if told or number == len(attempts):
            outputs = runs.outputs(samples, label, twin_out)
            if all(_evidence(name, outputs[0], outputs[2], len(samples)) for name in runs.output_names):
                break
        log.info("the reference's outputs carry no information on %s; trying the input range whole", label)
    return samples, label, outputs


class _Runs:
    """The three models of a verdict, ready to run in pieces (`qdq.verification.pieces`): the input model, the fixed
    model's changed region (`qdq.verification.change`) fed with the input's values at its boundary, and the float twin."""

    def __init__(self, reference: Path, proto: onnx.ModelProto, candidate: Path, fixed: onnx.ModelProto,
                 twin: Twin, optimized: bool, exact: bool, deep: list[str], types: dict[str, int], built=None):
        self.reference, self.candidate, self.twin, self.optimized = reference, candidate, twin, optimized
        self.deep = deep
        self.output_names = [o.name for o in proto.graph.output if o.name not in deep]
        check_same_outputs(reference, candidate, self.output_names,
                           [o.name for o in fixed.graph.output if o.name not in deep])
        progress.step("finding what the fix changed")
        cut = not optimized and not uncuttable(proto, types) and not uncuttable(fixed)
        self.region = changed_region(proto, reference.parent, fixed, candidate.parent) if cut else whole(fixed)
        log.info("the fixed model differs from the input in %d of its %d nodes", self.region.nodes, self.region.of)
        # Where the fix changed most of the model, running `built`, the session of the whole file, costs less
        # than building the region's pieces; not when the deepest tensors are read out, which the file's
        # session does not output.
        if built is not None and not deep and self.region.nodes * 2 >= self.region.of:
            self.region = whole(fixed)
        else:
            built = None
        # An exact change is held to the integers too: the quantized tensors of its region the input also computes.
        computed = {o: n for n in proto.graph.node for o in n.output} if exact else {}
        self.quantizers = {n.output[0]: (computed[n.output[0]], n) for n in self.region.model.graph.node
                           if exact and n.op_type == "QuantizeLinear" and n.output[0] in computed}
        self.integer_names = list(self.quantizers)
        self._grids = (Quantizers(proto.graph, reference.parent), Quantizers(fixed.graph, candidate.parent)) \
            if self.quantizers else ()
        self.integers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # Both were found cuttable above, and so is the region (a part of the fixed model, typed by the input's types).
        self.reference_pieces = Pieces(proto, reference.parent, keep=self.region.boundary + self.integer_names,
                                       optimized=optimized, types=types, cuttable=cut)
        self.region_pieces = Pieces(self.region.model, candidate.parent, keep=self.integer_names, optimized=optimized,
                                    types=types, cuttable=cut, session=built) \
            if self.region.model.graph.output or self.integer_names else None
        self.twin_pieces = Pieces(twin.model, reference.parent, types=types, reused=True) \
            if twin.model is not None else None

    def outputs(self, samples: list[dict], label: str, twin_out: dict | None = None) -> tuple[dict, dict, dict | None]:
        """Each model's outputs by name over all samples: the input's, the candidate's, the twin's
        (`twin_out` when the caller has them). The input runs first: when it fails, the input is at fault."""
        names = self.output_names + self.deep
        integers = self.integer_names
        ref_runs = self._run(self.reference_pieces, samples, names + self.region.boundary + integers, 0, label)
        cand_runs = [{name: run[name] for name in self.region.unchanged_outputs} for run in ref_runs]
        if self.region_pieces is not None:
            fed = [{**feeds, **{name: run[name] for name in self.region.boundary}}
                   for feeds, run in zip(samples, ref_runs)]
            changed = self._run(self.region_pieces, fed, self.region_pieces.outputs + integers, 1, label)
            for run, values in zip(cand_runs, changed):
                run.update(values)
        self.integers = {name: (joined(ref_runs, [name])[name], joined(cand_runs, [name])[name]) for name in integers}
        if twin_out is None and self.twin_pieces is not None:
            twin_out = joined(self._run(self.twin_pieces, samples, names, 2, label), names)
        as_arrays = [{name: as_array(value, name, path) for name, value in joined(runs, names).items()}
                     for runs, path in ((ref_runs, self.reference), (cand_runs, self.candidate))]
        return as_arrays[0], as_arrays[1], twin_out

    def close(self) -> None:
        """Free the sessions kept for more runs, one at a time, so the progress line moves between them."""
        for pieces in (self.reference_pieces, self.region_pieces, self.twin_pieces):
            if pieces is not None:
                pieces.close()

    def same_integers(self, name: str) -> bool:
        """Whether the quantized tensor `name` stands for the same values in both models: the same scale, and the
        same integers less the zero point (the integers themselves where the parameters are not constants)."""
        values = self.integers[name]
        grids = [_grid(q, quantizers) for q, quantizers in zip(self.quantizers[name], self._grids)]
        if None in grids:
            return bool(np.array_equal(*values))
        (scale_a, zero_a), (scale_b, zero_b) = grids
        if not np.array_equal(scale_a.ravel(), scale_b.ravel()) or zero_a.size != zero_b.size:
            return False
        if zero_a.size > 1:  # per axis: the same zero points and the same integers
            return bool(np.array_equal(zero_a, zero_b) and np.array_equal(*values))
        offsets = [v.astype(np.int64) - z.astype(np.int64).ravel()[0] for v, z in zip(values, (zero_a, zero_b))]
        return bool(np.array_equal(*offsets))

    def _run(self, pieces: Pieces, samples: list[dict], names: list[str], number: int, label: str) -> list[dict]:
        """One model's run; a failure is blamed on the input (exit 2), qdq (a bug) or the twin (a bug)."""
        what = ("the input model", "the fixed model" if self.region.nodes == self.region.of else
                f"the fixed model's {self.region.nodes} changed node(s)", "the float twin")[number]
        path = (self.reference, self.candidate, self.reference)[number]
        try:
            return pieces.run(samples, names, what)
        except PieceFailed as failed:
            if failed.building and number == 0 and self.optimized:
                raise _OptimizedRefused(failed.detail[:200]) from None
            if failed.building and number == 0:
                raise QdqError(cannot_load(path, failed)) from None
            if number == 0:
                where = f" on {label}" if label else ""
                raise UnfeedableInput(path, f"onnxruntime cannot run the model{where} ({failed.detail}); "
                                            "give --inputs") from None
            if number == 1:
                raise CandidateFailed(cannot_load(path, failed) if failed.building else f"{path}: {failed.detail}") \
                    from None
            raise QdqError(f"{path}: onnxruntime cannot {'load' if failed.building else 'run'} its float twin "
                           f"({failed.detail}); this is a bug in qdq") from None


# How many of the deepest quantized tensors the verdict judges besides the outputs: enough to see
# the head of a network, few enough to hold in memory for every sample (4 to 32 measured on the
# trained corpus: docs/benchmarks.md).
_DEEPEST = 16


def _deepest(proto: onnx.ModelProto, fixed: onnx.ModelProto, twin: Twin) -> list[str]:
    """The last `_DEEPEST` tensors, in graph order, that the input model dequantizes from an activation
    quantizer, the twin computes in float and the fixed model computes too (by name): they become extra
    outputs of all three models. Not with onnxruntime's optimisations: an internal tensor read out
    keeps onnxruntime from fusing its node unit, and the fused kernels are what is judged there."""
    computed = {name for node in fixed.graph.node for name in node.output}
    outputs = {o.name for o in proto.graph.output}
    deep = [name for name in twin.dequantized if name in computed and name not in outputs][-_DEEPEST:]
    for model in (proto, fixed, twin.model):
        declared = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in deep if name not in declared)
    twin.outputs += [name for name in deep if name not in twin.outputs]
    return deep


def _grid(q: onnx.NodeProto, quantizers: Quantizers) -> tuple[np.ndarray, np.ndarray] | None:
    """A QuantizeLinear's (scale, zero point) where both are constants; a missing zero point is 0."""
    scale = quantizers.constant(q.input[1]) if len(q.input) > 1 else None
    zero = quantizers.constant(q.input[2]) if len(q.input) > 2 and q.input[2] else (np.zeros(1, np.int64), 0)
    return None if scale is None or zero is None else (np.asarray(scale[0]), np.asarray(zero[0]))


def _uninformative(values: np.ndarray, samples: int) -> str:
    """Why these values tell nothing (not finite, one value everywhere: all zero, saturated; the same for
    every sample), or "" when they tell something."""
    if values.size == 0 or values.dtype.kind not in "biuf":
        return "no numbers"
    flat = values.astype(np.float64, copy=False).ravel()
    if not np.all(np.isfinite(flat)):
        return "NaN or inf"
    if np.ptp(flat) == 0:
        return f"{flat[0]:g} everywhere"
    return "" if _varies(values, samples) else "the same values for every sample"


def _no_evidence(name: str, ref_out: dict, twin_out: dict | None, samples: int) -> str:
    """Why an output is no evidence ("" when it is): the input model's values and the twin's must both tell
    something. A detector whose quantized map is all zero on noise says nothing about a change, even where the
    twin's map is not; integer inputs that random draws leave at zero feed every sample alike."""
    told = [("the input model", ref_out[name])] + ([("the float twin", twin_out[name])] if twin_out is not None else [])
    return next((f"{who} writes {why}" for who, values in told if (why := _uninformative(values, samples))), "")


def _evidence(name: str, ref_out: dict, twin_out: dict | None, samples: int) -> bool:
    return not _no_evidence(name, ref_out, twin_out, samples)


def _varies(values: np.ndarray, samples: int) -> bool:
    """Whether the samples' outputs (concatenated on axis 0) differ; one sample always counts as varying."""
    if samples < 2 or values.ndim == 0 or values.shape[0] % samples:
        return True
    parts = np.split(values, samples)
    return any(not np.array_equal(parts[0], part, equal_nan=True) for part in parts[1:])


def _distance(values: np.ndarray, basis: np.ndarray) -> float:
    """Relative L2 distance of `values` from `basis` (0 when equal; inf from an all-zero basis)."""
    a, b = basis.astype(np.float64).ravel(), values.astype(np.float64).ravel()
    norm, diff = float(np.linalg.norm(a)), float(np.linalg.norm(b - a))
    if diff == 0.0:
        return 0.0
    return diff / norm if norm > 0 else math.inf
