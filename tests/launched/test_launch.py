"""Launched mode's pure parts: which launcher, which rank, where to meet; what collections differ in;
the messages between the launched pytest processes; a host's look at a rank's stack dump."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pytest_ddp.common.protocol import RankRole
from pytest_ddp.groups.spawn import ForkedRank, rank_files
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.host import Host, Slot
from pytest_ddp.launched.launch import Launch, LaunchError, channel_address, collection_differences, detect
from pytest_ddp.launched.link import connect, meeting_places
from pytest_ddp.launched.signals import ENDING_SIGNALS
from pytest_ddp.launched.world import LaunchedWorld

# What each launcher really sets (docs/launchers.md says where each was read).
TORCHRUN = {
    "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.77.0.1", "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
}
SRUN = {
    "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2",
    "PMI_RANK": "3", "PMI_SIZE": "4",
}
HYDRA = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4", "PMI_HOSTNAME": "vm"}
GFORKER = {"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "8"}
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}


def test_torchrun_across_two_nodes() -> None:
    launch = detect(TORCHRUN)
    assert launch is not None
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank, launch.node_rank, launch.nodes) == (
        "torchrun", 1, 4, 1, 0, 2,
    )
    assert launch.describe() == "launched by torchrun: 4 ranks on 2 nodes"
    assert not launch.controller
    # Several nodes: the first node's address, the port from torchrun's store.
    assert channel_address(launch) == ("10.77.0.1", 0)


def test_srun_task_and_not_the_batch_script() -> None:
    launch = detect(SRUN)
    assert launch is not None
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank, launch.nodes) == (
        "slurm", 3, 4, 1, 2,
    )
    # The batch script has a job but no step: plain pytest there is an ordinary session.
    batch = {k: v for k, v in SRUN.items() if k not in ("SLURM_STEP_ID", "SLURM_PROCID", "PMI_RANK", "PMI_SIZE")}
    assert detect(batch) is None


def test_mpi_launchers() -> None:
    hydra, gforker, ompi = detect(HYDRA), detect(GFORKER), detect(OPEN_MPI)
    assert hydra is not None and (hydra.rank, hydra.world_size, hydra.nodes) == (2, 4, 1)
    # gforker says nothing of nodes: it starts the processes of one machine.
    assert gforker is not None and (gforker.rank, gforker.world_size, gforker.local_rank, gforker.nodes) == (1, 2, 1, 1)
    assert ompi is not None and (ompi.rank, ompi.local_rank, ompi.node_rank, ompi.nodes) == (5, 1, 1, 2)
    assert {hydra.launcher, gforker.launcher, ompi.launcher} == {"mpi"}


def test_one_node_meets_on_a_unix_socket_in_a_private_folder_named_after_the_launch() -> None:
    one_node = {**TORCHRUN, "GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "4"}
    launch = detect(one_node)
    assert launch is not None
    assert channel_address(launch) is None
    socket_path = meeting_places(launch, one_node)[0].socket
    assert socket_path.parent.name == f"pytest-ddp-{os.getuid()}"
    restarted = detect({**one_node, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert restarted is not None and meeting_places(restarted, one_node)[0].socket != socket_path


def test_srun_across_nodes_needs_master_addr_and_port() -> None:
    launch = detect(SRUN)
    assert launch is not None
    with pytest.raises(LaunchError, match="set MASTER_ADDR"):
        channel_address(launch)
    with_addr = detect({**SRUN, "MASTER_ADDR": "node1"})
    assert with_addr is not None
    with pytest.raises(LaunchError, match="set MASTER_PORT"):
        channel_address(with_addr)
    both = detect({**SRUN, "MASTER_ADDR": "node1", "MASTER_PORT": "29500"})
    assert both is not None and channel_address(both) == ("node1", 29500)


def test_torchrun_wins_inside_an_srun_step() -> None:
    launch = detect({**SRUN, **TORCHRUN})
    assert launch is not None and launch.launcher == "torchrun"


def test_one_process_is_an_ordinary_session() -> None:
    assert detect({**GFORKER, "PMI_RANK": "0", "PMI_SIZE": "1"}) is None
    assert detect({}) is None


def test_forced_launcher() -> None:
    assert detect(TORCHRUN, "local") is None
    launch = detect(SRUN, "mpi")  # srun with --mpi=pmi2 sets PMI_RANK: MPI's view, if asked for
    assert launch is not None and launch.launcher == "mpi"
    with pytest.raises(LaunchError, match="--ddp-launcher=slurm: this process was not started by slurm"):
        detect(TORCHRUN, "slurm")


def test_incomplete_environment_is_an_error_naming_the_variables() -> None:
    with pytest.raises(LaunchError, match="GROUP_WORLD_SIZE"):
        detect({k: v for k, v in TORCHRUN.items() if k != "GROUP_WORLD_SIZE"})


def _launch(**changes: object) -> Launch:
    fields = dict(
        launcher="mpi", rank=0, world_size=2, local_rank=0, node_rank=0, nodes=1,
        job="j", master_addr=None, master_port=None,
    )
    return Launch(**{**fields, **changes})  # type: ignore[arg-type]


def test_describe_counts() -> None:
    assert _launch().describe() == "launched by mpi: 2 ranks on 1 node"


def test_collections_that_agree() -> None:
    assert collection_differences({0: ["a", "b"], 1: ["a", "b"]}, {}) is None


def test_collection_differences_name_rank_node_and_tests() -> None:
    text = collection_differences(
        {0: ["t::a", "t::b"], 1: ["t::a", "t::b"], 2: ["t::a", "t::c"], 3: ["t::b", "t::a"]},
        {0: "n0", 2: "n1", 3: "n1"},
    )
    assert text is not None
    assert "rank 2 (on n1): 1 only on this rank: t::c" in text
    assert "rank 2 (on n1): 1 not collected here: t::b" in text
    assert "rank 3 (on n1): the same tests in another order" in text
    assert "rank 1" not in text


def test_collection_differences_are_cut_after_five() -> None:
    text = collection_differences({0: [], 1: [f"t::{i}" for i in range(8)]}, {})
    assert text is not None and "8 only on this rank: t::0, t::1, t::2, t::3, t::4 and 3 more" in text


@pytest.mark.parametrize(
    "message",
    [
        hp.Hello(1, 1, 0, "node", ["a::b"], ["err"], "/tmp/log"),
        hp.Data(3, "events", b'{"e": "call"}\n\x00\xff'),
        hp.Command(3, b'{"cmd": "stop"}\n'),
        hp.Start(2, RankRole(1, 2, "gloo", True, "pytest", 60.0, "10.0.0.1", 29500, 0), {"RANK": "1"}, ["a::b"]),
        hp.Exited(2, -9, 12.5),
        hp.Dumped(1),
        hp.Dump(1),
        hp.Kill(1),
        hp.End(4, "why"),
    ],
)
def test_host_messages_round_trip(message: hp.Message) -> None:
    assert hp.decode(hp.encode(message)) == message


def test_a_frame_that_is_not_a_host_message() -> None:
    with pytest.raises(ValueError, match="not a host message"):
        hp.decode(b'{"k": "nonsense"}\n')


FIRST_DUMP = 'Thread 0x1 (most recent call first):\n  File "test_it.py", line 3 in test_first\n'
SECOND_DUMP = 'Thread 0x1 (most recent call first):\n  File "test_it.py", line 7 in test_second\n'


def test_a_host_tells_a_second_dump_whole_only_once_it_is_written(tmp_path: Path) -> None:
    """A warm rank's dump file holds the dump of an earlier hang: the host's check starts
    where the file ended when the controller asked again, not at its beginning."""
    ignores_sigusr1 = subprocess.Popen(
        ["sleep", "60"], preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    )  # a rank whose dump is late: the signal reaches it, and nothing is written yet
    to_controller, controller = multiprocessing.Pipe()
    host = Host(to_controller, tmp_path, lambda node_ids: [])
    files = rank_files(tmp_path, 1)
    files["dump"].write_text(FIRST_DUMP)
    commands, notify = multiprocessing.Pipe()
    slot = Slot(0, ForkedRank(ignores_sigusr1, commands, notify), files)
    host.slots[0] = slot
    try:
        host._forward(slot)  # the first dump went to the controller with the first hang
        assert hp.decode(controller.recv_bytes()) == hp.Data(0, "dump", FIRST_DUMP.encode())
        host._obey(hp.Dump(0))
        for _ in range(3):  # looks at the file while the second dump is not there
            host._check_dump(slot)
        assert not controller.poll(0), hp.decode(controller.recv_bytes())
        with open(files["dump"], "a") as f:
            f.write(SECOND_DUMP)
        for _ in range(2):  # it grew, then stood still: whole
            host._check_dump(slot)
        sent = []
        while controller.poll(0):
            sent.append(hp.decode(controller.recv_bytes()))
        assert sent == [hp.Data(0, "dump", SECOND_DUMP.encode()), hp.Dumped(0)]
    finally:
        host.selector.close()
        ignores_sigusr1.kill()
        ignores_sigusr1.wait()


def test_every_host_is_told_why_the_session_ends_when_collections_differ() -> None:
    """A host's log says why it ends without running a test (it writes End's reason there)."""
    controller = _launch(job=f"end-reason-{os.getpid()}")
    handlers = {number: signal.getsignal(number) for number in ENDING_SIGNALS}
    world = LaunchedWorld(controller, 5)
    hosts = []  # rank 1's link, proven to rank 0's pytest while it gathers
    hello = hp.encode(hp.Hello(1, 0, 0, "node", ["t::a", "t::b"], [], "/log"))

    def join() -> None:
        hosts.append(connect(dataclasses.replace(controller, rank=1), 5))
        hosts[0].send_bytes(hello)

    joining = threading.Thread(target=join)
    joining.start()
    try:
        difference = world.gather(["t::a"], 5)
        joining.join()
        host = hosts[0]
        world.end(pytest.ExitCode.USAGE_ERROR)  # what rank 0's pytest does once it stopped the session
        assert difference is not None and "1 only on this rank: t::b" in difference
        assert hp.decode(host.recv_frame(time.monotonic() + 5)) == hp.End(pytest.ExitCode.USAGE_ERROR, difference)
    finally:
        for number, handler in handlers.items():  # the world took SIGINT and SIGTERM, its end the launcher's signals
            signal.signal(number, handler)
        for link in hosts:
            link.close()
        for link in world.hosts.values():
            link.connection.close()
