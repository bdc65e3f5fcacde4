"""Ties the user's code breaks (pytest_ddp.diagnose.code_ties), on hand-made rank states and the
source text of ``t.py``: no processes."""

from __future__ import annotations

from snapshots import R3, call, judge, ok, outline, rank, snap, watched

from pytest_ddp.diagnose.state import Call, RankState
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


TENSOR_DICT = """
    def broadcast_tensor_dict(tensors, group=None):
        dist.broadcast_object_list(meta, src=0, group=group)
        dist.broadcast(tensors, src=0)


    def test_x(rank):
        tp_group = dist.new_group([0, 1])
        if rank in (0, 1):
            broadcast_tensor_dict(inputs, group=tp_group)
        dist.barrier()
"""
def _tensor_dict_rank(r: int, meta_group: str, meta_ranks: tuple[int, ...]) -> RankState:
    """Rank 0 or 1 of vllm#3401: the metadata on ``meta_group``, then the tensor on the world (rank
    1's returned: it received from rank 0, and waits in the barrier)."""
    meta = ok("broadcast_object_list", 1, group=meta_group, ranks=meta_ranks, root=0, site="t.py:3")
    tensor = (call if r == 0 else ok)("broadcast", 1, ranks=R3, root=0, site="t.py:4")
    meta.outer = tensor.outer = ("t.py:10",)
    later = [] if r == 0 else [call("barrier", 2, ranks=R3, shape=None, site="t.py:11")]
    return rank(r, meta, tensor, *later)


def test_the_most_calling_on_the_world_right_after_their_own_group_in_their_branch_are_named() -> None:
    """vllm#3401: broadcast_tensor_dict sends the metadata on the tensor-parallel group of ranks 0
    and 1, then each tensor on the world; rank 2, outside, waits in the barrier every rank makes.
    The two are the majority, but their call was meant for their group."""
    outside = rank(2, call("barrier", 1, ranks=R3, shape=None, site="t.py:11"))
    verdict = watched(snap(*(_tensor_dict_rank(r, "1", (0, 1)) for r in (0, 1)), outside), TENSOR_DICT)
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [2])
    assert verdict.summary.endswith(
        "Ranks 0, 1' calls are in a branch of the code for them alone (t.py:9), right after their"
        " broadcast_object_list #1 on group 1 [0, 1] (t.py:3): theirs on WORLD was likely meant for that"
        " group."
    )


def test_the_most_on_the_world_after_a_call_on_the_world_or_in_no_branch_of_theirs_leave_the_few() -> None:
    outside = rank(2, call("barrier", 1, ranks=R3, shape=None, site="t.py:11"))
    # their call before was on the world (as numbered here, a call of rank 2's too: #0 stands apart)
    world = [_tensor_dict_rank(r, "WORLD", R3) for r in (0, 1)]
    assert outline(watched(snap(*world, outside), TENSOR_DICT))[2] == [2]
    # the branch is every rank's
    mine = [_tensor_dict_rank(r, "1", (0, 1)) for r in (0, 1)]
    verdict = watched(snap(*mine, outside), TENSOR_DICT.replace("rank in (0, 1)", "ready"))
    assert outline(verdict)[2] == [2]


SENDERS = """
    def test_x(rank, world_size):
        has_work = rank == 2
        if rank == 0:
            for src in range(1, world_size):
                item = torch.zeros(1)
                dist.recv(item, src=src)
        elif has_work:
            dist.send(torch.ones(1), dst=0)
        dist.barrier()
"""


def test_a_receive_from_a_rank_in_a_collective_in_a_branch_for_one_rank_names_that_rank() -> None:
    """mpifileutils#26: rank 0 receives from every other rank in turn, but only rank 2 sends;
    rank 1 waits in the barrier, rank 2 in its send to rank 0, behind the two."""
    zero = rank(0, call("recv", 1, peer=1, ranks=R3, site="t.py:7"))
    one = rank(1, call("barrier", 1, ranks=R3, shape=None, site="t.py:10"))
    two = rank(2, call("send", 1, peer=0, ranks=R3, site="t.py:9"))
    assert outline(judge(snap(zero, one, two))) == ("deadlock", "p2p_unmatched", [0, 1], [2])
    verdict = watched(snap(zero, one, two), SENDERS)
    assert outline(verdict) == ("deadlock", "p2p_unmatched", [0], [1, 2])


FORWARD = """
    def recv_pyobj(src):
        size = torch.zeros(1, dtype=torch.long)
        dist.recv(size, src=src)
        return size


    def send_pyobj(obj, dst):
        dist.send(obj, dst=dst)


    def handle(reqs):
        for req in reqs:
            dist.barrier()


    def test_x(rank, world_size):
        if rank == 0:
            reqs = [1]
        else:
            reqs = recv_pyobj(src=rank - 1)
        handle(reqs)
        if rank < world_size - 1:
            send_pyobj(reqs, dst=rank + 1)
"""


def _forwarding(source: str) -> tuple[RankState, RankState]:
    barrier = call("barrier", 1, shape=None, site="t.py:14")
    barrier.outer = ("t.py:22",)
    recv = call("recv", 1, peer=0, site="t.py:4")
    recv.outer = ("t.py:21",)
    return rank(0, barrier), rank(1, recv)


def test_a_collective_entered_before_the_send_the_peer_needs_to_reach_it_names_that_rank() -> None:
    """sglang#24687: the first stage runs a request's barrier before it forwards the requests the
    next stage waits for, and reaches that barrier only after it receives them."""
    assert outline(judge(snap(*_forwarding(FORWARD)))) == ("deadlock", "p2p_unmatched", [0, 1], [])
    verdict = watched(snap(*_forwarding(FORWARD)), FORWARD)
    assert outline(verdict) == ("deadlock", "p2p_unmatched", [0], [1])
    assert verdict.summary == (
        "rank 0 entered barrier #1 (t.py:14) from t.py:22 before its send at t.py:24, which rank 1's recv #1"
        " from 0 (t.py:4) waits for: rank 1's code reaches t.py:22 only after it."
    )


def test_a_collective_the_receiver_is_past_or_with_no_send_after_it_leaves_the_tie() -> None:
    sources = (
        FORWARD.replace("            send_pyobj(reqs, dst=rank + 1)", "            print(reqs)"),  # no send
        FORWARD.replace("        handle(reqs)\n", "        handle(reqs)\n        return\n"),  # leaves first
        FORWARD.replace("        handle(reqs)", "        if reqs:\n            handle(reqs)"),  # under a test
    )
    for source in sources:
        assert outline(watched(snap(*_forwarding(source)), source))[2] == [0, 1], source


ROLES = """
    def test_x(rank):
        batch = schedule(requests, 2 if rank == 0 else 1)
        for req in batch:
            if rank == 0:
                dist.send(hidden, dst=1)
                dist.recv(token, src=1)
            else:
                dist.recv(hidden, src=0)
                dist.send(token, dst=0)
        dist.barrier()
"""


def test_a_branch_for_one_rank_whose_else_the_peer_ran_stays_a_tie() -> None:
    """TensorRT-LLM#9659: each pipeline rank schedules its own requests, rank 0 one more; the
    exchange is an if/else on the rank that both went through before, each its side, so its
    branch for rank 0 tells nothing (the thread blames rank 1's schedule; uneven inputs, the rank
    with more)."""
    zero = rank(0, ok("send", 1, peer=1, site="t.py:6"), ok("recv", 1, peer=1, site="t.py:7"),
                ok("send", 2, peer=1, site="t.py:6"), call("recv", 2, peer=1, site="t.py:7"))
    one = rank(1, ok("recv", 1, peer=0, site="t.py:9"), ok("send", 1, peer=0, site="t.py:10"),
               call("barrier", 1, shape=None, site="t.py:11"))
    assert outline(watched(snap(zero, one), ROLES)) == ("deadlock", "p2p_unmatched", [0, 1], [])
    # the first time through: rank 0's branch posts a receive rank 1's else has no send for
    zero = rank(0, ok("send", 1, peer=1, site="t.py:6"), call("recv", 1, peer=1, site="t.py:7"))
    one = rank(1, ok("recv", 1, peer=0, site="t.py:9"), call("barrier", 1, shape=None, site="t.py:11"))
    assert outline(watched(snap(zero, one), ROLES))[2] == [0]
    # a batch's send from the receive's line is not the receive made before
    zero = rank(0, ok("send", 1, peer=1, site="t.py:7"), call("recv", 1, peer=1, site="t.py:7"))
    assert outline(watched(snap(zero, one), ROLES))[2] == [0]
    # where rank 1 had run no call of the else, the branch is code only rank 0 runs there
    zero = rank(0, call("send", 1, peer=1, site="t.py:6"))
    one = rank(1, call("barrier", 1, shape=None, site="t.py:11"))
    assert outline(watched(snap(zero, one), ROLES))[2] == [0]


def test_a_send_after_the_collective_the_sender_never_makes_or_that_needs_nothing_received_leaves_the_tie() -> None:
    """Review's counter-cases to the collective before the send: the send after is the receiver's
    own (under ``if rank != 0``), a generator's ``send(x)``, or the collective reads nothing the
    receive set (either order may be meant: the receive after it, or the send before)."""
    not_senders = FORWARD.replace("        if rank < world_size - 1:\n", "        if rank != 0:\n")
    not_a_send = FORWARD.replace("send_pyobj(reqs, dst=rank + 1)", "progress.send(reqs)")
    needs_nothing = FORWARD.replace("        handle(reqs)", "        handle(pending)")
    for source in (not_senders, not_a_send, needs_nothing):
        assert outline(watched(snap(*_forwarding(source)), source))[2] == [0, 1], source


def test_a_collective_after_an_exchange_in_a_loop_with_a_send_after_it_leaves_the_tie() -> None:
    """Review's: the receive waits in a loop the sender went round with it before (uneven counts,
    by role), and a later exchange sends after the barrier: not a send the receive waits for."""
    source = ROLES + "        if rank == 1:\n            dist.send(stats, dst=0)\n"
    zero = rank(0, ok("send", 1, peer=1, site="t.py:6"), ok("recv", 1, peer=1, site="t.py:7"),
                ok("send", 2, peer=1, site="t.py:6"), call("recv", 2, peer=1, site="t.py:7"))
    one = rank(1, ok("recv", 1, peer=0, site="t.py:9"), ok("send", 1, peer=0, site="t.py:10"),
               call("barrier", 1, shape=None, site="t.py:11"))
    assert outline(watched(snap(zero, one), source)) == ("deadlock", "p2p_unmatched", [0, 1], [])


def test_a_send_larger_than_its_receive_names_the_sender_whatever_group_each_made_before() -> None:
    """Review's: a group of one per rank (tensor parallel of size 1) before a receive in a branch
    for rank 1 is no group forgotten: the point-to-point overflow names the sender."""
    source = """
    def test_x(rank):
        dist.all_reduce(x, group=own[rank])
        if rank == 1:
            dist.recv(small, src=0)
        push(big, dst=1)
"""
    zero = rank(0, ok("all_reduce", 1, group="1", ranks=(0,), site="t.py:3"),
                call("send", 1, peer=1, shape=(8,), site="t.py:6"))
    one = rank(1, ok("all_reduce", 1, group="2", ranks=(1,), site="t.py:3"),
               call("recv", 1, peer=0, shape=(2,), site="t.py:5"))
    assert outline(watched(snap(zero, one), source)) == ("deadlock", "mismatch", [0], [1])
