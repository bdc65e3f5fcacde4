"""The forkserver ranks are forked from (groups/spawn.py, forkserver_guard.py): it serves its session
alone."""

from __future__ import annotations

# Rank 0 writes garbage to its own forkserver's socket and waits until the forkserver has refused it
# (a forkserver that ended on it killed both ranks: "ranks 0, 1 died (exit code 255)"); the next test,
# on a group of its own, is forked by the same forkserver.
GARBAGE = """
import socket
from multiprocessing import forkserver

@pytest.mark.ddp(world_size=2)
def test_garbage_to_the_forkserver(rank):
    address = forkserver._forkserver._forkserver_address
    refused = os.path.join(os.path.dirname(address), "refused")
    if rank == 0:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(address)
            try:
                sock.sendall(b"garbage")
            except BrokenPipeError:  # refused before it wrote
                pass
        while not os.path.exists(refused):
            time.sleep(0.01)
        with open("forkserver.pid", "w") as f:
            f.write(str(os.getppid()))
    dist.barrier()

@pytest.mark.ddp(world_size=1)
def test_forked_by_the_same_forkserver():
    with open("forkserver.pid") as f:
        assert int(f.read()) == os.getppid()
"""


def test_the_forkserver_refuses_a_connection_its_session_did_not_make_and_says_so(ddp_pytester) -> None:
    result = ddp_pytester.run(GARBAGE, "-v")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*test_it.py::test_garbage_to_the_forkserver",
            "*ForkserverRefusedWarning: the forkserver refused a connection from pid * (ddp-rank0, uid *): "
            "it forks for this session alone",
        ]
    )
