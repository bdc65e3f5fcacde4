"""MPI's point-to-point rules, for the watchdog and the after-test check.  Pure: no processes, no I/O.

MPI pairs a receive with a message by (communicator, source, tag), ``ANY_SOURCE``/``ANY_TAG``
matching any; messages from one sender to one receiver do not overtake each other, and receives
take messages in the order posted.  A standard send may return before any receive is posted
(MPICH's eager protocol buffers small messages), so a receive no message matches waits for its
sender (any member, for any source); a send still inside its call waits for its receiver; and a
returned send that no receive took is no hang, but a message never received once the test is over.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from pytest_ddp.common.ops import MPI_ABORT
from pytest_ddp.common.protocol import NULL_PEER
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Wait


@dataclass(frozen=True)
class Message:
    """A message an MPI send (or Sendrecv) put on its way."""

    rank: int  # the sender
    call: Call
    dest: int
    tag: int | None


@dataclass
class Matching:
    """Which message each posted receive takes, and the messages no receive took."""

    received: dict[tuple[int, int], Message] = field(default_factory=dict)  # (rank, call index) -> message
    delivered: set[tuple[int, int]] = field(default_factory=set)  # (sender, call index) of messages taken
    left: list[Message] = field(default_factory=list)  # in send order per sender


def is_mpi_p2p(call: Call) -> bool:
    return call.kind.api == "mpi" and call.is_p2p


# MPI's error for a receive into a buffer too small (MPI_ERR_TRUNCATE): raised after the match.
# MPICH says "Message truncated", Open MPI "MPI_ERR_TRUNCATE: message truncated".
TRUNCATED = "message truncated"


def _posted(state: RankState, call: Call) -> bool:
    """A message was sent, or a receive posted: its call returned, or runs in a live process
    (one that raised never took part, except a receive that took its message and found it too
    long; one whose process died will not)."""
    if call.state == "raised":
        return TRUNCATED in (call.error or "").lower()
    return call.state == "ok" or (call.state == "running" and state.alive)


def _sent(call: Call) -> tuple[int, int | None] | None:
    """(destination, tag) of the message the call sends, if it sends one."""
    sends = call.kind.direction == "send" or call.kind.recv_from
    return (call.peer, call.tag) if sends and call.peer is not None and call.peer != NULL_PEER else None


def _wanted(call: Call) -> tuple[int | None, int | None] | None:
    """(source, tag) of the message a receive, probe or Sendrecv wants (None: any); None if none."""
    kind = call.kind
    if kind.recv_from:
        source, tag = call.extra.get("recv_from"), call.extra.get("recv_tag")
    elif kind.direction == "recv":
        source, tag = call.peer, call.tag
    else:
        return None
    return None if source == NULL_PEER else (source, tag)


def _matches(message: Message, group: str, source: int | None, tag: int | None) -> bool:
    return (
        message.call.group == group
        and (source is None or message.rank == source)
        and (tag is None or message.tag == tag)
    )


def match(ranks: dict[int, RankState]) -> Matching:
    """Pair each rank's posted receives with the messages sent to it, as MPI would have.

    Receives that returned are paired first (their ``ret`` names the sender): what they got is
    known, what a waiting one will get is not; a waiting one takes the earliest sent it accepts."""
    inbox: dict[int, list[Message]] = {r: [] for r in ranks}  # receiver -> messages, in send order per sender
    receives: dict[int, list[Call]] = {r: [] for r in ranks}
    for rank, state in sorted(ranks.items()):
        for call in state.calls:
            if not is_mpi_p2p(call) or not _posted(state, call):
                continue
            sent = _sent(call)
            if sent is not None and sent[0] in inbox:
                inbox[sent[0]].append(Message(rank, call, *sent))
            if _wanted(call) is not None and not call.kind.probe:
                receives[rank].append(call)
    matching = Matching()
    for rank, posted in receives.items():
        messages = sorted(inbox[rank], key=lambda m: m.call.enter)  # stable: per sender, in send order
        for call in sorted(posted, key=lambda c: (c.state != "ok", c.index)):
            wanted = _wanted(call)
            assert wanted is not None
            source, tag = wanted
            if source is None and call.state == "ok" and call.got_source is not None:
                source = call.got_source
            taken = next((m for m in messages if _matches(m, call.group, source, tag)), None)
            if taken is not None:
                messages.remove(taken)
                matching.received[(rank, call.index)] = taken
                matching.delivered.add((taken.rank, taken.call.index))
        matching.left += sorted(messages, key=lambda m: (m.rank, m.call.index))
    return matching


class P2P:
    """The waits of ranks blocked in MPI point-to-point calls; messages are matched once, when
    the first such wait is asked for."""

    def __init__(self, ranks: dict[int, RankState]) -> None:
        self._ranks = ranks

    @functools.cached_property
    def _matching(self) -> Matching:
        return match(self._ranks)

    def wait(self, rank: int, call: Call) -> Wait | None:
        """What the blocked call needs: the sender of a message it still lacks, else the
        receiver of a message of its own that no receive took; [] when it only has to finish."""
        wanted = _wanted(call)
        if wanted is not None and not self._has_message(rank, call, *wanted):
            return self._senders(rank, call, wanted[0])
        sent = _sent(call)
        if sent is not None and (rank, call.index) not in self._matching.delivered:
            return Wait(call, [sent[0]]) if sent[0] in self._ranks else None
        return Wait(call, [])

    def _has_message(self, rank: int, call: Call, source: int | None, tag: int | None) -> bool:
        if call.kind.probe:  # looks for a message no receive took, and leaves it there
            return any(m.dest == rank and _matches(m, call.group, source, tag) for m in self._matching.left)
        return (rank, call.index) in self._matching.received

    def _senders(self, rank: int, call: Call, source: int | None) -> Wait | None:
        if source is not None:
            return Wait(call, [source]) if source in self._ranks else None
        if not call.group_ranks:
            return None
        members = [m for m in call.group_ranks if m != rank and m in self._ranks]
        return Wait(call, members, any_of=True)


def may_return_alone(call: Call) -> bool:
    """A rank inside a standard MPI send (or Sendrecv) may be about to return, its message
    buffered: the watchdog gives it time before it takes the rank for blocked."""
    kind = call.kind
    return is_mpi_p2p(call) and (kind.direction == "send" or bool(kind.recv_from)) and not kind.synchronous


def unreceived_from(ranks: dict[int, RankState], sender: int, dest: int, group: str) -> list[Message]:
    """The messages from ``sender`` to ``dest`` on ``group`` that no receive took (sent with a
    tag the receives do not want, say)."""
    return [m for m in match(ranks).left if (m.rank, m.dest, m.call.group) == (sender, dest, group)]


def mpi_abort(state: RankState) -> Call | None:
    """The MPI_Abort this rank's process ended in, if it did: the rank failed, whatever its exit
    status."""
    if state.alive or not state.calls:
        return None
    last = state.calls[-1]
    if last.op == MPI_ABORT and last.state == "running":
        return last
    return None
