"""`[tool.qdq.per-node-ignores]`: rule codes switched off for some nodes only, as ruff's per-file-ignores.

Keys are node-name globs (fnmatch, case-sensitive; `*` also crosses `/`), values are codes or
code prefixes (or "ALL"): `"/head/*" = ["QDQ801"]` keeps QDQ801 quiet on the detection head and nowhere else.
A finding without a node (a graph-level one) is never matched; `ignore` turns such a rule off.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from qdq.engine.lint import LintResult
from qdq.rewrite.rule import Finding


def is_ignored(finding: Finding, per_node_ignores: dict[str, list[str]]) -> bool:
    if finding.node is None:
        return False
    return any(
        fnmatchcase(finding.node, pattern) and any(code == "ALL" or finding.code.startswith(code) for code in codes)
        for pattern, codes in per_node_ignores.items()
    )


def drop_ignored(result: LintResult, per_node_ignores: dict[str, list[str]]) -> None:
    """Remove the findings `per_node_ignores` switches off from `result`."""
    if per_node_ignores:
        result.findings[:] = [f for f in result.findings if not is_ignored(f, per_node_ignores)]
