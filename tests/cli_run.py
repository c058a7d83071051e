"""Run `qdq` in this process as a user would, with stdout, stderr and wall time captured."""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import cli


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float

    def json(self) -> dict:
        return json.loads(self.out)


def qdq(*argv: object) -> Run:
    """`qdq argv` through `cli.main` (module-scoped fixtures cannot use capsys)."""
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return Run(code, out.getvalue(), err.getvalue(), time.perf_counter() - start)
