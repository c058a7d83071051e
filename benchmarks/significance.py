"""When a fix loses the task: more than a few points, and more than chance allows.

One rule for the documents that judge the verdict against a task metric (benchmarks/verdict.py's
choice of margins, benchmarks/trained.py's table): a fix *loses* the task when its figure drops by
more than `keep` and the two-sided sign test on the samples it newly gets wrong and newly gets right
says the imbalance is no chance (p < ALPHA); it *keeps* the task when the drop is at most `keep`; a
larger drop on too few flips to tell is *unclear*, neither a loss nor kept.
"""

from __future__ import annotations

import math

import numpy as np

# A loss is the fix's, not chance, when the sign test puts the flips' imbalance below this.
ALPHA = 0.05


def sign_test(worse: int, better: int) -> float:
    """Two-sided exact sign (binomial) test: the chance of flips at least this one-sided if each flip went
    either way with probability 1/2. Samples both models score alike say nothing about which is better."""
    flips = worse + better
    tail = sum(math.comb(flips, k) for k in range(min(worse, better) + 1)) / 2 ** flips
    return min(1.0, 2 * tail)


def paired(before: np.ndarray, after: np.ndarray, keep: float) -> dict:
    """Two models on the same samples (per-sample scores in [0, 1]): the samples the second scores worse
    and better, the sign test's p (5 significant digits) and the drop `outcome` allows (`keep`)."""
    worse, better = int(np.sum(after < before)), int(np.sum(after > before))
    return {"samples": len(before), "worse": worse, "better": better,
            "p": float(f"{sign_test(worse, better):.5g}"), "keep": keep}


def outcome(task: dict) -> str:
    """`lost` when the fix loses more than `keep` and the sign test says it is no chance; `kept` when it
    loses at most `keep`; `unclear` when it loses more on too few flips to tell (2 of 64 text lines:
    p = 0.5). An input that already scores 0 has no task left to lose. `input`, `fixed` and `keep` in one unit."""
    loss = task["input"] - task["fixed"]
    if loss <= task["keep"] or task["input"] == 0:
        return "kept"
    return "lost" if task["p"] < ALPHA else "unclear"
