"""Pair the layers of two engines of the same network.

Layers are paired in execution order. First, anchors: layers with the same full name, or sharing a
name that survives re-export (an initializer such as `features.3.conv.2.weight`, or a path-style
node name), unique in both engines. Between anchors, a sequence alignment pairs the rest by role,
layer kind, tensor shapes and index-style node names (which match only when the ONNX files come
from one export). Layers left unpaired are the ones present in one engine only: that is how an
extra Q/DQ reformat shows up.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from qdq.trt.layers import Engine, Layer


@dataclass
class Pair:
    """One row of the alignment: a layer of A, of B, or both."""

    a: Layer | None
    b: Layer | None
    how: str  # "name", "nodes", "shape" or "" for an unpaired layer
    region: str = ""


def align(a: Engine, b: Engine) -> list[Pair]:
    """Both engines' layers in one sequence, paired where they are the same network layer."""
    anchors = _anchors(a.layers, b.layers)
    pairs: list[Pair] = []
    ai = bi = 0
    for aj, bj, how in anchors + [(len(a.layers), len(b.layers), "")]:
        pairs += _align_gap(a.layers[ai:aj], b.layers[bi:bj])
        if aj < len(a.layers):
            pairs.append(Pair(a.layers[aj], b.layers[bj], how))
        ai, bi = aj + 1, bj + 1
    pairs = _pair_reordered(pairs)
    _assign_regions(pairs)
    return pairs


def _anchors(a: list[Layer], b: list[Layer]) -> list[tuple[int, int, str]]:
    """Pairs certain by name, kept only where they agree with execution order (longest increasing run)."""
    candidates: dict[tuple[int, int], str] = {}
    for key_of, how in ((lambda layer: [layer.name], "name"), (lambda layer: sorted(layer.stable_nodes), "nodes")):
        index_a, index_b = _unique_keys(a, key_of), _unique_keys(b, key_of)
        for key, i in index_a.items():
            j = index_b.get(key)
            if j is not None and a[i].role == b[j].role:
                candidates.setdefault((i, j), how)
    # A layer of A may point to two layers of B through two names (a split fusion): keep neither.
    used_a = [i for i, _ in candidates]
    used_b = [j for _, j in candidates]
    unique = sorted((i, j) for i, j in candidates if used_a.count(i) == 1 and used_b.count(j) == 1)
    return [(i, j, candidates[(i, j)]) for i, j in _increasing(unique)]


def _unique_keys(layers: list[Layer], key_of) -> dict[str, int]:
    seen: dict[str, int] = {}
    repeated: set[str] = set()
    for i, layer in enumerate(layers):
        for key in key_of(layer):
            if key in seen:
                repeated.add(key)
            seen[key] = i
    return {k: i for k, i in seen.items() if k not in repeated}


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest subsequence of (i, j) pairs (sorted by i) whose j also increase."""
    tails: list[int] = []  # tails[k]: smallest j ending an increasing run of length k + 1
    tail_at: list[int] = []  # index into pairs of that run's last element
    previous = [-1] * len(pairs)
    for n, (_, j) in enumerate(pairs):
        k = bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            tail_at.append(n)
        else:
            tails[k], tail_at[k] = j, n
        previous[n] = tail_at[k - 1] if k else -1
    run, n = [], tail_at[-1] if tail_at else -1
    while n >= 0:
        run.append(pairs[n])
        n = previous[n]
    return run[::-1]


def _align_gap(a: list[Layer], b: list[Layer]) -> list[Pair]:
    """Needleman-Wunsch over the layers between two anchors: maximise the summed similarity."""
    if not a or not b:
        return [Pair(x, None, "") for x in a] + [Pair(None, y, "") for y in b]
    n, m = len(a), len(b)
    score = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            s = similarity(a[i], b[j])
            best = max(score[i + 1][j], score[i][j + 1])
            score[i][j] = max(best, score[i + 1][j + 1] + s) if s > 0 else best
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        s = similarity(a[i], b[j])
        if s > 0 and score[i][j] == score[i + 1][j + 1] + s:
            pairs.append(Pair(a[i], b[j], "name" if a[i].name == b[j].name else "shape"))
            i, j = i + 1, j + 1
        elif score[i][j] == score[i + 1][j]:
            pairs.append(Pair(a[i], None, ""))
            i += 1
        else:
            pairs.append(Pair(None, b[j], ""))
            j += 1
    return pairs + [Pair(x, None, "") for x in a[i:]] + [Pair(None, y, "") for y in b[j:]]


def similarity(x: Layer, y: Layer) -> float:
    """How likely two layers are the same network layer; 0 means never pair them."""
    if not _roles_match(x, y) or x.qdq_direction != y.qdq_direction:
        return 0.0
    if x.name == y.name:
        return 10.0
    if x.stable_nodes and y.stable_nodes:
        shared = x.stable_nodes & y.stable_nodes
        return 5.0 + len(shared) / len(x.stable_nodes | y.stable_nodes) if shared else 0.0
    score = 0.0
    if x.detailed and y.detailed:
        if x.kind != y.kind or _dims(x.outputs) != _dims(y.outputs):
            return 0.0
        score += 2.0 + (1.0 if _dims(x.inputs) == _dims(y.inputs) else 0.0)
    if set(x.onnx_nodes) & set(y.onnx_nodes):
        score += 2.0
    elif x.ops == y.ops and (x.ops or not (x.detailed and y.detailed)):
        score += 1.0  # names-only files have nothing else to go by: order and op types
    return score


def _roles_match(x: Layer, y: Layer) -> bool:
    """Same role; a names-only layer cannot tell a NoOp from a compute layer."""
    if x.role == y.role:
        return True
    return not (x.detailed and y.detailed) and {x.role, y.role} == {"noop", "compute"}


def _pair_reordered(pairs: list[Pair]) -> list[Pair]:
    """Pair layers that share a stable name but run in a different order (TensorRT may swap two
    branches, e.g. a downsample conv and the main conv); the row stays at B's position."""
    only_a = [p for p in pairs if p.b is None and p.a.stable_nodes]
    merged: set[int] = set()
    for row in pairs:
        if row.a is not None or not row.b.stable_nodes:
            continue
        match = next((p for p in only_a if id(p) not in merged and p.a.role == row.b.role
                      and p.a.stable_nodes & row.b.stable_nodes), None)
        if match is not None:
            merged.add(id(match))
            row.a, row.how = match.a, "nodes"
    return [p for p in pairs if id(p) not in merged]


def _dims(tensors) -> list:
    return [t.dims for t in tensors]


def _assign_regions(pairs: list[Pair]) -> None:
    """A row's region: its own module name, else its partner's, else the previous row's."""
    region = "(input)"
    for pair in pairs:
        own = [layer.own_region for layer in (pair.a, pair.b) if layer is not None and layer.own_region]
        region = own[0] if own else region
        pair.region = region
