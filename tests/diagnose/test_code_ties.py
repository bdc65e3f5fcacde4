"""Ties the user's code breaks (pytest_ddp.diagnose.code_ties), on hand-made rank states and the
source text of ``t.py``: no processes."""

from __future__ import annotations

from snapshots import call, ok, outline, rank, snap, watched

from pytest_ddp.diagnose.state import Call
from pytest_ddp.diagnose.verdicts import ExtraCall

STATS = """
    def get_stats(estimate):
        t = torch.tensor([estimate])
        dist.all_reduce(t)
        return t.item()


    def test_x(rank):
        stats = get_stats(float(rank))
        if rank == 0:
            err = get_stats(stats)
        energy = get_stats(1.0)
"""


def _through(n: int, outer: str, done: bool = True) -> Call:
    """all_reduce #n made in get_stats, called at ``outer``; still running unless ``done``."""
    made = (ok if done else call)("all_reduce", n, site="t.py:4")
    made.outer = (outer,)
    return made


def test_a_call_more_in_a_branch_for_one_rank_that_met_the_others_next_names_that_rank() -> None:
    """netket#2275: rank 0's summary all-reduces through the helper every rank calls next, so
    rank 1's final call meets rank 0's extra one; rank 0 waits alone in its own final call."""
    zero = rank(0, _through(1, "t.py:9"), _through(2, "t.py:11"), _through(3, "t.py:12", done=False))
    one = rank(1, _through(1, "t.py:9"), _through(2, "t.py:12"), finished=True)
    verdict = watched(snap(zero, one), STATS)
    assert outline(verdict) == ("deadlock", "partial", [0], [])
    assert isinstance(verdict.finding, ExtraCall)
    assert verdict.call == "all_reduce #2"
    assert verdict.summary == (
        "rank 0 alone called all_reduce #2 (t.py:4) from t.py:11, in a branch of the code for one rank"
        " (t.py:10), and it met rank 1's from t.py:12; rank 1 returned from its test, and rank 0 waits"
        " in all_reduce #3 (t.py:4)."
    )


def test_a_call_more_met_from_another_line_under_no_branch_for_its_rank_stays_a_tie() -> None:
    for condition in ("rank != 1", "flag"):
        zero = rank(0, _through(1, "t.py:9"), _through(2, "t.py:11"), _through(3, "t.py:12", done=False))
        one = rank(1, _through(1, "t.py:9"), _through(2, "t.py:12"), finished=True)
        verdict = watched(snap(zero, one), STATS.replace("rank == 0", condition))
        assert outline(verdict)[:3] == ("deadlock", "partial", [0, 1]), condition


EARLY = """\
    def sync(rank, t):
        if rank == 0:
            dist.all_reduce(t)
            return
        dist.all_reduce(t)


    def test_x(rank):
        t = torch.ones(1)
        sync(rank, t)
        if rank == 1:
            return
        dist.all_reduce(t)
"""


def test_calls_from_other_lines_that_are_not_a_call_more_leave_the_rank_that_returned_named() -> None:
    """Each rank's all_reduce #1 came from its own line of ``sync`` (a branch for rank 0 that
    returns early), then rank 1 left: rank 0's #2 is not rank 1's #1 one later, so no call more."""
    first, later = ok("all_reduce", 1, site="t.py:3"), call("all_reduce", 2, site="t.py:13")
    first.outer = ("t.py:10",)
    theirs = ok("all_reduce", 1, site="t.py:5")
    theirs.outer = ("t.py:10",)
    verdict = watched(snap(rank(0, first, later), rank(1, theirs, finished=True)), EARLY)
    assert outline(verdict)[:3] == ("deadlock", "partial", [1])
