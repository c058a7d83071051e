"""Read `trtexec --exportProfile` files and attach the times to an engine's layers.

trtexec writes layer names into this file without JSON escaping, so a name with a quote or a
backslash breaks `json.loads`; such files are read row by row instead. TRT 8.2 writes no
`medianMs`; the first element is a `{"count": N}` header.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from qdq.trt.layers import Engine, EngineFileError, read_text

_NUMBER = r"(-?[0-9.]+(?:[eE][-+]?\d+)?|-?nan|-?inf)"
_ROW = re.compile(
    r'\{\s*"name"\s*:\s*"(?P<name>.*?)"\s*,\s*"timeMs"\s*:\s*' + _NUMBER
    + r'\s*,\s*"averageMs"\s*:\s*' + _NUMBER
    + r'(?:\s*,\s*"medianMs"\s*:\s*' + _NUMBER + r")?"
    + r'\s*,\s*"percentage"\s*:\s*' + _NUMBER + r"\s*\}"
)


@dataclass(frozen=True)
class ProfileRow:
    name: str
    average_ms: float
    median_ms: float | None


def load_profile(path: str | Path) -> list[ProfileRow]:
    """The per-layer rows of a profile, in file order (the `count` header dropped)."""
    path = Path(path)
    text = read_text(path)
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        rows = _rows_by_pattern(text, path)
    except RecursionError:
        raise EngineFileError(f"{path}: not a trtexec --exportProfile file (nested too deeply to read)") from None
    else:
        rows = _rows_from_json(document, path)
    if not rows:
        raise EngineFileError(f"{path}: no layer rows; expected a trtexec --exportProfile file")
    return rows


def _rows_from_json(document: object, path: Path) -> list[ProfileRow]:
    if isinstance(document, dict) and "Layers" in document:
        raise EngineFileError(f"{path}: this is a --exportLayerInfo file, not a --exportProfile file")
    if not isinstance(document, list):
        raise EngineFileError(f"{path}: expected a trtexec --exportProfile list of rows")
    rows = []
    for i, item in enumerate(document):
        if isinstance(item, dict) and set(item) == {"count"}:
            continue
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not _is_number(item.get("averageMs")):
            raise EngineFileError(f"{path}: row {i} is not a {{name, averageMs, ...}} profile row")
        median = item.get("medianMs")
        rows.append(ProfileRow(item["name"], float(item["averageMs"]), float(median) if _is_number(median) else None))
    return rows


def _rows_by_pattern(text: str, path: Path) -> list[ProfileRow]:
    """Rows of a file that is not valid JSON because of unescaped names; trtexec writes one per line."""
    if not text.lstrip().startswith("["):
        raise EngineFileError(f"{path}: not valid JSON and not a trtexec --exportProfile file")
    rows = [ProfileRow(m.group("name"), float(m.group(3)), float(m.group(4)) if m.group(4) else None)
            for m in _ROW.finditer(text)]
    if rows and not text.rstrip().endswith("]"):
        raise EngineFileError(f"{path}: the profile is truncated (no closing ']')")
    return rows


def attach_profile(engine: Engine, rows: list[ProfileRow], path: Path) -> None:
    """Set each layer's `time_ms`: by name, or by position when the names differ but the counts match."""
    by_name: dict[str, list[ProfileRow]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row)
    matched = sum(1 for layer in engine.layers if layer.name in by_name)
    if matched == len(engine.layers):
        for layer in engine.layers:
            layer.time_ms = by_name[layer.name].pop(0).average_ms if by_name[layer.name] else 0.0
    elif len(rows) == len(engine.layers):
        for layer, row in zip(engine.layers, rows):
            layer.time_ms = row.average_ms
        engine.notes.append(f"{path.name}: layer names differ from the layer info; rows joined by position")
    elif matched:
        for layer in engine.layers:
            if by_name.get(layer.name):
                layer.time_ms = by_name[layer.name].pop(0).average_ms
        engine.notes.append(f"{path.name}: only {matched} of {len(engine.layers)} layers have a profile row")
    else:
        raise EngineFileError(f"{path}: no row names a layer of {engine.path.name}; is it the profile of another engine?")
    engine.profile_path = path


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
