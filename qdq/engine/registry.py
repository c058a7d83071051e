"""Every rule qdq knows, by code. Importing this module imports the rule modules, which register
themselves with `qdq.rewrite.rule.register`; `qdq.rewrite.rule` itself imports no rule, so nothing loops."""

from __future__ import annotations

import qdq.checks  # noqa: F401  (registers the rules)
from qdq.rewrite.rule import RULES, Rule


def all_rules() -> dict[str, type[Rule]]:
    """Every registered rule, by code."""
    return dict(sorted(RULES.items()))
