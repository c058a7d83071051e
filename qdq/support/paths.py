"""Which models a `qdq lint PATH...` names: files as given, folders searched for `*.onnx`, and globs.

qdq expands globs itself, so a pattern quoted by a shell, a CI script or pre-commit still works.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from qdq.support.errors import QdqError

MODEL_SUFFIX = ".onnx"
_GLOB_CHARACTERS = "*?["


class NoModelError(QdqError):
    """A folder or pattern that names no model: most likely a typo, so the run stops."""


def model_paths(arguments: list[str]) -> list[Path]:
    """The models named by `arguments`, in the order given, each once.

    A file is linted whatever its name (a missing one is reported when it is read); a folder
    yields its `*.onnx` files, recursively and sorted; a pattern that is not an existing path is
    expanded as a glob (`**` spans folders). A folder or pattern without a model is an error.
    """
    found: dict[Path, None] = {}
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            models = _models_under(path)
            if not models:
                raise NoModelError(f"{path}: no {MODEL_SUFFIX} model in this directory")
        elif not path.exists() and any(c in argument for c in _GLOB_CHARACTERS):
            models = _matching(argument)
            if not models:
                raise NoModelError(f"{argument}: no {MODEL_SUFFIX} model matches this pattern")
        else:
            models = [path]
        for model in models:
            found.setdefault(Path(os.path.normpath(model)), None)
    return list(found)


def _models_under(folder: Path) -> list[Path]:
    """`*.onnx` files below `folder`, sorted; hidden folders (.git, .venv) are skipped, as their
    models (a virtualenv's onnx test data) are never the project's."""
    models = []
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        models += [Path(root) / name for name in files if name.endswith(MODEL_SUFFIX)]
    return sorted(models)


def _matching(pattern: str) -> list[Path]:
    models: list[Path] = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        path = Path(match)
        if path.is_dir():
            models += _models_under(path)
        elif path.name.endswith(MODEL_SUFFIX):
            models.append(path)
    return models
