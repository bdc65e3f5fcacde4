"""What the watchdog finds, as data: the verdict, and the findings it is worded from.

Kinds of verdict (``Verdict.kind``):

``rank_exited``  a rank raised or died while others wait for it
``partial``      a rank finished its test normally without calling the
                 collective its peers wait in, or raised in once it ended
                 the group (only some ranks call it)
``mismatch``     ranks entered the same collective with a different op, size
                 or root, or wait for each other in different collectives
``p2p_cycle``    point-to-point calls wait for each other in a cycle
``p2p_unmatched``  a send or recv that its peer never matches: the peer went on
                 to a collective that waits for the sender or receiver
``init``         ``init_process_group`` cannot complete (duplicate rank, rank
                 out of range, world sizes differ or exceed the processes,
                 another address than the store's, a process never arrives)
``timeout``      the test ran out of time without a certain deadlock, or a
                 ``monitored_barrier`` did, naming the ranks that never came
``failed``       every rank finished, some failed, no distributed fault seen
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pytest_ddp.common.protocol import Setting
from pytest_ddp.diagnose.state import Call, LeftBy, RankState


@dataclass(frozen=True)
class Wait:
    """What a blocked rank needs before its call can complete."""

    call: Call
    peers: list[int]  # ranks it still needs; empty: all arrived, the call is just in progress
    any_of: bool = False  # one of ``peers`` suffices (a receive from any source)


# -- findings: the facts a verdict is worded from (see :mod:`pytest_ddp.diagnose.wording`) -----


@dataclass(frozen=True)
class Departed:
    """Doomed ranks wait for ranks that left the test (rank_exited, partial)."""

    culprits: list[int]  # left the test, at fault
    victims: list[int]  # left the test too, broken by a culprit's death inside their collective
    doomed: list[int]
    needs: dict[int, list[int]]  # doomed rank -> the gone or doomed ranks it needs
    left: dict[int, list[int]]  # doomed rank -> the gone ranks it needs
    waits: dict[int, Wait]
    # The two ends of the one connection that broke (majority.broken_pair): both named.
    broken: list[int] = field(default_factory=list)
    # A tie (as many wait as returned, each by known paths): a step more here or a step less on
    # the culprits; nothing tells which, so these are named too.
    alike: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class LeftMidCall:
    """Ranks returned from their test without a collective that their peers, fewer or as many,
    then raised in: they ended the group, or their process, under it (partial; Gloo: "Connection
    reset by peer")."""

    culprits: list[int]  # returned without it, at fault
    call: Call  # the collective they never entered (the lowest woken rank's)
    woken: dict[int, Call]  # rank -> its call that raised
    ended: dict[int, Call]  # culprit -> its destroy_process_group after its last call there, if made
    alike: list[int] = field(default_factory=list)  # a tie, as Departed's: the woken are named too


@dataclass(frozen=True)
class ExtraCall:
    """The few waiting ranks made a collective, or a send or receive, more than the rest, who
    returned (partial; the callers are at fault)."""

    callers: list[int]  # in the call, at fault
    returned: list[int]
    waits: dict[int, Wait]
    # Where as many returned: the line of the branch of the code that makes the call on one rank
    # only (code_ties.one_rank_call), which tells the caller departed.
    condition: str | None = None
    # Else the line of the loop over values that differ between ranks the callers are in
    # (code_ties.left_by_own_branch): they made a step more.
    loop: str | None = None
    # The user's line the branch holds, where it is not the call's own (the call is in a helper).
    made_from: str | None = None
    # The call more, where it was made before the one the caller waits in and met the returned
    # rank's next call, and the line that one came from (code_ties._met_from_another_line).
    earlier: Call | None = None
    met: str | None = None


@dataclass(frozen=True)
class Cycle:
    """Blocked ranks wait for each other in a cycle (p2p_cycle, or a mismatch of order)."""

    culprits: list[int]  # on the cycle
    waiting: list[int]  # behind it
    needs: dict[int, list[int]]
    waits: dict[int, Wait]
    p2p: bool
    # Ranks blocked in a send or recv whose peer waits in a collective instead: no matching call.
    unmatched: list[int] = field(default_factory=list)
    # The likely culprit: the rank whose calls went by a path no rank took before -> that path's
    # two calls (majority.new_paths for 2 ranks, majority.branched for more).
    after: dict[int, tuple[Call, Call]] = field(default_factory=dict)
    # Else the rank whose code skipped a call (code_ties.skipped_in_code) -> its two calls and the
    # sites of the calls skipped.
    skipped: dict[int, tuple[Call, Call, list[str]]] = field(default_factory=dict)
    # Else the ranks whose calls are in a branch of the code for them alone, the others' on no rank
    # test (code_ties.one_rank_branch_tie, ranks_branch_cycle) -> that branch's line: the verdict
    # names them.
    branch: dict[int, str] = field(default_factory=dict)
    # Else, where of two the one in a collective entered it from a line of the user's the other, in
    # a receive from it, reaches only after, and sends after it (code_ties.collective_before_send):
    # that rank -> (the line it entered it from, the line of its send); the verdict names it.
    sent_after: dict[int, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class MembersDiffer:
    """Ranks passed their k-th new_group other members (mismatch): torch makes one group of every
    rank's k-th, named alike, of the members each rank passed."""

    calls: dict[int, Call]  # each rank -> its k-th new_group
    number: int  # k, from 1
    odd: list[int]  # the ranks of the rarer members; empty at a tie


@dataclass(frozen=True)
class NoSuchPeer:
    """Ranks blocked in a send or receive whose peer is no member of its group (p2p_unmatched):
    Gloo waits for that rank's address in the store until the group's timeout."""

    culprits: list[int]
    members: dict[int, list[int]]  # culprit -> the members of its call's group
    waits: dict[int, Wait]  # the culprits', and those of the ranks that wait for them


@dataclass(frozen=True)
class Disagreement:
    """Ranks entered one collective (group, number) in ways that differ."""

    call: Call  # the call the disagreement was found at
    entered: dict[int, Call]  # each member that entered it -> its call there
    # In a tie, the likely culprits (majority.departures) -> the earlier call theirs departs from.
    likely: dict[int, Call] = field(default_factory=dict)
    # Else the ranks whose call came by a path no rank took before -> their call before it, and it.
    after: dict[int, tuple[Call, Call]] = field(default_factory=dict)
    # Else the one rank whose code makes a call between its call before and this one, as Cycle's.
    skipped: dict[int, tuple[Call, Call, list[str]]] = field(default_factory=dict)
    # The few whose call departs from most (majority.minority); empty in a tie.
    odd: list[int] = field(default_factory=list)
    # Where two tied and one's call is in a branch of the code for one rank, the other's on no rank
    # test (code_ties.one_rank_branch_tie): that branch's line; the first is then the odd rank.
    condition: str | None = None
    # Else, where one of two left by a break or return in a branch for it alone, or under a test of
    # a value that differs between ranks, the function or loop the other's call is in, before it
    # (code_ties.left_by_own_branch): that way out; it is the odd rank.
    left: LeftBy | None = None
    # Else, where one of two is in a loop over values that differ between ranks that the other made
    # a call in and left: that loop's line; the first made a step more, and is the odd rank.
    loop: str | None = None
    # A send and its receive: (the bytes sent, the bytes the receive holds), where the send's
    # message is the larger (mismatches.p2p_mismatch); the sender is the odd rank.
    overflow: tuple[int, int] | None = None
    # Where the most made their call on a group wider than themselves, right after a collective on a
    # group of exactly them, in a branch of the code they alone take (code_ties.own_group_forgotten):
    # that collective, and ``condition`` is the branch's line; they are then the odd ranks.
    own_group: Call | None = None


InitCheck = Literal[
    "out_of_range", "duplicate", "world_sizes", "world_size", "address", "unserved", "raised", "never",
]


@dataclass(frozen=True)
class Duplicate:
    """A rank two processes passed to init_process_group: those blamed, and those that passed it
    first (or as their own slot number)."""

    rank: int
    culprits: list[int]
    others: list[int]


@dataclass(frozen=True)
class InitFault:
    """init_process_group cannot complete.  Processes are slots (RankState.rank)."""

    check: InitCheck
    culprits: list[int]
    blocked: list[int]  # slots blocked in init_process_group
    duplicates: list[Duplicate] = field(default_factory=list)  # duplicate: each rank passed twice
    store: str | None = None  # address: the rank group's store, where most dialled it, or None; unserved: it
    server: int | None = None  # address, on a tie: the process that passed rank 0, serving the store


@dataclass(frozen=True)
class SlowRanks:
    """A ``monitored_barrier`` timed out, and torch's message names the ranks that never came."""

    slow: list[int]
    reporters: dict[int, Call]  # rank -> its monitored_barrier that raised, naming them


@dataclass(frozen=True)
class TimedOut:
    seconds: float
    described: list[int]  # the ranks whose activity the summary tells
    waits: dict[int, Wait]


@dataclass(frozen=True)
class GraceOver:
    """Ranks failed; the others went on for the grace period and were stopped."""

    failed: list[int]
    grace: float
    unfinished: list[int]
    waits: dict[int, Wait]
    woken: list[int] = field(default_factory=list)  # failed too, woken by a culprit's death


@dataclass(frozen=True)
class Failures:
    """Every rank finished; some failed (``woken``: raised because a rank died)."""

    failed: list[int]
    woken: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class NoneFinished:
    """Every rank's process ended before its test did: the test did not pass."""

    ranks: list[int]


@dataclass(frozen=True)
class SettingDiffers:
    """Ranks gave a value they must give alike (a pipeline schedule's microbatch count)
    differently; what hung or failed next (``then``) came of it."""

    values: dict[int, Setting]  # rank -> the first of its values that differs
    then: Verdict  # the verdict without it


@dataclass(frozen=True)
class CutOnPurpose:
    """The ranks a verdict named were woken by connections the test cut on purpose
    (:func:`pytest_ddp.faults.disconnect`); ``then``: what came of it."""

    cut: list[int]
    then: Verdict


Finding = (
    Departed | LeftMidCall | ExtraCall | Cycle | NoSuchPeer | MembersDiffer | Disagreement | InitFault
    | SlowRanks | TimedOut | GraceOver | Failures | NoneFinished | SettingDiffers | CutOnPurpose
)


@dataclass
class Verdict:
    """What the controller should do about a test now, and why."""

    status: str  # "wait" | "done" | "deadlock" | "stopped" | "timeout"
    kind: str | None = None  # see the module docstring; None for "wait" and for a "done" with no failure
    culprits: list[int] = field(default_factory=list)  # ranks at fault
    waiting: list[int] = field(default_factory=list)  # ranks stuck waiting for them
    collective: str | None = None  # op of the call at fault: "all_reduce"
    call: str | None = None  # its label: "all_reduce #3"
    finding: Finding | None = None  # the facts behind it
    summary: str = ""  # one or two sentences a human can act on: wording.worded() fills it in

    def call_at_fault(self, states: list[RankState]) -> Call | None:
        """The call it names (``call``): where the ranks disagree or a rank left mid-call, else the
        lowest waiting rank's call of that label, else its call; where none waits, the first raised
        on a rank not at fault."""
        finding = self.finding
        if isinstance(finding, (SettingDiffers, CutOnPurpose)):
            return finding.then.call_at_fault(states)
        if isinstance(finding, (Disagreement, LeftMidCall)):
            return finding.call
        waits = getattr(finding, "waits", None) or {}
        calls = [wait.call for _, wait in sorted(waits.items())]
        if calls:
            return next((call for call in calls if call.label == self.call), calls[0])
        raised = (c for s in states if s.rank not in self.culprits for c in s.calls if c.state == "raised")
        return next(raised, None)
