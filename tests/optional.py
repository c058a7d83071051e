"""What some tests need beyond qdq's core install, and the reason they skip without it.

qdq lints and fixes without PyTorch; only qdq.fx, the examples' networks and the tests built on
them need it (`pip install -e ".[torch,dev]"`). Without it those tests skip and say why.
"""

from __future__ import annotations

import pytest

NO_TORCH = ("needs PyTorch (the qdq[torch] extra): pip install -c constraints.txt -e '.[torch,dev]' "
            "--extra-index-url https://download.pytorch.org/whl/cpu")


def torch_or_skip():
    """The torch module, or skip the calling test module (or test) with the reason above."""
    return pytest.importorskip("torch", reason=NO_TORCH)
