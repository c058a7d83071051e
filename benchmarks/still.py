"""Run one qdq command and report how long its progress line stood still at most.

    python benchmarks/still.py OUT.json QDQ-ARGS...

A long run must show that it is alive: the progress line moves at least every 2 s (issue 40).
The line moves when the library calls `qdq.support.progress.step`; this runs the command in-process,
as the `qdq` console script does, with `progress.timed()` recording every step, and writes the
longest gap between two steps (and what the run was doing then), and the ten longest with their
step numbers, to OUT.json. Exits with qdq's code.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's qdq, not an installed copy
from qdq.cli import main  # noqa: E402
from qdq.support import progress  # noqa: E402


def run(out: Path, argv: list[str]) -> int:
    gc.disable()  # as the console script runs
    with progress.timed() as steps:
        code = main(argv)
    text, seconds = max(steps, key=lambda step: step[1]) if steps else ("", 0.0)
    longest = sorted(((round(s, 3), t, i) for i, (t, s) in enumerate(steps)), reverse=True)[:10]
    out.write_text(json.dumps({"longest_still_s": seconds, "doing": text, "steps": len(steps),
                               "ten_longest": [{"s": s, "doing": t, "step": i} for s, t, i in longest]}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), sys.argv[2:]))
