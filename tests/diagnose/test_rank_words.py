"""How the report words a rank: a stopped one, one that wrote no stack, each peer's copy of one
Gloo error, the odd rank of a mismatch first.  Hand-made states: no processes."""

from __future__ import annotations

import signal

from snapshots import NOW, R4, call, judge, ok, rank, snap

from pytest_ddp.common.protocol import ThreadRaised
from pytest_ddp.diagnose.rank_words import plain_error, rank_doing
from pytest_ddp.diagnose.state import Process, RankState

USR1 = f"{1 << (signal.SIGUSR1 - 1):016x}"
CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"
          " [127.0.0.1]:{port}. This is typically caused by a remote worker crashing. Check the logs of the"
          " remote worker before reporting an error. GLHF!")


def test_the_kernels_word_on_sigusr1() -> None:
    none = "0" * 16
    assert Process.read("S", {"SigBlk": none, "SigIgn": USR1, "SigCgt": none}).usr1 == "ignored"
    assert Process.read("S", {"SigBlk": USR1, "SigIgn": none, "SigCgt": USR1}).usr1 == "blocked"
    assert Process.read("S", {"SigBlk": none, "SigIgn": none, "SigCgt": USR1}).usr1 == "caught"
    assert Process.read("S", {}).usr1 == "default"
    assert Process.read("T", {}).stopped and not Process.read("S", {}).stopped


def test_a_stopped_rank_is_named_stopped_not_running() -> None:
    waiting, stopped = rank(0, call("all_reduce", 2, site="t.py:9")), rank(1, ok("all_reduce", 1))
    stopped.process = Process("T", "caught")
    verdict = judge(snap(waiting, stopped, timeout=5, started=NOW - 6))
    assert verdict.summary == (
        "timed out after 5 s: rank 1 is stopped (state T in /proc: SIGSTOP, or a debugger), outside any"
        " collective; rank 0 waits in all_reduce #2 (t.py:9) for rank 1."
    )
    stopped.stack_missing = True
    assert rank_doing(stopped) == (
        "stopped (state T in /proc: SIGSTOP, or a debugger) during call, outside any collective; last call"
        " all_reduce #1 (t.py:11); no Python stack: a stopped process runs no signal handler"
    )


def test_a_rank_whose_thread_raised_says_so_where_it_runs_outside_any_collective() -> None:
    # infinibatch#17: the loader's prefetch worker died; the training process waits for its batch.
    waiting, running = rank(0, call("all_reduce", 1, site="t.py:9")), rank(1)
    running.apply(ThreadRaised("Thread-3 (worker)", "OSError: corrupt shard", "t.py:4"))
    verdict = judge(snap(waiting, running, timeout=5, started=NOW - 6))
    assert verdict.summary == (
        "timed out after 5 s: rank 1 is running outside any collective, after its thread Thread-3 (worker)"
        " raised OSError: corrupt shard at t.py:4; rank 0 waits in all_reduce #1 (t.py:9) for rank 1."
    )
    assert rank_doing(running) == (
        "running (call), outside any collective; last call no collective yet; its thread Thread-3 (worker)"
        " raised OSError: corrupt shard at t.py:4"
    )


def test_a_rank_without_a_stack_says_why() -> None:
    state = rank(0, call("all_reduce", 2, site="t.py:9"))
    assert rank_doing(state) == "waiting in all_reduce #2 (t.py:9), in call"
    state.stack_missing = True
    state.process = Process("S", "ignored")
    ignored = "; no Python stack: SIGUSR1, which asks for it, is ignored (the test's doing)"
    assert rank_doing(state).endswith(ignored)
    state.process = Process("S", "caught")
    caught = "has another handler (the test's), or the process ran no Python (state S in /proc)"
    assert rank_doing(state).endswith(caught)
    state.process = None
    assert rank_doing(state).endswith("; no Python stack came")


def test_each_peers_copy_of_one_gloo_error_is_said_once() -> None:
    assert plain_error(CLOSED.format(port=23975)) == "RuntimeError: Connection closed by peer"
    def woken(r: int) -> RankState:
        error = CLOSED.format(port=23000 + r)
        raised = call("all_reduce", 2, ranks=R4, state="raised", error=error)
        return rank(r, ok("all_reduce", 1, ranks=R4), raised, finished=True, failed=error)

    dead = rank(3, ok("all_reduce", 1, ranks=R4), exit_code=-9)
    verdict = judge(snap(woken(0), woken(1), woken(2), dead))
    assert verdict.summary == (
        "rank 3 died (killed by SIGKILL); then ranks 0-2 raised RuntimeError: Connection closed by peer in"
        " all_reduce #2 (t.py:12)."
    )


def test_the_odd_rank_of_a_mismatch_leads() -> None:
    """Rank 3 calls barrier where ranks 0-2 call all_reduce: the JSON's culprit leads the headline."""
    states = [rank(r, call("all_reduce", 1, ranks=R4)) for r in range(3)]
    states.append(rank(3, call("barrier", 1, ranks=R4, shape=None)))
    verdict = judge(snap(*states))
    assert verdict.culprits == [3]
    assert verdict.summary == (
        "rank 3 departs from ranks 0-2 on collective #1: rank 3 barrier,"
        " ranks 0-2 all_reduce shapes [[4]] float32."
    )
