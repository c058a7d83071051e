"""GitLab Code Quality report (`artifacts:reports:codequality`): a JSON list of issues.

GitLab shows the issues a merge request adds or fixes against its target branch, matching them
by `fingerprint`, so the fingerprint hashes the model's path and the finding's identity (rule,
node, tensors) and never the message. An .onnx file has no lines: every issue is on line 1.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from qdq.engine.lint import LintReport, LintResult, identity
from qdq.reports.json import dumps
from qdq.reports.text import describe
from qdq.rewrite.rule import Severity

# Code Quality's scale is info, minor, major, critical, blocker; as eslint-formatter-gitlab maps ESLint's.
_SEVERITIES = {Severity.ERROR: "major", Severity.WARNING: "minor", Severity.INFO: "info"}


def render(run: LintResult | LintReport, *, fail_on: Severity) -> str:
    report = LintReport.of(run)
    issues = []
    for result in report.results:
        path = result.model_path.as_posix()
        seen: Counter[tuple] = Counter()
        for finding in result.findings:
            key = identity(finding)
            seen[key] += 1  # the same identity twice still needs two fingerprints, or GitLab merges them
            issues.append({
                "description": describe(finding),
                "check_name": finding.code,
                "fingerprint": _fingerprint(path, key, seen[key]),
                "severity": _SEVERITIES[finding.severity],
                "location": {"path": path, "lines": {"begin": 1}},
            })
    return dumps(issues)


def _fingerprint(path: str, key: tuple, occurrence: int) -> str:
    code, node, tensors = key
    text = "\0".join([path, code, node or "", ",".join(tensors), str(occurrence)])
    return hashlib.sha256(text.encode()).hexdigest()
