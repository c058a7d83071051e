"""What a new user types in their first hour, and what they must read back (issue 37)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import qdq

from qdq.engine.ruleset import builtin_targets

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"
TARGETS = builtin_targets()  # every shipped rule set, in the order commands list them


def test_trt_reports_the_uint8_activations_asymmetric_zero_points_once_with_what_it_needs():
    """onnxruntime's uint8 PTQ for TensorRT: QDQ505 lists each uint8 activation; QDQ503 says once
    that they stay asymmetric as int8, and what TensorRT needs (not "zero-point 0; needs 0")."""
    run = qdq("lint", CORPUS / "ort" / "resnet_u8_per_tensor.onnx", "--target", "trt", "--format", "json")
    findings = run.json()["findings"]
    asymmetric = [f for f in findings if f["code"] == "QDQ503"]
    retyped = [f for f in findings if f["code"] == "QDQ505"]
    assert len(retyped) == 16 and len(asymmetric) == 1
    assert sorted(asymmetric[0]["tensors"]) == sorted(t for f in retyped for t in f["tensors"])
    message = asymmetric[0]["message"]
    assert "16 uint8 activations" in message and message.endswith("the target needs int8 with zero-point 0")


def test_the_pre_commit_snippet_pins_a_revision_that_exists():
    """docs/ci.md's `rev:` is a tag or a commit of this repository (it once named a tag never made)."""
    (rev,) = re.findall(r"^\s+rev: (\S+)", (REPO / "docs" / "ci.md").read_text(), flags=re.M)
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-inside-work-tree"], capture_output=True)
    if git.returncode != 0:
        pytest.skip("not a git checkout: the revision cannot be looked up")
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True)
    assert found.returncode == 0, f"docs/ci.md pins rev {rev}, which is neither a tag nor a commit of qdq"


def test_qdq_without_a_command_suggests_commands_that_exist():
    """Every command `qdq` suggests is one it accepts (it once suggested `inspect_engine`)."""
    run = qdq()
    assert run.code == 2 and run.out == ""
    suggested = re.search(r"choose from ([^;]+);", run.err).group(1).split(", ")
    assert "inspect-engine" in suggested
    for command in suggested:
        assert qdq(command, "--help").code == 0, command


DEMO = REPO / "examples" / "models" / "demo_fx_qat.onnx"


def test_lint_to_a_file_says_on_the_terminal_what_the_file_holds(tmp_path):
    report = tmp_path / "report.sarif"
    run = qdq("lint", DEMO, "--target", "npu", "--format", "sarif", "-o", report)
    assert run.code == 1 and run.out == ""
    assert run.err.startswith(f"qdq: wrote {report}: Found 21 findings") and run.err.count("\n") == 1
    assert qdq("lint", DEMO, "--target", "npu", "-o", report, "-q").err == ""


def test_writing_a_baseline_prints_the_summary_not_every_finding(tmp_path):
    run = qdq("lint", DEMO, "--target", "npu", "--write-baseline", tmp_path / "baseline.json")
    assert run.code == 0
    assert run.out.startswith("Found 21 findings") and run.out.count("\n") == 1
    assert run.err == f"qdq: wrote {tmp_path / 'baseline.json'}: the baseline records 21 findings\n"


def test_explain_takes_a_rule_name_as_well_as_its_code():
    by_name, by_code = qdq("explain", "float-bias"), qdq("explain", "QDQ610")
    assert by_name.code == 0 and by_name.out == by_code.out and by_name.out.startswith("QDQ610 float-bias\n")
    unknown = qdq("explain", "no-such-rule")
    assert unknown.code == 2 and unknown.err.count("\n") == 1 and "neither a code nor a name" in unknown.err


def test_rules_all_lists_every_rule_and_marks_those_the_set_does_not_run():
    listed, every = qdq("rules", "--target", "ort"), qdq("rules", "--target", "ort", "--all")
    count = int(re.search(r"^(\d+) rules\.", every.out, flags=re.M).group(1))
    assert count == len(qdq("rules", "--target", "ort", "--all", "--format", "json").json()["rules"])
    assert count > int(re.search(r"^(\d+) rules\.", listed.out, flags=re.M).group(1))
    assert "QDQ808" not in listed.out and re.search(r"QDQ808 .*\(not in 'ort'\)$", every.out, flags=re.M)


def test_inspect_takes_folders_as_lint_does(tmp_path):
    run = qdq("inspect", REPO / "examples" / "models", "--format", "json")
    assert run.code == 0 and run.json()["model"]["path"].endswith("demo_fx_qat.onnx")
    empty = qdq("inspect", tmp_path)
    assert empty.code == 2 and "no .onnx model in this directory" in empty.err


def test_verbose_says_which_pyproject_was_read_and_vv_adds_each_rule(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.qdq]\ntarget = "npu"\n')
    monkeypatch.chdir(tmp_path)
    once, twice = qdq("lint", DEMO, "-v"), qdq("lint", DEMO, "-vv")
    assert f"read [tool.qdq] from {tmp_path / 'pyproject.toml'}" in once.err and "rule set 'npu'" in once.err
    assert "QDQ610 float-bias: 6 finding(s) in" not in once.err and "QDQ610 float-bias: 6 finding(s) in" in twice.err


def test_an_unknown_target_in_pyproject_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.qdq]\ntarget = "nppu"\n')
    monkeypatch.chdir(tmp_path)
    run = qdq("lint", DEMO)
    assert run.code == 2 and run.out == ""
    assert run.err == (f"qdq: error: {tmp_path / 'pyproject.toml'}: [tool.qdq] target: unknown target 'nppu' "
                       f"(known: {', '.join(TARGETS)})\n")


def test_inspect_engine_header_of_a_names_only_file_says_the_version_is_unknown():
    run = qdq("inspect-engine", REPO / "tests" / "fixtures" / "trt" / "trt8.5-layer-names-only-qat-yolo" / "layer_info.json")
    header = run.out.splitlines()[0]
    assert header.endswith("[TensorRT version unknown, names only]")


def _python(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120)


def test_core_imports_and_lints_without_torch() -> None:
    """Here, not in test_fx_load_scales.py: a module that skips without torch would skip this test too."""
    model = REPO / "examples" / "models" / "demo_fx_qat.onnx"
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import qdq, cli\n"
        f"sys.exit(cli.main(['lint', {str(model)!r}]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode in (0, 1), run.stderr
    assert "Error" not in run.stderr

    code = "import sys; sys.modules['torch'] = None\nimport qdq.fx\n"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "During handling" not in run.stderr  # one error, not torch's chained under it
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: qdq.fx needs PyTorch") and "pip install 'qdq[torch]'" in last
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in last  # the CPU build, not CUDA's gigabytes


def test_the_scale_benchmark_generator_explains_itself():
    run = _python(str(REPO / "benchmarks" / "scale_models.py"), "--help")
    assert run.returncode == 0 and "ladder" in run.stdout and "external" in run.stdout and run.stderr == ""
    wrong = _python(str(REPO / "benchmarks" / "scale_models.py"), "ladder")
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr


def test_the_torch_pin_accepts_pytorchs_cpu_build_the_readme_points_to():
    """README: add PyTorch's CPU wheel index and pip installs `2.13.0+cpu`; the pin must accept it."""
    from packaging.requirements import Requirement

    pins = [Requirement(line) for line in (REPO / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    (torch,) = [pin for pin in pins if pin.name == "torch"]
    version = str(torch.specifier).removeprefix("==")
    assert torch.specifier.contains(f"{version}+cpu")
    readme = (REPO / "README.md").read_text()
    assert "`--extra-index-url`" in readme and "`https://download.pytorch.org/whl/cpu`" in readme
    assert f"`torch {version}+cpu`" in readme


def test_the_readme_compare_example_runs_on_the_shipped_engines():
    """The files the README's compare command names ship in examples/engines/, with their licence."""
    engines = REPO / "examples" / "engines"
    run = qdq("compare", engines / "residuals_qat.json", engines / "qat.json",
              "--profile-a", engines / "residuals_qat.profile.json", "--profile-b", engines / "qat.profile.json")
    assert run.code == 0
    assert re.search(r"^  layers \(without NoOp/Constant\) +57 +72 +\+15$", run.out, flags=re.M)
    assert (engines / "LICENSE-Apache-2.0.txt").read_text().startswith("\n                                 Apache License")


# --- QDQ508 and the CPU (issue 37, item 9) ------------------------------------------------------------

ORT_PTQ = CORPUS / "ort" / "resnet_default.onnx"  # onnxruntime's PTQ: int8 weights that saturate without VNNI


@pytest.mark.parametrize(("machine", "flags", "kind", "said"), [
    ("x86_64", "fpu sse4_1 avx2 avx512f avx512_vnni", "x86-vnni", "avx512_vnni"),
    ("x86_64", "fpu sse4_1 avx2 avx_vnni", "x86-vnni", "avx_vnni"),
    ("x86_64", "fpu sse4_1 avx2 fma", "x86-avx2", "no VNNI flag"),
    ("aarch64", "fp asimd asimddp", "arm", "asimddp"),
    ("aarch64", "fp asimd", "arm", "aarch64"),
    ("x86_64", None, "x86-avx2", "the safe side"),
])
def test_the_cpu_kind_is_told_from_the_architecture_and_flags(tmp_path, machine, flags, kind, said):
    from qdq.quant.cpu import this_cpu

    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    found = this_cpu(cpuinfo, machine)
    assert found.kind == kind and said in found.why


def _qdq508(run) -> list[dict]:
    return [f for f in run.json()["findings"] if f["code"] == "QDQ508"]


def test_ort_on_a_vnni_cpu_narrows_no_weight_and_says_what_it_assumed(monkeypatch):
    from qdq.quant import cpu

    monkeypatch.delenv(cpu.ENVIRONMENT)
    monkeypatch.setattr(cpu, "this_cpu", lambda: cpu.Cpu("x86-vnni", "this machine's CPU has avx512_vnni"))
    run = qdq("lint", ORT_PTQ, "--target", "ort", "--format", "json")
    assert _qdq508(run) == []
    (note,) = [n for n in run.json()["notes"] if n.startswith("QDQ508")]
    assert note.startswith("QDQ508 assumed CPU kind x86-vnni (this machine's CPU has avx512_vnni)")
    assert 'set cpu = "x86-avx2"' in note


def test_the_cpu_is_overridden_by_the_rule_set_or_the_environment(tmp_path, monkeypatch):
    from qdq.quant import cpu

    monkeypatch.setenv(cpu.ENVIRONMENT, "x86-vnni")
    assert _qdq508(qdq("lint", ORT_PTQ, "--target", "ort", "--format", "json")) == []
    rules = tmp_path / "avx2.toml"
    rules.write_text('extends = "ort"\n[rules.QDQ508]\ncpu = "x86-avx2"\n')
    assert len(_qdq508(qdq("lint", ORT_PTQ, "--rules", rules, "--format", "json"))) > 0  # the rule set wins
    monkeypatch.setenv(cpu.ENVIRONMENT, "x86-avx2")
    text = qdq("lint", ORT_PTQ, "--target", "ort")
    assert "QDQ508 [warning]" in text.out and "note: QDQ508 assumed CPU kind x86-avx2 (QDQ_CPU=x86-avx2)" in text.out
    monkeypatch.setenv(cpu.ENVIRONMENT, "pentium")
    bad = qdq("lint", ORT_PTQ, "--target", "ort")
    assert bad.code == 2 and bad.err == ("qdq: error: QDQ_CPU=pentium: unknown CPU kind, expected 'auto' or one of "
                                         "x86-avx2, x86-vnni, arm\n")


# --- every target at once (issue 37, item 12) ---------------------------------------------------------


def test_lint_target_all_shows_every_target_side_by_side():
    run = qdq("lint", DEMO, "--target", "all")
    assert run.code == 1
    header, *rows = run.out.splitlines()
    assert header.split()[1:] == TARGETS
    cells = {line.split()[0]: dict(zip(TARGETS, line.split()[2:])) for line in rows if line.startswith("  QDQ")}
    assert [t for t, cell in cells["QDQ610"].items() if cell != "."] == ["npu"]  # float biases: the NPU's error only
    assert set(cells["QDQ204"].values()) == {"5W"}
    one_at_a_time = [qdq("lint", DEMO, "--target", t, "--format", "json").json()["summary"] for t in TARGETS]
    totals = [line for line in rows if line.strip().startswith("findings (fixable)")][0].split()[2::2]
    assert [int(n) for n in totals] == [s["error"] + s["warning"] + s["info"] for s in one_at_a_time]


def test_lint_target_all_as_json_for_ci(tmp_path):
    out = tmp_path / "all.json"
    run = qdq("lint", DEMO, "--target", "all", "--format", "json", "-o", out, "--fail-on", "error")
    (model,) = json.loads(out.read_text())["models"]
    verdicts = {target: entry["verdict"] for target, entry in model["targets"].items()}
    # At --fail-on error only the NPU's float biases fail (trt11's FP32 float parts are warnings).
    assert verdicts == {t: "fails" if t == "npu" else "passes" for t in TARGETS}
    assert run.code == 1 and {k: v for k, v in model["targets"]["npu"]["rules"].items() if k != "QDQ811"} == \
        {"QDQ204": 5, "QDQ610": 6}
    passing = ", ".join(t for t in TARGETS if verdicts[t] == "passes")
    assert run.out == "" and run.err == f"qdq: wrote {out}: {DEMO}: passes for {passing}; fails for npu\n"
    assert qdq("lint", DEMO, "--target", "all", "--format", "sarif").code == 2


# --- shell completion (issue 37, item 12) -------------------------------------------------------------


def _bash_completes(script: str, *words: str) -> list[str]:
    """What the bash script offers for `words` (the last one being typed), run by bash itself."""
    program = (f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
               "_qdq; printf '%s\\n' \"${COMPREPLY[@]}\"")
    run = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_and_their_values():
    script = qdq("completion", "bash").out
    assert _bash_completes(script, "qdq", "ins") == ["inspect", "inspect-engine"]
    assert _bash_completes(script, "qdq", "lint", "m.onnx", "--target", "") == [*TARGETS, "all"]
    assert _bash_completes(script, "qdq", "fix", "m.onnx", "--target", "t") == [t for t in TARGETS if t.startswith("t")]
    assert _bash_completes(script, "qdq", "lint", "--format", "s") == ["sarif"]
    assert "--write-baseline" in _bash_completes(script, "qdq", "lint", "--w")
    assert "float-bias" in _bash_completes(script, "qdq", "explain", "f")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_are_written_from_the_same_parser(shell):
    script = qdq("completion", shell).out
    assert "inspect-engine" in script and "write-baseline" in script and "trt8" in script
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed: its syntax check cannot run")
    check = subprocess.run([shell, "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
