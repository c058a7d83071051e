"""Running a model in pieces: consecutive slices of its nodes, each its own onnxruntime session.

onnxruntime's session build grows faster than the node count (ladder models, optimisations off,
on a loaded 2-core machine: 1.1 s at 1k nodes, 14 s at 10k, 46 s at 20k), and a session holds
every weight it reads, so a model with GiB of weights needs that much memory per session. A slice
of at most `MAX_NODES` nodes and `MAX_BYTES` of weights builds in time proportional to its size
and holds only its own weights; slices run one after another, each freed before the next unless
the whole model is small, and pass on only the tensors later slices or the caller need.

With optimisations off every node runs its own kernel, so the values are those of one
whole-model session, bit for bit. With them on, a cut could split a fused node unit, so an
optimised run is one slice: the model whole, as users run it.
"""

from __future__ import annotations

import heapq
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from qdq.graph.checker_process import TypesProcess, start_types
from qdq.graph.element_types import inferred_element_types
from qdq.graph.normalize import without_weight_data
from qdq.support import progress
from qdq.verification.verify import RunFailed, run_all

log = logging.getLogger("qdq")

MAX_NODES = 5000
MAX_BYTES = 256 << 20
# Below this many bytes of weights in all, a model's slices keep their sessions between runs.
_KEEP_SESSIONS_BYTES = 512 << 20


class PieceFailed(Exception):
    """onnxruntime refused to build a slice (`building`) or to run one; `detail` is its first line."""

    def __init__(self, detail: str, building: bool):
        super().__init__(detail)
        self.detail, self.building = detail, building


@dataclass
class _Slice:
    nodes: list[onnx.NodeProto]
    reads: list[str]  # tensors it takes from the caller or from earlier slices
    gives: list[str]  # tensors it computes that later slices or the caller need
    weights: list[onnx.TensorProto]
    whole: bool = False  # the model itself, its outputs extended by what the caller asks for
    session: object = None


def uncuttable(model: onnx.ModelProto, types: dict[str, int] | None = None) -> str | None:
    """Why a cut could change the model's values (None when it cannot). onnxruntime's CPU computes
    float16 ops in float32 behind casts it places itself, so a cut would round to float16 what a
    whole run keeps in float32; a subgraph reads the graph around it by name, and a sparse
    initializer is not a node's plain input."""
    graph = model.graph
    half = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    computes_half = False
    for node in graph.node:  # one walk over the attributes: at 100k nodes each walk costs a second
        constant = node.op_type == "Constant"
        for a in node.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return "it has subgraphs"
            computes_half = computes_half or (a.name == "to" and a.i in half) or (constant and a.t.data_type in half)
    if len(graph.sparse_initializer):
        return "it has sparse initializers"
    declared = [*graph.input, *graph.output, *graph.value_info]
    if (computes_half or half & set((types or {}).values()) or any(t.data_type in half for t in graph.initializer)
            or any(v.type.tensor_type.elem_type in half for v in declared)):
        return "it computes in float16"
    return None


class Pieces:
    """A model to run in slices. `keep`: tensors the caller may ask for besides the model's outputs.

    Tensors the caller feeds need not be graph inputs: a region of a model cut out by
    `qdq.verification.change` reads the values another model computed.
    """

    def __init__(self, model: onnx.ModelProto, folder: Path, keep: list[str] = (), optimized: bool = False,
                 types: dict[str, int] | None = None, reused: bool = False, max_nodes: int = MAX_NODES,
                 max_bytes: int = MAX_BYTES, cuttable: bool = False, session=None):
        """`optimized`: onnxruntime's default optimisations, which fuse across any cut, so the model runs whole
        (as it also does when `uncuttable`); `reused`: the caller runs it more than once; `cuttable`: the
        caller has found `uncuttable(model, types)` None (a walk over the whole graph, not repeated);
        `session`: onnxruntime's session of the model whole, already built (of the file the model was read
        from), in which it runs."""
        self.model, self.folder, self.optimized = model, Path(folder), optimized
        self._types = types or {}  # element types of tensors passed between slices, where known beforehand
        self.outputs = [o.name for o in model.graph.output]
        graph = model.graph
        self._declared = {v.name: v for v in graph.input if v.HasField("type")}  # the others: typed by their values
        self._weights = {t.name: t for t in graph.initializer}
        if session is not None:
            inputs = [v.name for v in session.get_inputs()]
            self._slices = [_Slice(list(graph.node), inputs, list(dict.fromkeys([*self.outputs, *keep])), [], True,
                                   session)]
        elif optimized or (nodes := topological(graph)) is None or not cuttable and uncuttable(model, types):
            inputs = [v.name for v in graph.input if v.name not in self._weights]
            self._slices = [_Slice(list(graph.node), inputs, list(dict.fromkeys([*self.outputs, *keep])), [], True)]
        else:
            self._slices = self._cut(nodes, set(self.outputs) | set(keep), max_nodes, max_bytes)
        # Sessions are kept between runs when the caller runs the model again (`reused`: the twin, which
        # chooses the random inputs first) or when it is one slice, and the weights are small.
        self._keep_sessions = (reused or len(self._slices) == 1) and small_weights(model)

    @property
    def count(self) -> int:
        return len(self._slices)

    def run(self, samples: list[dict[str, np.ndarray]], names: list[str], what: str) -> list[dict[str, np.ndarray]]:
        """Per sample, the tensors `names`; `what` names the model on the progress line and in errors."""
        values = [dict(feeds) for feeds in samples]
        last_use = {name: i for i, piece in enumerate(self._slices) for name in piece.reads}
        wanted = set(names)
        for index, piece in enumerate(self._slices):
            self._build_pair(index, values[0], what)
            session = self._session(piece, values[0], index, what)
            progress.step(f"running {what}" + (f", piece {index + 1} of {self.count}" if self.count > 1 else ""))
            done = [n for n in piece.reads if last_use[n] == index and n not in wanted]
            for sample in values:
                feeds = {name: sample[name] for name in piece.reads if name in sample}
                try:
                    sample.update(run_all(session, Path(what), piece.gives, [feeds]))
                except RunFailed as exc:
                    raise PieceFailed(exc.detail, building=False) from None
                for name in done:
                    sample.pop(name, None)
            if not self._keep_sessions:
                piece.session = None
        missing = [n for n in names if n not in values[0]]
        if missing:
            raise PieceFailed(f"no value for {', '.join(missing)}", building=False)
        return [{name: sample[name] for name in names} for sample in values]

    def close(self) -> None:
        """Free the sessions kept between runs. onnxruntime frees a session holding the interpreter lock
        (a second or two at 100k nodes), so each is freed after a step of the progress line."""
        for piece in self._slices:
            if piece.session is not None:
                progress.step("freeing onnxruntime sessions")
                piece.session = None

    def _cut(self, nodes: list[onnx.NodeProto], wanted: set[str], max_nodes: int, max_bytes: float) -> list[_Slice]:
        groups, current, size = [], [], 0
        sizes = {name: _bytes(tensor) for name, tensor in self._weights.items()}
        for unit in progress.each(self._units(nodes), "cutting the model into pieces"):
            weight = sum(sizes[n] for node in unit for n in node.input if n in sizes)
            if current and (len(current) + len(unit) > max_nodes or size + weight > max_bytes):
                groups.append(current)
                current, size = [], 0
            current.extend(unit)
            size += weight
        groups.append(current)
        read_later: set[str] = set(wanted)
        slices: list[_Slice] = []
        for group in reversed(groups):  # what each slice must give is what later slices read
            progress.step("cutting the model into pieces")
            made = {o for n in group for o in n.output if o}
            reads = list(dict.fromkeys(i for n in group for i in n.input if i and i not in made))
            weights = [self._weights[n] for n in reads if n in self._weights]
            reads = [n for n in reads if n not in self._weights]
            gives = [o for n in group for o in n.output if o in read_later]
            slices.append(_Slice(group, reads, gives, weights))
            read_later |= set(reads)
        return slices[::-1]

    def _build_pair(self, index: int, example: dict[str, np.ndarray], what: str) -> None:
        """Build slice `index` and the next side by side when both still need a session and the next one's
        inputs are typed beforehand: onnxruntime builds without the interpreter lock, so two cores build two
        slices at once. Memory then holds two slices' sessions, whose weights are read as they run."""
        pair = self._slices[index:index + 2]
        if len(pair) < 2 or any(p.session is not None for p in pair) or not all(
                name in self._declared or name in self._types or name in example for name in pair[1].reads):
            return
        from qdq.support.runtime import sessions

        progress.step(f"building onnxruntime sessions for {what}, pieces {index + 1} and {index + 2} of {self.count}")
        for piece, made in zip(pair, sessions(*(self._source(p, example) for p in pair), optimized=self.optimized)):
            if not isinstance(made, Exception):  # a refusal is met again, and reported, when the slice is built alone
                piece.session = made

    def _source(self, piece: _Slice, example: dict[str, np.ndarray]):
        from qdq.support.runtime import InMemory

        data = self._slice_model(piece, example).SerializeToString()
        graph = self.model.graph
        weights = [*graph.initializer, *(t for sparse in graph.sparse_initializer for t in (sparse.values, sparse.indices))] \
            if piece.whole else piece.weights
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in weights)
        return InMemory(data, self.folder.resolve()) if external else data

    def _units(self, nodes: list[onnx.NodeProto]) -> list[list[onnx.NodeProto]]:
        """The nodes in groups no cut may split: each node with the nodes before it that compute only from
        weights (a weight's DequantizeLinear, a Constant). A cut between them would pass the dequantized
        weight, four times the int8 bytes, from slice to slice for every sample (4 GB for four samples of
        a 256 MiB weight); in one slice it is computed and dropped inside onnxruntime."""
        constant = set(self._weights)
        waiting: dict[str, list[onnx.NodeProto]] = {}  # output of a weight-only node -> it and the nodes it needs
        placed: set[int] = set()
        units = []
        for node in progress.each(nodes, "cutting the model into pieces"):
            inputs = [name for name in node.input if name]
            needs = list({id(n): n for name in inputs for n in waiting.get(name, [])}.values())
            if node.op_type == "Constant" or all(name in constant for name in inputs) and node.output:
                constant.update(o for o in node.output if o)  # computed from weights alone: it joins its first reader
                for name in node.output:
                    waiting[name] = needs + [node]
                continue
            needs = [n for n in needs if id(n) not in placed]
            placed.update(map(id, needs))
            units.append(needs + [node])
        for group in waiting.values():  # weight-only nodes no other node reads: graph outputs
            for node in group:
                if id(node) not in placed:
                    placed.add(id(node))
                    units.append([node])
        return units

    def _session(self, piece: _Slice, example: dict[str, np.ndarray], index: int, what: str):
        if piece.session is not None:
            return piece.session
        from qdq.support.runtime import session

        progress.step(f"building an onnxruntime session for {what}"
                      + (f", piece {index + 1} of {self.count}" if self.count > 1 else ""))
        try:
            made = session(self._source(piece, example), self.optimized)
        except Exception as exc:  # the caller says whose model it was
            raise PieceFailed(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__,
                              building=True) from None
        piece.session = made
        return made

    def _slice_model(self, piece: _Slice, example: dict[str, np.ndarray]) -> onnx.ModelProto:
        """The slice as a model: graph inputs keep their declared types; a tensor from an earlier slice
        or the caller is typed by the value in hand (its dimensions left free: samples may differ)."""
        if piece.whole:
            made = onnx.ModelProto()
            made.CopyFrom(self.model)
            declared = set(self.outputs)
            made.graph.output.extend(onnx.ValueInfoProto(name=n) for n in piece.gives if n not in declared)
            return made
        inputs = []
        for name in piece.reads:
            if name in self._declared:
                inputs.append(self._declared[name])
            elif name in self._types:
                inputs.append(helper.make_tensor_value_info(name, self._types[name], None))
            elif name in example:
                value = example[name]
                inputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(value.dtype), [None] * np.ndim(value)))
        outputs = [onnx.ValueInfoProto(name=name) for name in piece.gives]
        graph = helper.make_graph(piece.nodes, self.model.graph.name or "piece", inputs, outputs, piece.weights)
        made = helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)
        made.functions.extend(self.model.functions)
        return made


def small_weights(model: onnx.ModelProto) -> bool:
    """Whether the model's weights are small enough for sessions holding them to be kept between runs."""
    weights = progress.each(model.graph.initializer, "adding up the model's weights")
    return sum(map(_bytes, weights)) <= _KEEP_SESSIONS_BYTES


def start_element_types(model: onnx.ModelProto):
    """A context holding the shape inference of a large model, started in a child process
    (`qdq.graph.checker_process`: on 100k nodes it holds the interpreter lock for seconds), so that it runs
    while this process does other work; None inside for a small model. Give it to `element_types`."""
    return start_types(model) or nullcontext()


def element_types(model: onnx.ModelProto, started: TypesProcess | None = None) -> dict[str, int]:
    """The element type of each tensor onnx's shape inference can tell (none where it fails on the model);
    `started` what the context `start_element_types` gave for it holds."""
    doing = "reading the model's tensor types"
    if started is not None:
        types = started.element_types(doing)
        if types is not None:
            return types
    progress.step(doing)
    try:
        return inferred_element_types(without_weight_data(model))
    except Exception as exc:  # custom ops, models past 2 GB: slices are then typed by the values in hand
        log.debug("shape inference failed (%s); pieces are typed as they run", str(exc).splitlines()[0][:200])
        return {}


def joined(runs: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """Each tensor over all samples, concatenated on axis 0 (as `qdq.verification.verify.run_all` gives them)."""
    if len(runs) == 1:
        return {name: runs[0][name] for name in names}
    return {name: np.concatenate([np.atleast_1d(run[name]) for run in runs]) for name in names}


def _bytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return next((int(e.value) for e in tensor.external_data if e.key == "length"), 0)
    return tensor.ByteSize()


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def topological(graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    """The nodes, each after what it reads and otherwise in file order (None when there is no such order: a cycle)."""
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(progress.each(nodes, "ordering the nodes")) for o in n.output if o}
    if all(producer.get(name, -1) < i for i, n in enumerate(progress.each(nodes, "ordering the nodes"))
           for name in n.input):
        return nodes  # already in order, as exporters and qdq write models
    readers: dict[int, list[int]] = {}
    waiting = []
    for i, node in enumerate(nodes):
        sources = {producer[name] for name in node.input if name in producer} - {i}
        waiting.append(len(sources))
        for source in sources:
            readers.setdefault(source, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in readers.get(i, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    return order if len(order) == len(nodes) else None
