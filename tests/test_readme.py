"""The README's set-up commands are what CI runs, so a new user's first command is tested."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("# qdq\n\n```sh\n"), "the README must open with its title, then the set-up commands"
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert "qdq lint examples/models/" in commands[0] and "qdq fix" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_commands_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install_and_test, install_and_run = _readme_commands()[1], _readme_commands()[0]
    assert install_and_test in ci
    assert any(install_and_run in line for line in ci)


def test_bundled_model_exists_and_is_small() -> None:
    model = ROOT / "examples" / "models" / "demo_fx_qat.onnx"
    assert model.is_file() and 0 < model.stat().st_size < 1_000_000
