"""One run of the trained corpus (quantized file × target) as a user makes it, held to the conformance invariants.

The conformance corpus's promises (`tests/test_conformance.py`, whose checks this reuses) must
hold on networks trained on real tasks too. A run is: `qdq lint`; `qdq fix -o OUT --keep-failed`
with the default verification (random inputs), so that a refused candidate is on disk to be
measured; `qdq verify MODEL OUT` on the same inputs; a second fix of OUT; `qdq lint` of OUT. With
`eval_inputs`, fix and verify run again with `--inputs` (the task's evaluation set), which must
write the same candidate: inputs only judge it. The run's figures and every broken promise
(`violations`) come back as one JSON-ready dict:

- no traceback, and exit 2 (one line) only for a file onnxruntime refuses;
- what fix writes passes `onnx.checker.check_model(full_check=True)` (when the input does) and
  loads in onnxruntime, with its optimisations off and on;
- `qdq verify` on the pair gives fix's verdict; a refused candidate has an output (or its deepest
  quantized tensors) further from the twin than allowed, a passed one none; on the evaluation set
  the outputs' distances are those of a twin built without qdq (`independent_twin.py`);
- a second fix changes nothing, and no command changes the input file;
- a file lint calls clean passes the target's independent checker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from cli_run import Run, qdq
from test_conformance import CHECKERS, assert_twin_distances, assert_well_behaved, checker_passes, digest, \
    onnxruntime_loads


def run(model: Path, target: str, scratch: Path, eval_inputs: Path | None = None) -> dict:
    """The figures and broken promises of one model × target; OUT stays at scratch/fixed.onnx."""
    violations: list[str] = []

    def behaved(result: Run, what: str) -> Run:
        try:
            assert_well_behaved(result, accepted, what)
        except AssertionError as error:
            violations.append(str(error).splitlines()[0])
        return result

    accepted, before = onnxruntime_loads(model), digest(model)
    cell: dict = {"target": target, "onnxruntime_loads": accepted}
    cell["lint_exit"] = behaved(qdq("lint", model, "--target", target, "--format", "json"), "lint").code
    out = scratch / "fixed.onnx"
    fix = behaved(qdq("fix", model, "--target", target, "-o", out, "--keep-failed", "--format", "json"), "fix")
    cell |= {"fix_exit": fix.code, "fix_seconds": round(fix.seconds, 1), "written": out.exists()}
    if fix.code == 2:
        cell["fix_error"] = (fix.err.strip().splitlines() or [""])[-1][:240]
        if out.exists():
            violations.append("exit 2 but a model was written")
        return cell | {"violations": violations}
    report = fix.json()
    cell |= {"changes": len(report["changes"]), "remaining": len(report["remaining"])}
    if not out.exists():
        violations.append("fix with --keep-failed wrote nothing")
        return cell | {"violations": violations}

    if not checker_passes(out, full=True) and checker_passes(model, full=True):
        violations.append("the full ONNX checker refuses the output")
    if accepted and not (onnxruntime_loads(out) and onnxruntime_loads(out, optimized=True)):
        violations.append("onnxruntime refuses the output")
    cell["verdict_random"] = judged(report["verification"], violations, "fix")
    verify = behaved(qdq("verify", model, out, "--target", target, "--format", "json"), "verify")
    cell["verify_random"] = agrees(verify, cell["verdict_random"], violations, "random inputs")
    if eval_inputs is not None:
        again = scratch / "fixed_eval.onnx"
        fix_eval = behaved(qdq("fix", model, "--target", target, "-o", again, "--keep-failed", "--format", "json",
                               "--inputs", eval_inputs), "fix --inputs")
        if fix_eval.code != 2:
            cell["verdict_eval"] = judged(fix_eval.json()["verification"], violations, "fix --inputs")
            if again.exists() and fix_eval.json()["verification"] is not None:
                try:  # the distances from a twin built without qdq, on the same samples
                    with np.load(eval_inputs) as samples:
                        feeds = dict(samples.items())
                    assert_twin_distances(model, again, feeds, fix_eval.json()["verification"])
                except AssertionError as error:
                    violations.append(f"fix --inputs: {' '.join(str(error).split())[:240]}")
            if again.exists() and again.read_bytes() != out.read_bytes():
                violations.append("fix wrote a different model when given --inputs")
            verify_eval = behaved(qdq("verify", model, out, "--target", target, "--format", "json",
                                      "--inputs", eval_inputs), "verify --inputs")
            cell["verify_eval"] = agrees(verify_eval, cell["verdict_eval"], violations, "the evaluation set")

    second = behaved(qdq("fix", out, "--target", target, "--dry-run", "--no-verify", "--format", "json"), "second fix")
    cell["second_fix_changes"] = len(second.json()["changes"]) if second.code != 2 else "exit 2"
    if cell["second_fix_changes"] != 0:
        violations.append(f"a second fix changes the output: {cell['second_fix_changes']}")
    cell["lint_after"] = behaved(qdq("lint", out, "--target", target, "--format", "json"), "lint of the output").code
    if cell["lint_after"] == 0:
        found = CHECKERS[target](onnx.load(str(out)))
        cell["independent_violations"] = found[:10]
        if found:
            violations.append(f"lint-clean, but the independent {target} checker finds {len(found)}: {found[0]}")
    if digest(model) != before:
        violations.append("the input file changed")
    return cell | {"violations": violations}


def judged(verification: dict | None, violations: list[str], what: str) -> dict | None:
    """A verdict's figures (worst output); a verdict that contradicts its own distances is a violation."""
    if verification is None:
        return None
    # The network's deepest quantized tensors are judged as one more output (qdq/verification/verdict.py).
    outputs = verification["outputs"] + ([verification["network"]] if verification.get("network") else [])
    twin = [o for o in outputs if o.get("input_to_twin") is not None]
    beyond = [o["name"] for o in twin if o["evidence"] and float(o["candidate_to_twin"]) > float(o["allowed"])]
    if twin and all(o["evidence"] for o in outputs) and bool(beyond) == verification["passed"]:
        violations.append(f"{what}: verdict {'PASS' if verification['passed'] else 'FAIL'} but outputs beyond "
                          f"the allowed distance from the twin: {beyond or 'none'}")
    network = verification.get("network")
    worst = _worst(twin)
    return {"passed": verification["passed"], "evidence": all(o["evidence"] for o in outputs),
            "network": network is not None,
            "twin": verification["twin"], "inputs": verification["inputs"],
            **(_figures(worst) if worst else {}),
            # The two kinds of row separately: each has its own allowance (the rule set's [verdict]).
            "outputs_row": _figures(_worst([o for o in twin if o is not network])),
            "deep_row": _figures(network if network in twin else None)}


def _worst(rows: list[dict]) -> dict | None:
    """The row furthest beyond (or nearest to) its allowed distance from the twin."""
    return max(rows, key=lambda o: float(o["candidate_to_twin"]) / max(float(o["allowed"]), 1e-30), default=None)


def _figures(row: dict | None) -> dict | None:
    keys = ("input_to_twin", "candidate_to_twin", "allowed", "relative_l2")
    return {k: float(row[k]) for k in keys} if row is not None else None


def agrees(verify: Run, fixed: dict | None, violations: list[str], inputs: str) -> bool | None:
    """Whether `qdq verify` on the pair says what fix said on the same inputs."""
    if verify.code == 2 or fixed is None:
        return None
    same = verify.json()["passed"] == fixed["passed"]
    if not same:
        violations.append(f"qdq verify and qdq fix disagree on {inputs}")
    return same

