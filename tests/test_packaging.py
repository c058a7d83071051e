"""The wheel a user installs: the `qdq` script comes from the package, the licence and rule sets ship, no stray modules."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qdq import __version__

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources, so the build leaves nothing in the checkout."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "cli.py"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("qdq", "rules"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"), str(source)],
        check=True, capture_output=True, timeout=120,
    )
    [built] = (work / "dist").glob("qdq-*.whl")
    return built


def _console_scripts(archive: zipfile.ZipFile) -> dict[str, str]:
    [name] = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    entry_points = configparser.ConfigParser()
    entry_points.read_string(archive.read(name).decode())
    return dict(entry_points["console_scripts"])


def test_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "qdq/cli.py" in names and "qdq/__main__.py" in names
        package = Path(__file__).resolve().parent.parent / "qdq"
        sources = {f"qdq/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py") if "__pycache__" not in p.parts}
        assert sources - set(names) == set(), "modules of the checkout the wheel leaves out (pyproject's package list)"
        assert {"qdq/rules/common.toml", "qdq/rules/npu.toml", "qdq/rules/trt.toml", "qdq/rules/ort.toml"} <= set(names)
        assets = {"dagre.min.js", "dagre.LICENSE", "README.md", "graph.js", "engine_view.js", "onnx_view.js"}
        assert {f"qdq/reports/assets/{name}" for name in assets} <= set(names)  # the HTML reports inline them
        [licence] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert "Apache License" in archive.read(licence).decode()
        assert [n for n in names if "/" not in n] == [], "the wheel installs top-level modules"
        assert _console_scripts(archive) == {"qdq": "qdq.cli:entry_point"}
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert {"Homepage", "Repository", "Issues", "Documentation"} <= {
        line.split(": ", 1)[1].split(",")[0] for line in text.splitlines() if line.startswith("Project-URL: ")
    }


def test_the_installed_script_runs_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    """The console script's entry point, loaded from the unpacked wheel with the checkout out of reach."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
        entry = _console_scripts(archive)["qdq"]
    script = (
        "import sys\n"
        "from importlib.metadata import EntryPoint\n"
        "import qdq\n"
        "print(qdq.__file__)\n"
        "sys.argv = ['qdq', '-V']\n"
        f"EntryPoint('qdq', {entry!r}, 'console_scripts').load()()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    location, version = proc.stdout.splitlines()
    assert Path(location).is_relative_to(tmp_path / "site")
    assert version == f"qdq {__version__}"
    assert not (tmp_path / "site" / "cli.py").exists()


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags(capsys, flag: str) -> None:
    import cli

    assert cli.main([flag]) == 0
    assert capsys.readouterr().out == f"qdq {__version__}\n"


def test_checkout_shim_and_python_m_qdq_run_the_same_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for module in ("qdq", "cli"):
        proc = subprocess.run([sys.executable, "-m", module, "-V"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"qdq {__version__}\n", ""), module
