"""Reports that stay readable at 64 ranks, on hand-made rank states: ranks alike share a line,
a table column and a stack section; a line names where the ranks part ways and the minority;
the JSON keeps every rank.  Also the shared-prefix shortcut the report and the watchdog take
over long runs, checked against the plain comparison it replaces."""

from __future__ import annotations

from snapshots import NOW, R3, call, ok, rank, snap

from pytest_ddp.config.spec import RankSpec
from pytest_ddp.diagnose import mismatches, watchdog
from pytest_ddp.diagnose.mismatches import shared_prefix
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.diagnose.wording import rank_list, worded
from pytest_ddp.groups.runner import TestRun
from pytest_ddp.report.failure import failure_text
from pytest_ddp.report.json_report import to_json
from pytest_ddp.report.model import build
from pytest_ddp.report.sequences import GROUP_ABOVE, MAX_PAIRS, group_sequences, p2p_table, table

WORLD = tuple(range(64))
FAULTHANDLER = """\
Current thread 0x00007f{thread:010x} (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line {line} in {op}
  File "/venv/lib/python3.11/site-packages/pytest_ddp/recorder.py", line 188 in recorded
  File "/src/train.py", line {site} in test_train
  File "/venv/lib/python3.11/site-packages/_pytest/python.py", line 187 in pytest_pyfunc_call
  File "/venv/lib/python3.11/site-packages/pluggy/_callers.py", line 103 in _multicall
"""


def steps(n: int, members: tuple[int, ...] = WORLD) -> list[Call]:
    """``n`` all_reduces every rank made, from train.py:30."""
    return [ok("all_reduce", seq, ranks=members, site="train.py:30") for seq in range(1, n + 1)]


def stack(r: int, op: str = "all_reduce", site: int = 40) -> str:
    return FAULTHANDLER.format(thread=0x1E63000B80 + r * 0x1000, line=3252 if op == "all_reduce" else 2701,
                               op=op, site=site)


def judged(states: list[RankState], stacks: dict[int, str] | None = None) -> TestRun:
    """The run the controller would report: the watchdog's verdict on these states, worded."""
    verdict = worded(watchdog.judge(snap(*states)), states)
    for state in states:
        state.peak_rss = (300 + state.rank % 5) * 2**20
    run = TestRun("train.py::test_train", RankSpec(len(states), "gloo", 60.0, 2.0), states, verdict, 0.4, NOW)
    run.stacks = stacks or {}
    return run


def skips_last(world: int = 64) -> TestRun:
    """Ranks 0-62 wait in all_reduce #12; rank 63 returned after #11."""
    members = tuple(range(world))
    states = [rank(r, *steps(11, members), call("all_reduce", 12, ranks=members, site="train.py:40"))
              for r in range(world - 1)]
    states.append(rank(world - 1, *steps(11, members), finished=True))
    return judged(states, {r: stack(r) for r in range(world - 1)})


def broadcasts_instead() -> TestRun:
    """Ranks 0-62 wait in all_reduce #12; rank 63 entered broadcast #12 from another line."""
    states = [rank(r, *steps(11), call("all_reduce", 12, ranks=WORLD, site="train.py:40")) for r in range(63)]
    states.append(rank(63, *steps(11), call("broadcast", 12, ranks=WORLD, root=0, site="train.py:44")))
    stacks = {r: stack(r) for r in range(63)} | {63: stack(63, "broadcast", 44)}
    return judged(states, stacks)


def section(text: str, title: str) -> list[str]:
    """The lines of the section with that title, up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def titles(text: str) -> list[str]:
    return [line.strip("- ") for line in text.splitlines() if line.startswith("-" * 20)]


# -- rank lists -----------------------------------------------------------------


def test_rank_lists_are_written_as_ranges() -> None:
    assert rank_list([*range(62), 63]) == "ranks 0-61, 63"
    assert rank_list([0, 1, 2, 5, 6, 7, 9]) == "ranks 0-2, 5-7, 9"
    assert rank_list([3, 4]) == "ranks 3, 4"  # two in a row read better as they are
    assert rank_list([7]) == "rank 7"


# -- a 64-rank hang -------------------------------------------------------------


def test_a_64_rank_hang_where_one_rank_returned_fits_a_screen_and_names_it() -> None:
    run = skips_last()
    assert (run.verdict.kind, run.verdict.culprits) == ("partial", [63])
    text = failure_text(run, {}, "/src/train.py")
    lines = text.splitlines()
    assert len(lines) <= 60, text
    assert lines[2] == (
        "the ranks part ways at all_reduce #12 (minority: rank 63): ranks 0-62 entered all_reduce [4] "
        "float32 (waiting); rank 63 did not enter it, finished (passed)"
    )
    assert "ranks 0-62: waiting in all_reduce #12 (train.py:40), in call; peak RSS 300-304 MB" in lines
    assert "rank 63: finished (passed); last call all_reduce #11 (train.py:30); peak RSS 303 MB" in lines
    table = section(text, "collectives on group WORLD")
    assert table[1].split() == ["#", "ranks", "0-62", "rank", "63"]
    assert [row for row in table if row.endswith("<-- ranks differ")] == [
        "  12  all_reduce [4] float32 (waiting)  -  <-- ranks differ"
    ]
    # 63 stacks that differ only in their thread ids: one section, with rank 0's dump.
    assert titles(text) == ["ranks 0-62: Python stacks when stopped"]
    assert '> File "/src/train.py", line 40 in test_train' in lines


def test_a_64_rank_hang_where_one_rank_sits_in_another_op_shows_its_stack_apart() -> None:
    run = broadcasts_instead()
    assert (run.verdict.kind, run.verdict.culprits) == ("mismatch", [63])
    text = failure_text(run, {}, "/src/train.py")
    odd = section(text, "rank 63: Python stacks when stopped")
    assert '> File "/src/train.py", line 44 in test_train' in odd
    assert len(text.splitlines()) <= 60 + len(odd) + 1
    assert titles(text) == [
        "ranks 0-63: Python stacks merged (main thread, outermost frame first)",  # report/stack_tree.py
        "ranks 0-62: Python stacks when stopped",
        "rank 63: Python stacks when stopped",
    ]
    assert "> `-- train.py:44 in test_train  [rank 63; not ranks 0-62]" in text.splitlines()
    assert text.splitlines()[2] == (
        "the ranks part ways at all_reduce #12 (minority: rank 63): ranks 0-62 entered all_reduce [4] float32 "
        "at train.py:40 (waiting); rank 63 entered broadcast [4] float32 root=0 at train.py:44 (waiting)"
    )
    assert "rank 63: waiting in broadcast #12 (train.py:44), in call; peak RSS 303 MB" in text.splitlines()


def test_an_odd_rank_in_the_middle_leaves_a_gap_in_the_range() -> None:
    states = [rank(r, *steps(11), call("all_reduce", 12, ranks=WORLD, site="train.py:40")) for r in range(64)]
    states[62] = rank(62, *steps(11), exit_code=-9)
    text = failure_text(judged(states), {}, "/src/train.py")
    assert "ranks 0-61, 63: waiting in all_reduce #12 (train.py:40), in call; peak RSS 300-304 MB" in text
    assert "rank 62: died (killed by SIGKILL) during call; last call all_reduce #11 (train.py:30)" in text
    assert "(minority: rank 62)" in text.splitlines()[2]


def test_a_split_without_a_majority_names_no_minority() -> None:
    members = tuple(range(16))
    states = [rank(r, *steps(2, members), call("all_reduce" if r < 8 else "broadcast", 3, ranks=members, root=None
                                               if r < 8 else 0)) for r in range(16)]
    text = failure_text(judged(states), {}, "/src/train.py")
    assert text.splitlines()[2].startswith("the ranks part ways at all_reduce #3 (no majority): ranks 0-7 entered")
    assert to_json(build(judged(states), {}, ""))["divergence"]["minority"] == []


def test_the_json_of_a_64_rank_hang_keeps_every_rank_and_says_where_they_part() -> None:
    data = to_json(build(skips_last(), {}, ""))
    assert [r["rank"] for r in data["ranks"]] == list(range(64))
    assert all(len(r["calls"]) in (11, 12) for r in data["ranks"])
    assert data["ranks"][5]["stack"].startswith("Current thread 0x00007f1e63005b80")  # each rank's own
    divergence = data["divergence"]
    assert (divergence["call"], divergence["seq"], divergence["minority"]) == ("all_reduce #12", 12, [63])
    assert [side["ranks"] for side in divergence["sides"]] == [list(range(63)), [63]]


# -- small reports stay as they were -----------------------------------------------


def test_up_to_eight_ranks_each_rank_has_its_line_and_column() -> None:
    run = skips_last(world=GROUP_ABOVE)
    text = failure_text(run, {}, "/src/train.py")
    lines = text.splitlines()
    assert lines[2].startswith("rank 0: waiting in all_reduce #12 (train.py:40), in call")  # no divergence line
    assert [line.split(":")[0] for line in lines[2:10]] == [f"rank {r}" for r in range(8)]
    assert section(text, "collectives on group")[1].split()[:5] == ["#", "rank", "0", "rank", "1"]
    assert "part ways" not in text


def test_ranks_whose_stacks_are_the_same_share_one_section_at_any_size() -> None:
    states = [rank(r, call("barrier", 1, shape=None)) for r in range(2)] + [rank(2, finished=True)]
    text = failure_text(judged(states, {0: stack(0), 1: stack(1)}), {}, "/src/train.py")
    assert titles(text) == ["ranks 0, 1: Python stacks when stopped"]
    assert "Current thread 0x00007f1e63000b80" in text  # rank 0's own dump, shown once


# -- the shortcut over long runs gives what the plain comparison gives ---------------


def test_shared_prefix_stops_at_the_first_field_that_differs() -> None:
    ranks = [steps(6) for _ in range(3)]
    assert shared_prefix(ranks) == 6
    ranks[1][4].shapes = [[8]]
    assert shared_prefix(ranks) == 4
    ranks[2][2].root = 1
    assert shared_prefix(ranks) == 2
    assert shared_prefix([steps(6), steps(3)]) == 3
    assert shared_prefix([]) == 0


def plain_finished_mismatch(ranks: list[RankState]) -> Verdict | None:
    """The watchdog's look after a test before the shortcut: every collective of every rank, by
    (group, number); the first with two signatures is the mismatch."""
    by_position: dict[tuple[str, int], dict[int, Call]] = {}
    for state in sorted(ranks, key=lambda s: s.rank):
        for c in state.calls:
            if c.is_collective and c.group != "?":
                by_position.setdefault((c.group, c.seq), {})[state.rank] = c
    for entered in by_position.values():
        if len({c.signature() for c in entered.values()}) > 1:
            by_rank = {s.rank: s for s in ranks}
            return mismatches.mismatch_verdict("done", by_rank, entered[min(entered)], Call.signature)
    return None


def after_the_test(*calls_per_rank: list[Call]) -> tuple[Verdict | None, Verdict]:
    """The plain comparison's mismatch, and the watchdog's verdict, once every rank finished and
    the last failed (a failure makes the watchdog look at every collective)."""
    states = [rank(r, *calls, finished=True) for r, calls in enumerate(calls_per_rank)]
    states[-1].failed_at = NOW - 0.5
    return plain_finished_mismatch(states), watchdog.judge(snap(*states))


def test_the_after_test_look_finds_what_the_plain_comparison_finds() -> None:
    # Alike, then a shape differs late: found at #5.
    late = steps(6)
    late[4] = ok("all_reduce", 5, ranks=WORLD, shape=(8,))
    expected, verdict = after_the_test(steps(6), steps(6), late)
    assert verdict == expected and (verdict.kind, verdict.culprits, verdict.call) == ("mismatch", [2], "all_reduce #5")
    # An uneven all_to_all differs in shape, yet agrees by signature: no mismatch.
    uneven = [ok("all_to_all_single", 1, ranks=WORLD, shape=(n,)) for n in (3, 5)]
    expected, verdict = after_the_test([uneven[0], *steps(3)[1:]], [uneven[1], *steps(3)[1:]])
    assert expected is None and verdict.kind == "failed"
    # Rank 2 made WORLD anew (its numbers start over): its second #2 is compared with the others'
    # #2, made in the part all ranks share.
    again = [ok("all_reduce", 1, ranks=WORLD), ok("broadcast", 2, ranks=WORLD, root=0)]
    expected, verdict = after_the_test(steps(3), steps(3), [*steps(3), *again])
    assert verdict == expected and (verdict.culprits, verdict.call) == ([2], "broadcast #2")


def test_the_table_over_a_long_run_marks_the_first_difference() -> None:
    long = [steps(2000) for _ in range(GROUP_ABOVE + 1)]
    long[3][1499].dtypes = ["float64"]
    states = [rank(r, *calls, finished=True) for r, calls in enumerate(long)]
    marked = [row for row in table(group_sequences(states)) if row.endswith("<-- ranks differ")]
    assert len(marked) == 1 and marked[0].split()[0] == "1500"


# -- the verdict waits for ranks still finishing a collective ------------------------


def test_a_certain_deadlock_waits_for_ranks_still_leaving_the_collective_before() -> None:
    """Seen with 64 real ranks: when rank 63 returned and the first ranks blocked in all_reduce
    #12, others were still leaving #11; the verdict named only the ranks already in #12."""
    def states(leaving: bool) -> list[RankState]:
        late = [call("all_reduce", 2, ranks=R3)]  # every member entered #2: it completes
        if not leaving:
            late = [ok("all_reduce", 2, ranks=R3), call("all_reduce", 3, ranks=R3)]
        return [
            rank(0, ok("all_reduce", 1, ranks=R3), ok("all_reduce", 2, ranks=R3), call("all_reduce", 3, ranks=R3)),
            rank(1, ok("all_reduce", 1, ranks=R3), *late),
            rank(2, ok("all_reduce", 1, ranks=R3), ok("all_reduce", 2, ranks=R3), finished=True),
        ]

    watch = watchdog.Watch()
    assert watchdog.judge(snap(*states(leaving=True))).culprits == [2]  # certain already
    assert watch.verdict(snap(*states(leaving=True))) is None  # rank 1 is leaving #2: wait for it
    later = snap(*states(leaving=False))
    later.now += watchdog.SETTLE / 2
    verdict = watch.verdict(later)
    assert verdict is not None and (verdict.culprits, verdict.waiting) == ([2], [0, 1])


def test_the_table_of_a_group_made_anew_shows_each_numbers_latest_call() -> None:
    again = [ok("all_reduce", 1, ranks=WORLD), ok("all_reduce", 2, ranks=WORLD)]
    states = [
        rank(0, *again, ok("all_reduce", 1, ranks=WORLD), finished=True),
        rank(1, *again, ok("broadcast", 1, ranks=WORLD, root=0), finished=True),
    ]
    rows = table(group_sequences(states))
    assert [row.split()[0] for row in rows[2:]] == ["1", "2"]
    assert rows[2].endswith("all_reduce [4] float32  broadcast [4] float32 root=0  <-- ranks differ")


def test_the_table_of_unmatched_sends_and_receives_lists_the_first_pairs_only() -> None:
    # Twelve ranks each wait to receive from rank 12, which returned: twelve pairs that do not match.
    ranks = tuple(range(13))
    states = [rank(r, call("recv", 1, peer=12, ranks=ranks)) for r in range(12)] + [rank(12, finished=True)]
    table = p2p_table(states)
    assert table[:2] == ["sends and receives that do not match:",
                         "  rank 12 -> rank 0 on WORLD: 0 sends, 1 recv; rank 0 waits in recv #1 from 12 (t.py:11)"]
    assert len(table) == 1 + MAX_PAIRS + 1 and table[-1] == f"  ... and {12 - MAX_PAIRS} more pairs"
