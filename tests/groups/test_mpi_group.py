"""MPI groups: ranks of one MPI world started by MPICH's launcher, warm across tests, and gone after."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_processes import LOOPBACK_CHECK

from conftest import (
    STAND_IN_OF_AN_MPI_RANK,
    Controller,
    DdpPytester,
    ModuleShared,
    controllers_started_together,
    failure_section,
    live_pids,
    outcomes,
    stand_ins_under,
    wait_for,
)
from pytest_ddp.groups.mpi_group import find_launcher, mpi_unavailable

pytestmark = pytest.mark.skipif(mpi_unavailable(None) is not None, reason=str(mpi_unavailable(None)))


# The tests below that run with no option of their own share one inner session, in this module
# (its ranks' helpers first, then each test's part, the hang last: it stops the world), and so one
# MPI world: a world's start (launcher, stand-ins, MPI_Init) takes seconds.  Each test reads
# its part: its tests' outcomes (-rA), its failure sections.
TOGETHER_HELPERS = """
def ran_on(name, rank):
    with open(os.path.join(RAN_DIR, f"{name}-{rank}"), "w") as f:
        f.write(str(os.getpid()))

def note(name, rank):
    stand_in = stand_in_of(rank)
    launcher = parent_of(stand_in)
    with open(f"/proc/{os.getpid()}/maps") as maps:
        shm = sorted({l.split(maxsplit=5)[5].strip() for l in maps if " /dev/shm/" in l})
    with open(os.path.join(PID_DIR, f"{name}-{rank}"), "w") as f:
        f.write(" ".join(map(str, [os.getpid(), stand_in, launcher, *shm])))
"""

# Each test notes its ranks' pids (RAN_DIR): the two ran on the same processes, one world.
WARM_WORLD = """
@pytest.mark.ddp(world_size=2, backend="mpi")
def test_world(comm, rank, world_size):
    ran_on("world", rank)
    assert (comm.Get_rank(), comm.Get_size()) == (rank, world_size) == (rank, 2)
    assert parent_of(parent_of(os.getpid())) == CONTROLLER  # forked by its forkserver, as a Gloo rank
    assert comm.allreduce(rank + 1) == 3

@pytest.mark.ddp(world_size=2, backend="mpi")
def test_same_world_again(comm, rank):
    ran_on("again", rank)
    assert comm.bcast(f"from {rank}", root=1) == "from 1"
    assert not dist.is_initialized()  # an MPI world, no torch process group
"""

# MPICH's gforker listens on nothing; Open MPI's launcher listens on every interface
# (measured, 4.1, whatever it is told), as hydra does: only its ranks are checked then.
_LAUNCHER = find_launcher(None)
GFORKER = _LAUNCHER is not None and Path(_LAUNCHER[0]).name == "mpiexec.gforker"
LOOPBACK_ONLY = f"""
@pytest.mark.ddp(world_size=2, backend="mpi")
def test_mpi_listens_on_loopback_only(comm, rank):
    comm.Barrier()
    stand_in = stand_in_of(rank)
    processes = (os.getpid(), stand_in, parent_of(stand_in)) if {GFORKER} else (os.getpid(), stand_in)
    addresses = [a for pid in processes for a in listening_addresses(pid)]
    assert set(addresses) <= LOOPBACK, addresses
"""

FAILS_ON_ONE = """
@pytest.mark.ddp(world_size=2, backend="mpi")
def test_fails_on_one(comm, rank):
    assert rank == 0, "rank 1 disagrees"
"""

COMM_OUTSIDE_MPI = """
@pytest.mark.ddp(world_size=2)
def test_gloo(comm):
    pass
"""

PASS_FAIL_AND_HANG = """
@pytest.mark.ddp(world_size=2, backend="mpi")
def test_passes(comm, rank):
    note("pass", rank)

@pytest.mark.ddp(world_size=2, backend="mpi")
def test_fails(comm, rank):
    note("fail", rank)
    assert rank == 0

@pytest.mark.ddp(world_size=2, backend="mpi", timeout=2)
def test_hangs(comm, rank):
    note("hang", rank)
    if rank == 0:
        comm.Barrier()
    time.sleep(3600)
"""


@dataclass
class Together:
    """The shared session, and what its ranks noted: pids by name (``world-0``), and, taken as
    soon as the session ended, the noted processes and /dev/shm segments of PASS_FAIL_AND_HANG
    still there."""

    result: pytest.RunResult
    ran_on: dict[str, int]
    noted: list[list[str]]
    live: list[int]
    segments: set[str]
    segments_left: list[str]

    def outcomes(self) -> dict[str, str]:
        return outcomes(self.result, "test_it.py")


@pytest.fixture
def together(
    module_shared: ModuleShared, ddp_pytester: DdpPytester, tmp_path_factory: pytest.TempPathFactory
) -> Together:
    """The shared session: run, in this process, by the first test that asks for it."""

    def run() -> Together:
        ran_dir, pid_dir = tmp_path_factory.mktemp("ran_on"), tmp_path_factory.mktemp("pids")
        source = (
            f"RAN_DIR, PID_DIR, CONTROLLER = {str(ran_dir)!r}, {str(pid_dir)!r}, {os.getpid()}\n"
            + LOOPBACK_CHECK
            + STAND_IN_OF_AN_MPI_RANK
            + TOGETHER_HELPERS
            + WARM_WORLD
            + LOOPBACK_ONLY
            + FAILS_ON_ONE
            + COMM_OUTSIDE_MPI
            + PASS_FAIL_AND_HANG
        )
        result = ddp_pytester.run(source, "-rA")
        # As soon as the session ended: every process of every MPI world and its shared memory gone.
        noted = [p.read_text().split() for p in pid_dir.iterdir()]
        live = live_pids(sorted({int(field) for fields in noted for field in fields[:3]}))
        segments = {field for fields in noted for field in fields[3:]}
        left = [s for s in segments if Path(s).exists()]
        ran_on = {p.name: int(p.read_text()) for p in ran_dir.iterdir()}
        return Together(result, ran_on, noted, live, segments, left)

    return module_shared.once("together", run)


def test_the_shared_session_ran_each_test_once(together: Together) -> None:
    together.result.assert_outcomes(passed=5, failed=3, errors=1)
    # Its one Gloo group, and one MPI world for its seven MPI tests: a failure keeps the world.
    together.result.stdout.fnmatch_lines(["ddp: 9 tests on 2 rank groups started*"])


def test_mpi_tests_run_on_one_warm_world(together: Together) -> None:
    assert {name: together.outcomes()[name] for name in ("test_world", "test_same_world_again")} == {
        "test_world": "PASSED",
        "test_same_world_again": "PASSED",
    }
    # Both tests on one rank group: the same two rank processes.
    world = [together.ran_on[f"world-{rank}"] for rank in (0, 1)]
    again = [together.ran_on[f"again-{rank}"] for rank in (0, 1)]
    assert len(set(world)) == 2 and world == again, (world, again)


def test_backend_option_makes_unmarked_backends_mpi(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_world(comm, world_size):
            assert comm.Get_size() == world_size
        """,
        "--ddp-backend=mpi",
    )
    result.assert_outcomes(passed=1)


def test_failure_on_one_rank_is_that_ranks(together: Together) -> None:
    assert together.outcomes()["test_fails_on_one"] == "FAILED"
    failure_section(together.result, "test_fails_on_one").fnmatch_lines(
        ["AssertionError: rank 1 disagrees (rank 1). [[]ddp failed]"]
    )


def test_comm_fixture_outside_mpi_tests_says_why(together: Together) -> None:
    assert together.outcomes()["test_gloo"] == "ERROR"
    failure_section(together.result, "ERROR at setup of test_gloo").fnmatch_lines(
        ["*comm: the MPI world of backend='mpi' tests; this test's backend is not mpi*"]
    )


@pytest.mark.parametrize(
    "launcher, outcome, message",
    [
        (
            "/nowhere/mpiexec -v", {"skipped": 1},
            "*launcher '/nowhere/mpiexec' (--ddp-mpi-launcher) is not found*",
        ),
        ("false", {"errors": 1}, "*the MPI launcher exited (1) before every rank started*"),
    ],
    ids=["missing: skipped", "fails: an error"],
)
def test_a_launcher_that_cannot_start_the_world_says_so(ddp_pytester, launcher, outcome, message) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2, backend="mpi")
        def test_world(comm):
            pass
        """,
        f"--ddp-mpi-launcher={launcher}",
        "-rs",
    )
    result.assert_outcomes(**outcome)
    result.stdout.fnmatch_lines([message])


def test_mpi_ranks_and_launcher_listen_on_loopback_only(together: Together) -> None:
    # The Gloo check of LOOPBACK_CHECK, and this one.
    assert {
        name: together.outcomes()[name]
        for name in ("test_nothing_listens_beyond_loopback", "test_mpi_listens_on_loopback_only")
    } == {
        "test_nothing_listens_beyond_loopback": "PASSED",
        "test_mpi_listens_on_loopback_only": "PASSED",
    }


# -- nothing left behind ----------------------------------------------------------

HANGING_MPI_TEST = """
import os, time, pytest

@pytest.mark.ddp(world_size=2, backend="mpi", timeout=600)
def test_hang(comm, rank):
    with open(os.path.join(os.environ["PID_DIR"], f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if rank == 0:
        comm.Barrier()
    time.sleep(3600)
"""


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _shared_memory(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps if " /dev/shm/" in line}


MPI_SIGNALS = [signal.SIGKILL, signal.SIGINT]


@pytest.fixture(scope="module")
def mpi_controllers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Controller]]:
    """The controllers of the test below, one per signal, started together."""
    sources = {how.name: HANGING_MPI_TEST for how in MPI_SIGNALS}
    with controllers_started_together(tmp_path_factory.mktemp("controllers"), sources) as started:
        yield started
        # One that no test ended (deselected) is killed: its world's shared memory goes here.
        unended = [c for c in started.values() if c.process.poll() is None]
        segments = {s for c in unended for pid in live_pids(c.rank_pids()) for s in _shared_memory(pid)}
    for segment in segments:
        Path(segment).unlink(missing_ok=True)


@pytest.mark.parametrize("how", MPI_SIGNALS, ids=lambda s: s.name)
def test_no_mpi_process_outlives_its_controller(
    mpi_controllers: dict[str, Controller], how: signal.Signals
) -> None:
    """Ranks, their stand-ins and the launcher all go with the controller, however it ends;
    after Ctrl-C the world's shared memory goes too."""
    controller = mpi_controllers[how.name]
    ranks = controller.rank_pids()
    stand_ins = stand_ins_under(controller.process.pid)
    assert len(stand_ins) == len(ranks)
    launcher = _parent(stand_ins[0])
    segments = set().union(*(_shared_memory(pid) for pid in ranks))
    assert segments, "MPICH maps its shared memory in /dev/shm"
    try:
        controller.process.send_signal(how)
        controller.process.wait(timeout=60)
        everything = [*ranks, *stand_ins, launcher]
        wait_for(lambda: not live_pids(everything), "the MPI processes to die", limit=10)
        if how == signal.SIGINT:
            assert not [s for s in segments if Path(s).exists()]
    finally:
        # A controller killed with SIGKILL could not remove its world's shared memory: the test that
        # started it does.
        for segment in segments:
            Path(segment).unlink(missing_ok=True)


def _allreduce_of_ranks(rank: int) -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.allreduce(rank)


def test_run_calls_a_function_on_an_mpi_world() -> None:
    from pytest_ddp import run

    result = run(_allreduce_of_ranks, world_size=3, backend="mpi")
    assert result.outcome == "passed", result.diagnosis
    assert result.values == [3, 3, 3]


def test_nothing_left_after_pass_fail_and_hang(together: Together) -> None:
    """Every process of every MPI world (ranks, stand-ins, launcher) and its shared memory
    are gone when the session ends: after a pass, a failure and a hang."""
    assert {name: together.outcomes()[name] for name in ("test_passes", "test_fails", "test_hangs")} == {
        "test_passes": "PASSED",
        "test_fails": "FAILED",
        "test_hangs": "FAILED",
    }
    assert len(together.noted) == 6
    assert not together.live
    assert together.segments and not together.segments_left


def _can_make_network_namespaces() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


HYDRA = Path(sys.executable).parent / "mpiexec"  # MPICH's, from PyPI's mpich
# In a mount namespace, /tmp as an overlay: all that is there stays in sight (a test's folder, maybe
# this Python), and what is written there goes to the upper layer, where what is new in /tmp shows.
OVERLAY_TMP = (
    "mount -t tmpfs tmpfs /mnt && mkdir /mnt/lower /mnt/upper /mnt/work && mount --bind /tmp /mnt/lower"
    " && mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/upper,workdir=/mnt/work /tmp"
)


def _can_overlay_tmp() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not Path("/mnt").is_dir():
        return False
    done = subprocess.run(["unshare", "--mount", "sh", "-c", OVERLAY_TMP], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(
    not _can_make_network_namespaces(), reason="needs root, unshare and ip for a network namespace"
)
@pytest.mark.skipif(not _can_overlay_tmp(), reason="cannot mount an overlay of /tmp on layers in /mnt")
@pytest.mark.skipif(not HYDRA.exists(), reason="no MPICH mpiexec (hydra) beside this Python")
def test_hydra_launcher_in_a_network_namespace_of_its_own(pytester: pytest.Pytester) -> None:
    """MPICH's hydra (`mpiexec`) listens on every interface, so it runs here in a network
    namespace whose only interface is loopback.  A rank killed mid-test is named, the world is
    replaced for the next test, and nothing of hydra's is left: no process, and no file in /tmp,
    where hydra writes one for each world (seen in an overlay of /tmp in a mount namespace)."""
    pytester.makepyfile(
        """
        import os, signal, pytest

        @pytest.mark.ddp(world_size=2, backend="mpi", timeout=30)
        def test_rank_killed(comm, rank):
            comm.Barrier()
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            comm.Barrier()

        @pytest.mark.ddp(world_size=2, backend="mpi")
        def test_after(comm):
            assert comm.allreduce(1) == 2
        """
    )
    inner = f"{sys.executable} -m pytest -p no:cacheprovider -q --ddp-mpi-launcher={HYDRA}"
    new = 'echo new in /tmp: $(ls -A /mnt/upper | while read f; do [ -e "/mnt/lower/$f" ] || echo "$f"; done)'
    script = (
        f'{OVERLAY_TMP} && cd "$PWD" && ip link set lo up'
        f" && echo namespace $(readlink /proc/self/ns/net) && {inner}; {new}"
    )
    result = pytester.run("unshare", "--net", "--mount", "sh", "-c", script, timeout=120)
    result.stdout.fnmatch_lines(["*rank 1 died (killed by SIGKILL)*", "*1 failed, 1 passed*"])
    new = [line for line in result.outlines if line.startswith("new in /tmp:")]
    assert new == ["new in /tmp:"], result.outlines
    namespace = next(line.split()[1] for line in result.outlines if line.startswith("namespace "))
    wait_for(lambda: not _processes_in(namespace), "every process of the namespace to end", limit=10)


def _processes_in(namespace: str) -> list[int]:
    """The live processes in that network namespace (``net:[inode]``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "net") == namespace:
                found.append(int(entry.name))
        except OSError:
            continue
    return live_pids(found)


@pytest.mark.parametrize(
    "version, root, options",
    [
        # Measured: Debian's Open MPI 4.1.4 (mpirun) and 4.1.6 (mpiexec, on a GPU machine).
        (
            "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
            False,
            ["--oversubscribe"],
        ),
        ("mpiexec (OpenRTE) 4.1.6\n", True, ["--oversubscribe", "--allow-run-as-root"]),
        ("HYDRA build details:\n    Version:                                 5.0.2\n", True, []),
        ("", True, []),
    ],
)
def test_open_mpis_launcher_gets_the_options_a_tests_world_needs(
    version: str, root: bool, options: list[str]
) -> None:
    from pytest_ddp.groups.mpi_group import open_mpi_options

    assert open_mpi_options(version, root) == options
