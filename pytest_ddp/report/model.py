"""A failed test's report as data, built once by :func:`build`, in the order the text reads;
each format renders this one model (the list is the package's docstring).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pytest_ddp.diagnose.headline import lead, tag
from pytest_ddp.diagnose.rank_words import not_entered, rank_doing
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.groups.runner import TestRun
from pytest_ddp.report import stack_tree
from pytest_ddp.report.sequences import Divergence, GroupSequences, divergence, group_sequences, p2p_table


@dataclass(frozen=True)
class RankFacts:
    """One rank: its state, what it is doing in words, and what it left (failure, stack, output)."""

    state: RankState
    doing: str  # "waiting in barrier #2 (test_x.py:20), in call" (rank_words.rank_doing)
    failure: str | None  # its failure's text (a traceback), if it failed
    stack: str | None  # its faulthandler dump, if it was stopped
    output: dict[str, str] | None  # its stdout and stderr

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def stderr(self) -> str:
        return (self.output or {}).get("stderr", "").rstrip()


@dataclass(frozen=True)
class Report:
    """A failed test's run and everything its report says of it, in the order the text says it."""

    # What happened: the test, its spec and times, the verdict, the ranks' states, and what failed
    # a test whose ranks all passed (faults not fired, sequences that differ, work left unfinished).
    run: TestRun
    test_file: str  # whose lines are marked in the ranks' stacks ("" for none)
    # What happened and to whom, in words.
    lead: str  # the verdict's summary, or what failed a test whose ranks all passed
    tag: str  # "[ddp deadlock, partial, 0.41 s]"
    # Each rank.
    ranks: list[RankFacts]
    # The tables: each group's collectives, where the ranks part ways, sends and receives unmatched.
    sequences: list[GroupSequences]
    divergence: Divergence | None
    p2p: list[str]
    # The stopped ranks' main threads, merged.
    tree: stack_tree.Tree

    @property
    def headline(self) -> str:
        """What happened and who (several lines when a rank's exception message is), then the tag."""
        return f"{self.lead} {self.tag}"


def build(run: TestRun, rank_failures: dict[int, str], test_file: str) -> Report:
    """The report of ``run``; ``rank_failures`` each failing rank's text, ``test_file`` the path
    whose lines the stacks mark."""
    states = run.states
    words = lead(
        run.verdict,
        unfinished=bool(run.unfinished_work),
        unreceived=bool(run.unreceived_messages),
        differ=bool(run.sequence_differences),
        not_fired=run.faults_not_fired,
        stop_teardown=bool(run.stop_teardown),
    )
    ranks = [
        RankFacts(
            s,
            rank_doing(s, _line_in(run.stacks.get(s.rank), test_file)),
            rank_failures.get(s.rank),
            run.stacks.get(s.rank),
            run.outputs.get(s.rank),
        )
        for s in states
    ]
    sequences = group_sequences(states)
    return Report(
        run=run,
        test_file=test_file,
        lead=words,
        tag=tag(run.verdict, run.elapsed),
        ranks=ranks,
        sequences=sequences,
        divergence=divergence(sequences, {s.rank: not_entered(s) for s in states}),
        p2p=p2p_table(states),
        tree=stack_tree.merged(run.stacks),
    )


def _line_in(dump: str | None, test_file: str) -> str | None:
    """``t.py:81``: the innermost frame of the test's file in a stopped rank's main thread, where
    it stood (shown as call sites show a file: relative to the working directory, where under it)."""
    frames = stack_tree.main_thread(dump) if dump and test_file else []
    line = next((f.line for f in reversed(frames) if f.file == test_file and f.line is not None), None)
    if line is None:
        return None
    relative = os.path.relpath(test_file)
    return f"{test_file if relative.startswith('..') else relative}:{line}"
