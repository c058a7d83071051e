"""Every runnable command of the README and docs/ prints what the page shows (tests/docs_commands.py).

After a change in what qdq prints, `python tests/docs_commands.py --update` rewrites the pages.
"""

from __future__ import annotations

import shutil

import pytest
from docs_commands import NOT_RUN, blocks, mismatch, run_block

RUNNABLE_BLOCKS = blocks()
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="the pages' commands are bash command lines")


def test_the_pages_have_runnable_blocks():
    assert len(RUNNABLE_BLOCKS) >= 3 and all(block.commands for block in RUNNABLE_BLOCKS)


@needs_bash
@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=[block.name for block in RUNNABLE_BLOCKS])
def test_a_runnable_block_prints_what_the_page_shows(block):
    failures = [f"$ {command.text}: {why}" for command, printed in zip(block.commands, run_block(block))
                if (why := mismatch(command.shown, printed))]
    assert failures == [], "run `python tests/docs_commands.py --update` after checking the new output"


def test_blocks_shown_but_not_run_say_so_on_their_page():
    """A block left out of this test for its run time is marked, and the text around it says it is not run."""
    for block in blocks(info=NOT_RUN):
        text = block.page.read_text()
        assert "not run by the docs test" in text, f"{block.name}: say why this block is not run"


def test_the_check_fails_on_a_page_that_drifted():
    printed = "a: 1 finding\nb: fixed\nresult PASS\n"
    assert mismatch(["a: 1 finding", "...", "result PASS"], printed) is None
    assert mismatch(["a: 2 findings", "..."], printed) is not None
    assert mismatch(["...", "result FAIL"], printed) is not None
    assert mismatch(["...", "b: fixed in 3.2 s"], "b: fixed in 0.4 s\n") is None  # timings differ from run to run
