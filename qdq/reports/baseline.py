"""Baselines: record today's findings once, then fail CI only on new ones.

An entry is a finding's identity (rule, node, tensors) and its model's path relative to the
baseline file's folder, so the file can be committed and used from any working directory, and a
reworded message or a changed value still matches. The same identity twice is two entries: a
third occurrence is new.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from qdq.engine.lint import LintResult, identity
from qdq.reports.json import dumps
from qdq.support.errors import QdqError
from qdq.support.files import atomic_write_text

VERSION = 1
_ENTRY_KEYS = {"model", "code", "node", "tensors"}

Entry = tuple[str, str, str | None, tuple[str, ...]]


class BaselineError(QdqError):
    """A baseline file that is missing or is not one `--write-baseline` wrote."""


def write_baseline(path: Path, results: list[LintResult]) -> int:
    """Record every finding of `results` in `path`; return how many."""
    entries = [entry for result in results for entry in _result_entries(result, path.parent)]
    entries.sort(key=lambda e: (e[0], e[1], e[2] or "", e[3]))
    document = {
        "version": VERSION,
        "tool": "qdq",
        "findings": [dict(zip(("model", "code", "node", "tensors"), entry)) for entry in entries],
    }
    atomic_write_text(path, dumps(document))
    return len(entries)


def load_baseline(path: Path) -> Counter[Entry]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"{path}: baseline file not found (create it with --write-baseline)") from None
    except IsADirectoryError:
        raise BaselineError(f"{path}: baseline file is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read baseline file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: baseline file is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != VERSION:
        raise BaselineError(f"{path}: not a qdq baseline (version {VERSION}); rewrite it with --write-baseline")
    findings = document.get("findings")
    if not isinstance(findings, list) or not all(_valid(entry) for entry in findings):
        raise BaselineError(f"{path}: `findings` must be a list of {{model, code, node, tensors}} objects")
    return Counter((f["model"], f["code"], f["node"], tuple(f["tensors"])) for f in findings)


def drop_baselined(results: list[LintResult], baseline: Counter[Entry], baseline_path: Path) -> int:
    """Remove from `results` the findings the baseline records; return how many were removed."""
    remaining = baseline.copy()
    dropped = 0
    for result in results:
        kept = []
        for finding, entry in zip(result.findings, _result_entries(result, baseline_path.parent)):
            if remaining[entry] > 0:
                remaining[entry] -= 1
                dropped += 1
            else:
                kept.append(finding)
        result.findings[:] = kept
    return dropped


def _result_entries(result: LintResult, folder: Path) -> list[Entry]:
    model = Path(os.path.relpath(os.path.abspath(result.model_path), os.path.abspath(folder))).as_posix()
    return [(model, *identity(finding)) for finding in result.findings]


def _valid(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == _ENTRY_KEYS
        and isinstance(entry["model"], str)
        and isinstance(entry["code"], str)
        and (entry["node"] is None or isinstance(entry["node"], str))
        and isinstance(entry["tensors"], list)
        and all(isinstance(t, str) for t in entry["tensors"])
    )
