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


# --- the README is a product page; the details live in docs/ ------------------------------------


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short_and_has_no_development_history() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for words in ("issue ", "done-when", "not met", "Layout"):
        assert words not in text, words


def test_every_relative_link_resolves() -> None:
    import re

    for page in _markdown_files():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_the_rule_reference_is_current() -> None:
    from qdq.reports.rule_docs import reference_markdown

    written = (ROOT / "docs" / "rules.md").read_text()
    assert written == reference_markdown(), "docs/rules.md is stale: run `python -m qdq.reports.rule_docs docs/rules.md`"


def test_the_quick_start_shows_what_qdq_prints(tmp_path) -> None:
    """Every output line the README quotes for the bundled model is one qdq prints today."""
    from cli_run import qdq

    model = ROOT / "examples" / "models" / "demo_fx_qat.onnx"
    lint = qdq("lint", model, "--target", "npu")
    fix = qdq("fix", model, "--target", "npu", "-o", tmp_path / "demo_npu.onnx")
    printed = {line.replace(str(model), "examples/models/demo_fx_qat.onnx").replace(str(tmp_path / "demo_npu.onnx"), "demo_npu.onnx")
               for line in (lint.out + fix.out).splitlines()}
    quoted = [line for line in (ROOT / "README.md").read_text().splitlines()
              if line.startswith(("examples/models/demo_fx_qat.onnx", "QDQ", "logits ", "criterion: "))]
    assert len(quoted) >= 6
    assert [line for line in quoted if line not in printed] == []
