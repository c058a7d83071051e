"""How `qdq lint` and `qdq fix` scale: time and peak memory on 1k-100k-node models and on a model
with GiB of external weights, each next to a bare `onnx.load` + `onnx.save` of the same file and
(on the ladders) next to onnxruntime opening it, which every written file must survive.

    python benchmarks/scale.py [--sizes 1000,10000,100000] [--external-gib 3] [--repeats N]
                               [--repeats-large N] [--json FILE] [--skip-external]

Every measurement is a fresh process (its wall time, and its peak RSS from the kernel's rusage),
and the commands of one model take turns within each repeat, so a noisy machine slows them
alike. Medians over repeats; peak memory is the largest of the repeats. The targets of issue 17
are printed with PASS/FAIL; the exit code is 0 whatever they say (this measures, it does not
gate), 1 when a command crashed or exited 2, 2 when there is no disk room for the external model.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parent.parent
# Models are generated in their own process: a child's peak RSS starts from what its parent holds.
GENERATOR = [sys.executable, str(Path(__file__).resolve().parent / "scale_models.py")]
# The checkout's qdq, not an installed copy: `-m cli` run from the repository root.
QDQ = [sys.executable, "-m", "cli"]
BASELINE = "import sys, onnx; onnx.save(onnx.load(sys.argv[1], load_external_data=False), sys.argv[2])"
# onnxruntime opening the input as qdq's check of every written file does (optimisations off, no CPU arena, as
# qdq.support.runtime builds every session): the floor of any fix that proves onnxruntime accepts what it writes, whatever
# qdq itself costs.
ORT_SESSION = ("import sys, onnxruntime as ort; options = ort.SessionOptions(); options.log_severity_level = 3; "
               "options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL; "
               "options.enable_cpu_mem_arena = False; "
               "ort.InferenceSession(sys.argv[1], options, providers=['CPUExecutionProvider'])")
COMMANDS = ("load+save", "ort session", "lint npu", "lint trt", "fix npu", "fix trt")
QDQ_COMMANDS = COMMANDS[2:]
# Targets of issue 17 (issue 8's, tightened): ratios to load+save at the largest size, fix with its
# default verification where that is measured, growth per 10x nodes, the external model.
LINT_RATIO, FIX_RATIO, VERIFIED_FIX_RATIO, GROWTH_PER_10X = 4.0, 8.0, 16.0, 11.0
EXTERNAL_LINT_SECONDS, EXTERNAL_LINT_MB, EXTERNAL_FIX_MB = 2.0, 300.0, 1500.0
MB = 1e6
# What a command may exit with: lint and fix exit 1 when findings remain, which is expected here.
ALLOWED_EXIT = {"load+save": (0,), "ort": (0,), "lint": (0, 1), "fix": (0, 1)}
LARGE = 100_000  # models this big may run fewer repeats (--repeats-large)
VERIFIED = "fix npu +verify"  # fix with its default verification: measured on the largest model and the external one
# Runs the verified fix in-process and records the longest time its progress line stood still.
STILL = [sys.executable, str(Path(__file__).resolve().parent / "still.py")]
STILL_LIMIT_S = 2.0
# Address-space cap of every measured process: a command that needs more fails with MemoryError
# (reported as a benchmark failure) instead of pushing a shared machine into the OOM killer.
MEMORY_CAP = 8 * 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="node counts, comma-separated")
    parser.add_argument("--external-gib", type=float, default=3.0, help="GiB of external weights (default: 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every command (default: 3)")
    parser.add_argument("--repeats-large", type=int, metavar="N",
                        help=f"runs on models of {LARGE:,}+ nodes and the external one (default: --repeats)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--skip-external", action="store_true", help="no external-data model")
    args = parser.parse_args(argv)
    sizes = sorted(int(size) for size in args.sizes.split(","))
    external_gib = None if args.skip_external else args.external_gib
    try:
        results = run(sizes, external_gib, args.repeats, args.repeats_large)
    except GenerationError as exc:
        print(f"scale.py: error: {exc} (for the external model: --skip-external or a smaller --external-gib)",
              file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))
    return 1 if results["failures"] else 0


class GenerationError(RuntimeError):
    """A model could not be generated (not enough disk, most likely)."""


def run(sizes: list[int], external_gib: float | None, repeats: int, repeats_large: int | None = None) -> dict:
    """Generate the models in a temporary folder, measure every command on each, judge the targets."""
    repeats_large = repeats_large or repeats
    # Byte-compiled first, as `pip install` leaves an installed qdq (and onnx, which the baseline
    # imports): with PYTHONDONTWRITEBYTECODE set every command would compile qdq anew (about 0.1 s).
    compileall.compile_dir(str(REPO / "qdq"), quiet=1)
    compileall.compile_file(str(REPO / "cli.py"), quiet=1)
    results: dict = {"machine": _machine(), "sizes": {}, "failures": []}
    with tempfile.TemporaryDirectory(prefix="qdq-scale-") as tmp:
        tmp = Path(tmp)
        external_path = None
        if external_gib is not None:  # first, so a full disk is found before minutes of measuring
            folder = tmp / "external"
            folder.mkdir()
            generated = _generate("external", external_gib, folder)
            external_path = Path(generated["path"])
            results["external"] = {"gib": external_gib, "nodes": generated["nodes"], "generate_s": generated["seconds"]}
        for size in sizes:
            runs = repeats_large if size >= LARGE else repeats
            results["sizes"][str(size)] = _measure_ladder(tmp, size, runs, results["failures"], size == sizes[-1])
        if external_path is not None:
            results["external"].update(_measure_external(external_path, repeats_large, results["failures"]))
        results["disk_inputs_mb"] = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) / MB
    # A child's peak RSS starts from this process's resident size when it forks: the floor of every figure.
    results["runner_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
    if len(sizes) > 1:
        results["growth"] = _growth(results["sizes"], sizes[-2], sizes[-1])
    results["targets"] = _targets(results, sizes[-1])
    return results


def _measure_ladder(tmp: Path, size: int, repeats: int, failures: list, verify: bool) -> dict:
    folder = tmp / f"ladder_{size}"
    folder.mkdir()
    path = folder / "model.onnx"
    generated = _generate("ladder", size, path)
    row = {"nodes": generated["nodes"], "generate_s": generated["seconds"], "file_mb": path.stat().st_size / MB}
    commands = _commands(path)
    if verify:  # what fix's default verification costs, in the same turns
        commands[VERIFIED] = _verified(path)
    stills = []
    runs = _take_turns(path, commands, repeats, failures, after={VERIFIED: lambda: stills.append(_still(path))})
    row.update(_summary(runs), repeats=repeats)
    if stills:
        row["longest_still"] = max(stills, key=lambda still: still["longest_still_s"])
    return row


def _verified(path: Path) -> list[str]:
    return STILL + [str(path.with_name("still.json")), "fix", str(path), "--target", "npu", "-o",
                    str(path.with_name("verified.onnx")), "--isolated"]


def _still(path: Path) -> dict:
    """What still.py recorded of the verified fix's progress line (read before the file is deleted)."""
    record = path.with_name("still.json")
    return json.loads(record.read_text()) if record.exists() else {"longest_still_s": None, "doing": "no record"}


def _generate(kind: str, amount: float, where: Path) -> dict:
    started = time.perf_counter()
    done = subprocess.run(GENERATOR + [kind, str(amount), str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        raise GenerationError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"{kind} generation failed")
    return {**json.loads(done.stdout), "seconds": time.perf_counter() - started}


def _measure_external(path: Path, repeats: int, failures: list) -> dict:
    """Lint and the weight-rewriting NPU fix on the external-data model; the fix must keep weights external."""
    data = path.with_name(path.name + ".data")
    before = _fingerprint(data)
    commands = {name: command for name, command in _commands(path).items() if name not in ("ort session", "fix trt")}
    commands[VERIFIED] = _verified(path)
    keeps, stills = [], []
    runs = _take_turns(path, commands, repeats, failures,
                       after={"fix npu": lambda: keeps.append(_keeps_external(path, path.with_name("fix_npu.onnx"))),
                              VERIFIED: lambda: stills.append(_still(path))})
    row = _summary(runs)
    row.update({"repeats": repeats, "data_mb": data.stat().st_size / MB, "model_kb": path.stat().st_size / 1e3,
                "fix_keeps_external": keeps, "input_data_unchanged": _fingerprint(data) == before,
                "longest_still": max(stills, key=lambda still: still["longest_still_s"] or 0)})
    return row


def _commands(path: Path) -> dict[str, list[str]]:
    """The commands on one model; outputs go next to it, so external data is never copied."""
    def out(name: str) -> str:
        return str(path.with_name(name))

    return {
        "load+save": [sys.executable, "-c", BASELINE, str(path), out("baseline.onnx")],
        "ort session": [sys.executable, "-c", ORT_SESSION, str(path)],
        "lint npu": QDQ + ["lint", str(path), "--target", "npu", "--isolated"],
        "lint trt": QDQ + ["lint", str(path), "--target", "trt", "--isolated"],
        "fix npu": QDQ + ["fix", str(path), "--target", "npu", "-o", out("fix_npu.onnx"), "--no-verify", "--isolated"],
        "fix trt": QDQ + ["fix", str(path), "--target", "trt", "-o", out("fix_trt.onnx"), "--no-verify", "--isolated"],
    }


def _take_turns(path: Path, commands: dict[str, list[str]], repeats: int, failures: list, after=None) -> dict:
    """Run each command once per repeat, in turn; delete what each wrote (fix names new data files anew)."""
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            existing = set(path.parent.iterdir())
            measured = _measure(command, f"{name} on {path.parent.name}", failures)
            if after and name in after:
                after[name]()
            written = set(path.parent.iterdir()) - existing
            measured["written_mb"] = sum(f.stat().st_size for f in written) / MB
            runs[name].append(measured)
            for file in written:
                file.unlink()
    return runs


def _measure(command: list[str], label: str, failures: list) -> dict:
    """Wall time and peak RSS of one command in its own process; a crash or exit 2 is recorded as a failure."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                   preexec_fn=_cap_memory)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace")
    allowed = ALLOWED_EXIT[label.split()[0]]
    if process.returncode not in allowed or "Traceback" in errors or "error: unexpected" in errors:
        failures.append({"command": label, "argv": command, "exit": process.returncode, "stderr": errors[-2000:]})
    return {"seconds": seconds, "peak_mb": usage.ru_maxrss * 1024 / MB, "exit": process.returncode}


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _summary(runs: dict[str, list[dict]]) -> dict:
    medians = {name: statistics.median(r["seconds"] for r in measured) for name, measured in runs.items()}
    return {
        "median_s": medians,
        "ratio": {name: medians[name] / medians["load+save"] for name in medians},
        "peak_mb": {name: max(r["peak_mb"] for r in measured) for name, measured in runs.items()},
        "exit": {name: sorted({r["exit"] for r in measured}) for name, measured in runs.items()},
        "largest_output_mb": max(r["written_mb"] for measured in runs.values() for r in measured),
    }


def _growth(sizes: dict, small: int, large: int) -> dict:
    medians_small, medians_large = sizes[str(small)]["median_s"], sizes[str(large)]["median_s"]
    return {"from": small, "to": large,
            "time_ratio": {name: medians_large[name] / medians_small[name] for name in COMMANDS}}


def _keeps_external(source: Path, output: Path) -> dict:
    """Whether a fixed copy kept its weights in external files next to it, and stayed small itself."""
    if not output.exists():
        return {"ok": False, "why": "no output written"}
    proto = onnx.load(str(output), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    expected = sum(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in onnx.load(str(source), load_external_data=False).graph.initializer)
    files = sorted({e.value for t in external for e in t.external_data if e.key == "location"})
    present = all((output.parent / f).is_file() for f in files)
    size_mb = output.stat().st_size / MB
    ok = len(external) >= expected and present and size_mb < 10
    return {"ok": ok, "model_mb": size_mb, "external_tensors": len(external), "expected": expected,
            "data_files": {f: (output.parent / f).stat().st_size / MB for f in files if (output.parent / f).is_file()}}


def _fingerprint(path: Path) -> tuple:
    """Size, mtime and a hash of the first and last MiB: enough to see that nobody wrote the file."""
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(2**20))
        handle.seek(max(0, stat.st_size - 2**20))
        digest.update(handle.read())
    return stat.st_size, stat.st_mtime_ns, digest.hexdigest()


def _targets(results: dict, largest: int) -> list[dict]:
    targets = []

    def target(name: str, limit: float, measured: float | None, unit: str, within=lambda m, lim: m <= lim):
        targets.append({"target": name, "limit": limit, "measured": measured, "unit": unit,
                        "passed": measured is not None and within(measured, limit)})

    ratios = results["sizes"][str(largest)]["ratio"]
    for name in QDQ_COMMANDS:
        limit = LINT_RATIO if name.startswith("lint") else FIX_RATIO
        target(f"{name} @{largest} / load+save", limit, ratios[name], "x")
    largest_row = results["sizes"][str(largest)]
    if VERIFIED in largest_row["median_s"]:  # one session of the written file is reported apart (as "ort session")
        medians = largest_row["median_s"]
        beyond = (medians[VERIFIED] - medians["ort session"]) / medians["load+save"]
        target(f"{VERIFIED} @{largest} less one ort session / load+save", VERIFIED_FIX_RATIO, beyond, "x")
        target(f"{VERIFIED} @{largest} progress line still at most", STILL_LIMIT_S,
               largest_row["longest_still"]["longest_still_s"], "s")
    if "growth" in results:
        growth = results["growth"]
        limit = GROWTH_PER_10X * (growth["to"] / growth["from"]) / 10
        for name in QDQ_COMMANDS:
            target(f"{name} growth {growth['from']} -> {growth['to']}", limit, growth["time_ratio"][name], "x")
    external = results.get("external")
    if external is not None:
        for name in ("lint npu", "lint trt"):
            target(f"external {name} time", EXTERNAL_LINT_SECONDS, external["median_s"][name], "s")
            target(f"external {name} peak memory", EXTERNAL_LINT_MB, external["peak_mb"][name], "MB")
        for name in ("fix npu", VERIFIED):
            target(f"external {name} peak memory", EXTERNAL_FIX_MB, external["peak_mb"][name], "MB",
                   within=lambda m, lim: m < lim)
        target(f"external {VERIFIED} progress line still at most", STILL_LIMIT_S,
               external["longest_still"]["longest_still_s"], "s")
        kept = all(k["ok"] for k in external["fix_keeps_external"]) and external["input_data_unchanged"]
        target("external fix npu keeps weights external, input data untouched", 1, float(kept), "yes=1",
               within=lambda m, lim: m == lim)
    return targets


def _machine() -> dict:
    return {"python": platform.python_version(), "onnx": onnx.__version__, "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0], "platform": platform.platform()}


def render(results: dict) -> str:
    machine = results["machine"]
    lines = [
        f"qdq scale benchmark: python {machine['python']}, onnx {machine['onnx']}, {machine['cpus']} CPUs, "
        f"load average {machine['load_average']:.1f} at start; repeats per model in the table, "
        "medians; peak RSS = largest of the repeats (at least this runner's own "
        f"{results['runner_peak_mb']:.0f} MB); every run a fresh process (interpreter start included) "
        f"capped at {MEMORY_CAP / 2**30:g} GiB of address space",
        "",
        f"{'model':<16}{'nodes':>8}{'gen s':>8}{'file MB':>9}{'runs':>5}  {'command':<16}{'median s':>10}"
        f"{'x load+save':>13}{'peak MB':>9}  exit",
    ]
    for size, row in results["sizes"].items():
        for index, name in enumerate(row["median_s"]):
            head = (f"{'ladder ' + size:<16}{row['nodes']:>8}{row['generate_s']:>8.1f}{row['file_mb']:>9.1f}"
                    f"{row['repeats']:>5}" if index == 0 else " " * 46)
            lines.append(f"{head}  {name:<16}{row['median_s'][name]:>10.2f}{row['ratio'][name]:>13.2f}"
                         f"{row['peak_mb'][name]:>9.0f}  {','.join(map(str, row['exit'][name]))}")
    if "growth" in results:
        growth = results["growth"]
        lines += ["", f"growth {growth['from']} -> {growth['to']} nodes (time ratio): " + ", ".join(
            f"{name} {ratio:.1f}x" for name, ratio in growth["time_ratio"].items())]
    largest_size, largest_row = max(results["sizes"].items(), key=lambda item: int(item[0]))
    opened = largest_row["median_s"]["ort session"]
    lines += ["", f"onnxruntime opening the {largest_size}-node input takes {opened:.2f} s (fix opens every file it "
              "writes the same way before keeping it); each command against that: " + ", ".join(
                  f"{name} {largest_row['median_s'][name] / opened:.2f}x" for name in QDQ_COMMANDS)]
    if VERIFIED in largest_row["median_s"]:
        verified, still = largest_row["median_s"], largest_row["longest_still"]
        lines += ["", f"verification at {largest_size} nodes: fix npu with its default onnxruntime verification "
                  f"{verified[VERIFIED]:.2f} s, with --no-verify {verified['fix npu']:.2f} s (medians): verifying costs "
                  f"{verified[VERIFIED] - verified['fix npu']:.2f} s; the progress line stood still at most "
                  f"{_seconds(still['longest_still_s'])} ({still['doing']})"]
    external = results.get("external")
    if external is not None:
        lines += ["", f"external-data model: {external['data_mb']:.0f} MB of weights ({external['gib']:g} GiB) in one "
                  f"file, {external['nodes']} nodes, model {external['model_kb']:.0f} kB, generated in "
                  f"{external['generate_s']:.1f} s, {external['repeats']} run(s) per command"]
        for name, seconds in external["median_s"].items():
            lines.append(f"  {name:<16}{seconds:>8.2f} s  x{external['ratio'][name]:>6.2f}  peak "
                         f"{external['peak_mb'][name]:>6.0f} MB  exit {','.join(map(str, external['exit'][name]))}")
        for index, kept in enumerate(external["fix_keeps_external"], 1):
            lines.append(f"  fix npu output, repeat {index}: {json.dumps(kept)}")
        lines.append(f"  input data file unchanged (size, mtime, first/last MiB): {external['input_data_unchanged']}")
        still = external["longest_still"]
        lines.append(f"  {VERIFIED}: the progress line stood still at most {_seconds(still['longest_still_s'])} "
                     f"({still['doing']})")
    largest = max(row["largest_output_mb"] for row in [*results["sizes"].values(), *([external] if external else [])])
    lines += ["", f"disk: {results['disk_inputs_mb']:.0f} MB of models in the temporary folder, at most "
              f"{largest:.0f} MB more while a run's output exists (deleted after each run)", "", "targets:"]
    for t in results["targets"]:
        measured = "not measured" if t["measured"] is None else f"{t['measured']:.2f} {t['unit']}"
        lines.append(f"  {'PASS' if t['passed'] else 'FAIL'}  {t['target']:<62} limit {t['limit']:g} {t['unit']:<7}"
                     f"measured {measured}")
    for failure in results["failures"]:
        lines += ["", f"BENCHMARK FAILURE: {failure['command']} exited {failure['exit']}: {' '.join(failure['argv'])}",
                  failure["stderr"].rstrip()]
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "(not recorded)" if value is None else f"{value:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
