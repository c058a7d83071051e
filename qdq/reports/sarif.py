"""SARIF 2.1.0 report, shaped for GitHub code scanning (`github/codeql-action/upload-sarif`).

An .onnx file has no meaningful lines, so every result points at the model file with
`startLine: 1` (GitHub drops results without a region) and names the node in `logicalLocations`.
`partialFingerprints` let GitHub track a finding across runs even though its "line" never moves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

from qdq.lint import LintResult
from qdq.reports.json import dumps
from qdq.rule import Finding, Rule, Severity, all_rules

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# GitHub rejects an upload with more results than this in one run.
MAX_RESULTS = 25_000
FINGERPRINT_KEY = "qdqFinding/v1"

_LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render(result: LintResult, *, fail_on: Severity) -> str:
    codes = list(dict.fromkeys([*result.rules_run, *(f.code for f in result.findings)]))
    index = {code: i for i, code in enumerate(codes)}
    registry = all_rules()
    uri = artifact_uri(result.model_path)
    # If GitHub's limit forces a cut, keep the most severe findings.
    kept = sorted(result.findings, key=lambda f: -f.severity)[:MAX_RESULTS]
    dropped = len(result.findings) - len(kept)

    notifications = [{"level": "note", "message": {"text": note}} for note in result.notes]
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "qdq",
                "version": _version(),
                "rules": [_rule(code, registry.get(code), result) for code in codes],
            }
        },
        "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
        "results": [_result(f, index[f.code], uri) for f in kept],
        "properties": {"ruleset": result.ruleset.name, "failOn": str(fail_on)},
    }
    if dropped:
        total = len(result.findings)
        text = f"{dropped} of {total} results dropped: GitHub accepts at most {MAX_RESULTS} per run"
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
    """Stable identity of a finding: rule, node and tensors, never the message or values."""
    key = f"{finding.code}:{finding.node or ''}:{','.join(finding.tensors)}"
    return hashlib.sha256(key.encode()).hexdigest()


def _rule(code: str, rule: type[Rule] | None, result: LintResult) -> dict[str, Any]:
    """The driver's description of one rule; codes missing from the registry still get an entry."""
    name = rule.name if rule else code
    doc = rule.doc() if rule else ""
    config = result.ruleset.rules.get(code)
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


def _result(finding: Finding, rule_index: int, uri: str) -> dict[str, Any]:
    location: dict[str, Any] = {
        "physicalLocation": {"artifactLocation": {"uri": uri}, "region": {"startLine": 1}}
    }
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
