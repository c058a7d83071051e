"""Every rule qdq knows, by code. Importing this module imports the rule modules, which register
themselves with `qdq.rewrite.rule.register`; `qdq.rewrite.rule` itself imports no rule, so nothing loops."""

from __future__ import annotations

import qdq.checks  # noqa: F401  (registers the rules)
from collections.abc import Iterable

from qdq.rewrite.rule import RULES, FixSafety, Rule


def all_rules() -> dict[str, type[Rule]]:
    """Every registered rule, by code."""
    return dict(sorted(RULES.items()))


def claims_exact(codes: Iterable[str]) -> bool:
    """Whether changes made by these rules all claim to keep every output bit for bit: the verdict then holds
    them to that (`qdq.verification.verdict`), not to a distance from the float twin."""
    return all(all_rules()[code].fix_safety == FixSafety.EXACT for code in codes)
