"""The qdq package's import graph has no circle, counting imports inside functions too, and its
folders import only the layers below them.

A circle works until someone moves an import (rule → checks → insertion → rule did: the registry
imported the rule modules from inside a function of the module they import). Read from the
source with `ast`, so the test sees what a reader sees, not what happens to be imported first.
"""
from __future__ import annotations

import ast
import re
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
    assert len(graph) > 50 and graph["qdq.engine.registry"] >= {"qdq.checks", "qdq.rewrite.rule"}
    assert find_circle(graph) is None


# The package face: what users import and run. Everything else lives in a layer folder.
FACE = {"qdq", "qdq.api", "qdq.cli", "qdq.__main__"}


def layers() -> dict[str, set[str]]:
    """Each layer folder and the folders its `__init__` docstring says it may import."""
    found = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        if init.parent.name == "rules":
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = re.search(r"^May import: (.*)\.$", doc, re.M)
        assert said, f"{init.relative_to(PACKAGE.parent)}: its docstring must end with 'May import: ...'"
        names = said.group(1)
        found[init.parent.name] = set() if names == "nothing else in qdq" else {n.strip() for n in names.split(",")}
    return found


def layer_violations(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    """Imports from one layer folder into another that its docstring does not allow, or into the face."""
    def layer(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in allowed) else None

    wrong = []
    for module, targets in sorted(graph.items()):
        here = layer(module)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer(target)
            if there is None and target in FACE - {"qdq"}:
                wrong.append(f"{module} imports the package face {target}")
            elif there not in (None, here) and there not in allowed[here]:
                wrong.append(f"{module} imports {target}: {here} may import {sorted(allowed[here]) or 'nothing'}")
    return wrong


def test_nothing_flat_in_qdq_but_the_face():
    flat = {name for name in modules() if name.count(".") == 1 and (PACKAGE / f"{name.split('.')[1]}.py").exists()}
    assert flat == FACE - {"qdq"}


def test_the_layers_allowed_form_no_circle():
    allowed = layers()
    assert {"support", "graph", "quant", "rewrite", "checks", "engine", "verification"} <= allowed.keys()
    assert all(allowed[name] <= allowed.keys() for name in allowed), "a layer names a folder that does not exist"
    assert find_circle(allowed) is None


def test_folders_import_only_the_layers_they_allow():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert layer_violations(graph, layers()) == []


def test_layer_violations_catches_an_upward_import():
    allowed = {"graph": {"support"}, "support": set(), "engine": {"graph", "support"}}
    graph = {"qdq.graph.ir": {"qdq.support.errors", "qdq.engine.lint"}, "qdq.support.errors": {"qdq.api"},
             "qdq.engine.lint": {"qdq.graph.ir", "qdq.engine.fix"}}
    assert layer_violations(graph, allowed) == [
        "qdq.graph.ir imports qdq.engine.lint: graph may import ['support']",
        "qdq.support.errors imports the package face qdq.api",
    ]


def test_qdq_works_without_onnx_graphsurgeon(tmp_path):
    """qdq's graph is its own (`qdq.graph.ir`): linting, fixing and saving never import graphsurgeon,
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
