"""The forkserver ranks are forked from (groups/spawn.py, forkserver_guard.py): it serves its session
alone: the controller, and what it forked (a rank, what a rank's test starts)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from conftest import wait_for

# Rank 0 names its forkserver's socket, and another process of this user (not of the session) writes
# garbage there; rank 0 waits until the forkserver has refused it (a forkserver that ended on it
# killed both ranks: "ranks 0, 1 died (exit code 255)"). The next test, on a group of its own, is
# forked by the same forkserver.
GARBAGE = """
from multiprocessing import forkserver

@pytest.mark.ddp(world_size=2)
def test_garbage_to_the_forkserver(rank):
    address = forkserver._forkserver._forkserver_address
    refused = os.path.join(os.path.dirname(address), "refused")
    if rank == 0:
        with open("forkserver.pid", "w") as f:
            f.write(str(os.getppid()))
        with open("address.tmp", "w") as f:
            f.write(address)
        os.replace("address.tmp", "address")
        while not os.path.exists(refused):
            time.sleep(0.01)
    dist.barrier()

@pytest.mark.ddp(world_size=1)
def test_forked_by_the_same_forkserver():
    with open("forkserver.pid") as f:
        assert int(f.read()) == os.getppid()
"""


# Another process of this user, neither the forkserver's parent (the inner session's controller)
# nor forked from it.
WRITE_GARBAGE = """
import socket, sys
with socket.socket(socket.AF_UNIX) as sock:
    sock.connect(sys.argv[1])
    try:
        sock.sendall(b"garbage")
    except BrokenPipeError:  # refused before it wrote
        pass
"""


def _write_garbage_once_named(folder: Path) -> None:
    address = folder / "address"
    wait_for(address.exists, "rank 0 to name its forkserver's socket")
    subprocess.run([sys.executable, "-c", WRITE_GARBAGE, address.read_text()], check=True, timeout=60)


def test_the_forkserver_refuses_a_stranger_and_says_so(ddp_pytester) -> None:
    writer = threading.Thread(target=_write_garbage_once_named, args=(ddp_pytester.pytester.path,))
    writer.start()
    try:
        # A session of its own: a session in this process would share this process's forkserver
        # (multiprocessing's is one a process), and this session would hear of the refusal too.
        result = ddp_pytester.run_subprocess(GARBAGE, "-v")
    finally:
        writer.join()
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*test_it.py::test_garbage_to_the_forkserver",
            "*ForkserverRefusedWarning: the forkserver refused a connection from pid * (python*, uid *): "
            "it forks for this session alone",
        ]
    )


HELD_KILL = """
import os, signal
from pytest_ddp.groups import spawn

signal.signal(signal.SIGTERM, spawn._die_of_signal)
spawn.hold_killing_signals()
os.kill(os.getpid(), signal.SIGTERM)
print("the report is out", flush=True)
spawn.release_killing_signals()
print("lived on", flush=True)
"""


def test_a_kill_while_held_waits_for_the_release() -> None:
    """A test already handed to the ranks that SIGTERMs its controller (its xdist worker) ends it
    only once the test before is reported whole: the controller holds its killing signals until
    the next test begins (benchmarks/chaos.py found that passed test reported as the worker's crash)."""
    done = subprocess.run([sys.executable, "-c", HELD_KILL], capture_output=True, text=True, timeout=60)
    assert done.stdout == "the report is out\n", done.stderr
    assert done.returncode == -15
