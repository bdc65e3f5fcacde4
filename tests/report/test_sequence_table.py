"""The collective sequence table (report/sequences.py) on hand-made rank states: a cell says the
call, not the line it came from; where the ranks met in a collective from different lines, one
line under the table says each line once, with its ranks."""

from __future__ import annotations

from snapshots import R4, call, ok, rank

from pytest_ddp.report.sequences import group_sequences, table


def test_a_collective_met_from_different_lines_says_each_line_once_under_the_table() -> None:
    states = [
        rank(r, ok("all_reduce", 1, ranks=R4, site="t.py:16"), call("all_reduce", 2, ranks=R4, site="t.py:20"))
        for r in range(3)
    ]
    states.append(rank(3, ok("all_reduce", 1, ranks=R4, site="t.py:16"),
                       call("barrier", 2, ranks=R4, shape=None, site="t.py:18")))
    states[2].calls[1].caller = "lightning/strategy.py:40"
    lines = table(group_sequences(states))
    row = next(line for line in lines if line.startswith("  2 "))
    assert "t.py" not in row and row.count("(waiting)") == 4
    assert lines[-1] == (
        "  #2 called at t.py:20 (ranks 0, 1), t.py:20 via lightning/strategy.py:40 (rank 2), t.py:18 (rank 3)"
    )
    assert max(map(len, lines)) < 160  # 290 when each cell said its line


def test_a_collective_every_rank_made_from_one_line_says_no_line() -> None:
    states = [rank(r, ok("all_reduce", 1, ranks=R4), call("all_reduce", 2, ranks=R4)) for r in range(3)]
    states.append(rank(3, ok("all_reduce", 1, ranks=R4), finished=True))
    assert not any("called at" in line or "t.py" in line for line in table(group_sequences(states)))
