"""SARIF 2.1.0 report, shaped for GitHub code scanning (`github/codeql-action/upload-sarif`).

One run for all models, one artifact per model. An .onnx file has no meaningful lines, so every
result points at its model's artifact with `startLine: 1` (GitHub drops results without a region)
and names the node in `logicalLocations`; a model that could not be read is an error notification.
`partialFingerprints` let GitHub track a finding across runs even though its "line" never moves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

from qdq.engine.lint import LintReport, LintResult, Unreadable, identity
from qdq.engine.registry import all_rules
from qdq.engine.ruleset import RuleSet
from qdq.reports.json import dumps
from qdq.rewrite.rule import Finding, Rule, Severity

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# GitHub rejects an upload with more results than this in one run.
MAX_RESULTS = 25_000
FINGERPRINT_KEY = "qdqFinding/v1"

_LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    codes = list(dict.fromkeys([*report.rules_run, *(f.code for f in report.findings)]))
    index = {code: i for i, code in enumerate(codes)}
    registry = all_rules()
    # One artifact per model; every result and notification points at its model's by index.
    artifacts = [{"location": {"uri": artifact_uri(m.model_path)}, "roles": ["analysisTarget"]} for m in report.models]
    located, notifications = [], []
    for number, model in enumerate(report.models):
        if isinstance(model, Unreadable):
            notifications.append(_notification("error", model.error, artifacts, number))
        else:
            located += [(finding, number) for finding in model.findings]
            notifications += [_notification("note", note, artifacts, number) for note in model.notes]
    # If GitHub's limit forces a cut, keep the most severe findings.
    kept = sorted(located, key=lambda pair: -pair[0].severity)[:MAX_RESULTS]
    dropped = len(located) - len(kept)

    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "qdq",
                "version": _version(),
                "rules": [_rule(code, registry.get(code), report.ruleset) for code in codes],
            }
        },
        "invocations": [{"executionSuccessful": not report.unreadable, "toolExecutionNotifications": notifications}],
        "artifacts": artifacts,
        "results": [_result(finding, index[finding.code], artifacts, number) for finding, number in kept],
        "properties": {"ruleset": report.ruleset.name, "failOn": str(fail_on)},
    }
    if dropped:
        text = f"{dropped} of {len(located)} results dropped: GitHub accepts at most {MAX_RESULTS} per run"
        notifications.append({"level": "warning", "message": {"text": text}})
        run["properties"]["droppedResults"] = dropped
    return dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]})


def artifact_uri(path: Path) -> str:
    """A URI reference for the model: relative paths stay relative (GitHub resolves them
    against the repository root), absolute ones become file:// URIs."""
    if path.is_absolute():
        return path.as_uri()
    return quote(path.as_posix(), safe="/")


def fingerprint(finding: Finding) -> str:
    """A hash of the finding's `identity` (rule, node, tensors): it survives reworded messages."""
    code, node, tensors = identity(finding)
    key = f"{code}:{node or ''}:{','.join(tensors)}"
    return hashlib.sha256(key.encode()).hexdigest()


def _rule(code: str, rule: type[Rule] | None, ruleset: RuleSet) -> dict[str, Any]:
    """The driver's description of one rule; codes missing from the registry still get an entry."""
    name = rule.name if rule else code
    doc = rule.doc() if rule else ""
    config = ruleset.rules.get(code)
    severity = config.severity if config else (rule.severity if rule else Severity.WARNING)
    summary = " ".join(doc.split("\n\n")[0].split()) or name
    return {
        "id": code,
        "name": name,
        "shortDescription": {"text": summary},
        "fullDescription": {"text": doc or summary},
        "help": {"text": doc or summary},
        "defaultConfiguration": {"level": _LEVELS[severity]},
    }


def _physical(artifacts: list[dict[str, Any]], number: int) -> dict[str, Any]:
    """Where in model `number` (its artifact): line 1, the only line an .onnx file has for GitHub."""
    uri = artifacts[number]["location"]["uri"]
    return {"artifactLocation": {"uri": uri, "index": number}, "region": {"startLine": 1}}


def _notification(level: str, text: str, artifacts: list[dict[str, Any]], number: int) -> dict[str, Any]:
    return {"level": level, "message": {"text": text}, "locations": [{"physicalLocation": _physical(artifacts, number)}]}


def _result(finding: Finding, rule_index: int, artifacts: list[dict[str, Any]], number: int) -> dict[str, Any]:
    location: dict[str, Any] = {"physicalLocation": _physical(artifacts, number)}
    if finding.node:
        location["logicalLocations"] = [{"fullyQualifiedName": finding.node, "kind": "member"}]
    properties: dict[str, Any] = {"tensors": list(finding.tensors), "values": finding.values}
    if finding.fix:
        properties["fix"] = str(finding.fix)
    return {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": _LEVELS[finding.severity],
        "message": {"text": finding.message},
        "locations": [location],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint(finding)},
        "properties": properties,
    }


def _version() -> str:
    """qdq's version: the package attribute if set, else the installed distribution's."""
    import qdq

    version = getattr(qdq, "__version__", None)
    if version:
        return str(version)
    try:
        return importlib.metadata.version("qdq")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"
