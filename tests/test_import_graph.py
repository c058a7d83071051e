"""The qdq package's import graph has no circle, counting imports inside functions too.

A circle works until someone moves an import (rule → checks → insertion → rule did: the registry
imported the rule modules from inside a function of the module they import). Read from the
source with `ast`, so the test sees what a reader sees, not what happens to be imported first.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "qdq"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The qdq modules `name` imports (a `from package import module` counts as the module only)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            found |= submodules
            if base in known and len(submodules) < len(node.names):
                found.add(base)
    return found - {name}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path (first module repeated at the end), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (circle := visit(target)):
                return circle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module)):
            return circle
    return None


def test_find_circle_finds_one():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_qdq_imports_form_no_circle():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert len(graph) > 50 and graph["qdq.registry"] >= {"qdq.checks", "qdq.rule"}
    assert find_circle(graph) is None


def test_qdq_works_without_onnx_graphsurgeon(tmp_path):
    """qdq's graph is its own (`qdq.ir`): linting, fixing and saving never import graphsurgeon,
    whose internals an older importer used. The test models are built with it, so a fresh
    interpreter runs the check."""
    repo = Path(__file__).resolve().parent.parent
    script = (
        "import sys, logging\n"
        "logging.disable(logging.CRITICAL)\n"
        "import qdq, qdq.cli\n"
        f"model = {str(repo / 'examples' / 'models' / 'demo_fx_qat.onnx')!r}\n"
        "assert qdq.lint(model, target='npu').findings\n"
        "fixed = qdq.fix(model, target='npu')\n"
        f"qdq.save_model(fixed.model, {str(tmp_path / 'out.onnx')!r})\n"
        "assert 'onnx_graphsurgeon' not in sys.modules, 'imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 0, proc.stderr
