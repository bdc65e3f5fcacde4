"""MPI worlds under attack: an MPI_Abort, forged and malformed hellos on the controller's
socket, Ctrl-C and SIGTERM while an MPI test runs, a /dev/shm too small for the world.

Real launchers, ranks and sockets; the inner sessions' ranks and the attackers meet through files
they wait for, never a sleep."""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import STAND_IN_OF_AN_MPI_RANK, live_pids, wait_for
from pytest_ddp.common import ops
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.watchdog import judge
from pytest_ddp.diagnose.wording import worded
from pytest_ddp.groups import mpi_group
from pytest_ddp.groups.mpi_group import find_launcher, mpi_unavailable

needs_mpi = pytest.mark.skipif(mpi_unavailable(None) is not None, reason=str(mpi_unavailable(None)))

# A rank's view of its world, from /proc: its stand-in, the launcher (the stand-in's parent), and the
# world's folder, where its socket is.
WORLD_OF_A_RANK = STAND_IN_OF_AN_MPI_RANK + """
import socket

def world(rank):
    stand_in = stand_in_of(rank)
    return stand_in, parent_of(stand_in), os.path.dirname(os.path.realpath("/proc/self/fd/1"))

def connect(folder):
    # The world's socket, by way of the folder's descriptor: its path is too long for a socket's.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    sock.connect(f"/proc/self/fd/{fd}/mpi.sock")
    os.close(fd)
    return sock

def shared_memory():
    with open(f"/proc/{os.getpid()}/maps") as maps:
        return sorted({line.split(maxsplit=5)[5].strip() for line in maps if " /dev/shm/" in line})

def note(folder, name, *fields):
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(" ".join(map(str, fields)))
    os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))  # whole, or not there
"""


# -- 1. MPI_Abort -------------------------------------------------------------------------


@needs_mpi
def test_an_mpi_abort_fails_its_rank_named_with_its_code_and_ends_its_world(ddp_pytester, tmp_path: Path) -> None:
    """Measured with bare MPICH 5.0.2 and gforker: rank 1's MPI_Abort(7) returns once it has told the
    launcher, which then kills every process and exits 7; rank 0 never leaves its Barrier.  Under the
    plugin the test passed, and the next test ran on the same world (its launcher's kill came later)."""
    result = ddp_pytester.run(
        WORLD_OF_A_RANK
        + f"""
NOTES = {str(tmp_path)!r}

@pytest.mark.parametrize("code", [7, 0])
@pytest.mark.ddp(world_size=2, backend="mpi", timeout=60)
def test_abort(comm, rank, code):
    stand_in, launcher, _ = world(rank)
    note(NOTES, f"abort{{code}}-{{rank}}", os.getpid(), stand_in, launcher)
    comm.Barrier()  # both noted
    if rank == 1:
        comm.Abort(code)
    comm.Barrier()

@pytest.mark.ddp(world_size=2, backend="mpi", timeout=60)
def test_after(comm, rank):
    stand_in, launcher, _ = world(rank)
    note(NOTES, f"after-{{rank}}", os.getpid(), stand_in, launcher)
    assert comm.allreduce(rank) == 1
"""
    )
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*rank 1 called MPI_Abort (errorcode 7) at test_it.py:*",
            "*rank 1 called MPI_Abort (errorcode 0) at test_it.py:*",
            "ddp: 3 tests on 3 rank groups started*",  # no world ran a test after an abort
        ]
    )
    worlds = {name: [int(x) for x in (tmp_path / f"{name}-{r}").read_text().split()] for name in
              ("abort7", "abort0", "after") for r in (0, 1)}
    launchers = {name: fields[2] for name, fields in worlds.items()}
    assert len(set(launchers.values())) == 3, launchers
    aborted = [pid for name, fields in worlds.items() if name != "after" for pid in fields]
    assert not live_pids(aborted)


def _mpi_call(method: str, index: int, seq: int, site: str, extra: dict[str, object] | None = None) -> Call:
    return Call(index=index, op=ops.MPI_PREFIX + method, group="WORLD", group_ranks=(0, 1), seq=seq,
                site=site, enter=99.0, extra=extra or {})


def _dead(rank: int, call: Call, code: int) -> RankState:
    state = RankState(rank=rank, phase="call")
    state.calls.append(call)
    state.mark_dead(code, 99.5)
    return state


@pytest.mark.parametrize("exit_code", [7, 0, -signal.SIGKILL], ids=["exit-7", "exit-0", "killed"])
def test_a_rank_that_ended_in_mpi_abort_is_the_culprit_and_the_ranks_killed_with_it_are_not(exit_code: int) -> None:
    """However the aborting rank's end is seen (its errorcode as exit status, or killed with the world
    before its stand-in could say so), its abort is the fault; the ranks the launcher killed died of it."""
    aborter = _dead(1, _mpi_call("Abort", 0, 0, "t.py:5", {"errorcode": 7}), exit_code)
    killed = _dead(0, _mpi_call("Barrier", 0, 1, "t.py:6"), -signal.SIGKILL)
    snapshot = Snapshot(now=100.0, started=99.0, timeout=60, grace=2, ranks=[killed, aborter])
    verdict = worded(judge(snapshot), snapshot.ranks)
    assert (verdict.status, verdict.kind, verdict.culprits) == ("done", "rank_exited", [1])
    assert verdict.summary == (
        "rank 1 called MPI_Abort (errorcode 7) at t.py:5; then rank 0 died (killed by SIGKILL) in Barrier #1 (t.py:6)."
    )


# -- 2. the controller's socket -----------------------------------------------------------------

FORGER = """
import json, os, socket, struct, sys
folder = sys.argv[1]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(20)
try:
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    sock.connect(f"/proc/self/fd/{fd}/mpi.sock")
except PermissionError:  # another user
    print("denied")
    sys.exit()
hello = json.dumps({"rank": 0, "stand_in": os.getpid()}).encode()
try:
    sock.sendall(struct.pack("!i", len(hello)) + hello)
    got = sock.recv(4096)
except (BrokenPipeError, ConnectionResetError):  # closed before or after it was sent
    got = b""
except TimeoutError:
    got = b"(nothing: the connection stayed open)"
print("refused" if got == b"" else f"answered {got!r}")
"""

# From inside the world: a process that rank 0's stand-in started (so the launcher's descendant, which
# gets a challenge) once the test runs, each attack on its own connection, which the controller must
# close.  It notes the attacks whose connections were kept open.
ATTACKER = """
import json, os, secrets, socket, struct, sys, time
from pytest_ddp.common.mpi_world import hello as signed
folder, notes = sys.argv[1], sys.argv[2]

def frame(payload):
    return struct.pack("!i", len(payload)) + payload

def read_frame(sock):
    header = sock.recv(4, socket.MSG_WAITALL)
    if len(header) < 4:
        return None
    return sock.recv(struct.unpack("!i", header)[0], socket.MSG_WAITALL)

def attack(sends):
    '''Connect, take the challenge, send what ``sends(challenge)`` makes (and the descriptors it
    names); whether the controller then closed the connection.'''
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    sock.connect(f"/proc/self/fd/{fd}/mpi.sock")
    os.close(fd)
    challenge = read_frame(sock)
    assert challenge, "a process the launcher started gets a challenge"
    data, fds = sends(challenge)
    try:
        socket.send_fds(sock, [data], fds) if fds else sock.sendall(data)
        closed = sock.recv(1) == b""
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    sock.close()
    return closed

while not os.path.exists(os.path.join(notes, "go")):  # rank 0's test says when: every rank said hello
    time.sleep(0.01)
with open(os.path.join(folder, "mpi.key"), "rb") as f:
    secret = f.read()  # a process of the world's user can read it: the other checks must hold
me, stand_in = os.getpid(), os.getppid()
three = [os.dup(0), os.dup(1), os.dup(2)]
attacks = {
    "no MAC": lambda c: (frame(json.dumps({"rank": 0, "stand_in": me}).encode()), []),
    "wrong secret": lambda c: (frame(signed(secrets.token_bytes(32), c, 0, me)), []),
    "a rank that said hello": lambda c: (frame(signed(secret, c, 0, me)), []),
    "a rank out of range": lambda c: (frame(signed(secret, c, 5, me)), []),
    "another's stand-in": lambda c: (frame(signed(secret, c, 0, stand_in)), []),
    "more descriptors than a launcher gives": lambda c: (frame(signed(secret, c, 1, me)), three),
    "not JSON": lambda c: (frame(b"\\xff{not json"), []),
    "a JSON list": lambda c: (frame(b"[0, 1]"), []),
    "wrong fields": lambda c: (frame(json.dumps({"rank": 0}).encode()), []),
    "wrong types": lambda c: (frame(json.dumps({"rank": "0", "stand_in": me, "mac": 1}).encode()), []),
    "huge": lambda c: (struct.pack("!i", 2**30) + b"x" * 1000, []),
    "negative length": lambda c: (struct.pack("!i", -1), []),
    "partial, then stalled": lambda c: (b"\\x00\\x00", []),
}
kept = [what for what, sends in attacks.items() if not attack(sends)]
with open(os.path.join(notes, "attacks.tmp"), "w") as f:
    json.dump(kept, f)
os.rename(os.path.join(notes, "attacks.tmp"), os.path.join(notes, "attacks"))
"""

# The launcher, as --ddp-mpi-launcher: MPICH's gforker, which starts rank 0's stand-in by way of a
# shell that first starts the attacker (the stand-in's child, once the shell has become the stand-in).
LAUNCHER = """#!/bin/sh
n=$2; shift 2
exec {gforker} -n "$n" sh {start} "$@"
"""
START = """#!/bin/sh
eval folder=\\${{$#}}
if [ "$PMI_RANK" = 0 ]; then {python} {attacker} "$folder" {notes} & fi
exec "$@"
"""


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this user that no MPI world started, which no world may stop."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def victim_file() -> Iterator[Path]:
    """A file in /dev/shm that was there before any world, which no world may remove."""
    path = Path("/dev/shm") / f"ddp-victim-{uuid.uuid4().hex}"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    yield path
    path.unlink(missing_ok=True)


# Run as another user where this is root: the forger as "nobody".
AS_ANOTHER_USER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
ANOTHER_USER = os.geteuid() == 0 and shutil.which("setpriv") is not None


def _forge_from_outside(notes: Path) -> None:
    """Once the ranks are up: processes outside the world (this one's children) send a forged hello,
    one of this user, and one of another user where this is root."""
    wait_for(lambda: (notes / "folder").exists(), "the ranks to say where their socket is", limit=120)
    forger = [sys.executable, "-c", FORGER, (notes / "folder").read_text()]
    results = []
    for prefix in ([], AS_ANOTHER_USER) if ANOTHER_USER else ([],):
        done = subprocess.run([*prefix, *forger], capture_output=True, text=True, timeout=60)
        results.append(done.stdout.strip() or done.stderr[-500:])
    (notes / "outside.tmp").write_text("\n".join(results))
    (notes / "outside.tmp").rename(notes / "outside")


def _attacking_launcher(folder: Path, notes: Path) -> str:
    """--ddp-mpi-launcher's value: gforker, with an attacker started by rank 0's stand-in."""
    gforker = find_launcher(None)
    if gforker is None or Path(gforker[0]).name != "mpiexec.gforker":
        pytest.skip("needs MPICH's mpiexec.gforker")
    (folder / "attacker.py").write_text(ATTACKER)
    start = START.format(python=sys.executable, attacker=folder / "attacker.py", notes=notes)
    (folder / "start.sh").write_text(start)
    (folder / "launch.sh").write_text(LAUNCHER.format(gforker=gforker[0], start=folder / "start.sh"))
    return f"sh {folder / 'launch.sh'}"


@needs_mpi
def test_forged_and_malformed_hellos_are_refused_and_the_world_stops_only_its_own(
    ddp_pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    victim: subprocess.Popen[bytes], victim_file: Path,
) -> None:
    """Before: a hello from any local process re-pointed a rank at any pid (the world's stop then
    SIGKILLed it) and took over its command link; a malformed one crashed the controller's loop; a
    file in /dev/shm that a rank's test mapped was removed with the world.  A rank, which runs the
    test's code, is not a process the launcher started: it cannot pose as a stand-in."""
    monkeypatch.setattr(mpi_group, "HELLO_WAIT", 1.0)  # the stalled hello is dropped after this
    notes = tmp_path / "notes"
    notes.mkdir()
    launcher = _attacking_launcher(tmp_path, notes)
    outside = threading.Thread(target=_forge_from_outside, args=(notes,), daemon=True)
    outside.start()
    result = ddp_pytester.run(
        WORLD_OF_A_RANK
        + f"""
import json, mmap, stat
NOTES = {str(notes)!r}
with open({str(victim_file)!r}, "r+b") as f:  # every rank maps it while it collects this module
    MAPPED = mmap.mmap(f.fileno(), mmap.PAGESIZE)

@pytest.mark.ddp(world_size=2, backend="mpi", timeout=120)
def test_attacks(comm, rank):
    _, _, folder = world(rank)
    if rank == 0:
        note(NOTES, "folder", folder)
        while not os.path.exists(os.path.join(NOTES, "outside")):  # the outside forger's turn
            time.sleep(0.01)
        note(NOTES, "go")  # the attacker's turn
        while not os.path.exists(os.path.join(NOTES, "attacks")):
            time.sleep(0.01)
        with open(os.path.join(NOTES, "attacks")) as f:
            assert json.load(f) == [], "connections kept open"
        assert connect(folder).recv(1) == b"", "this rank, not one the launcher started, got a challenge"
    comm.Barrier()
    assert comm.allreduce(rank + 1) == 3  # the world still works

@pytest.mark.ddp(world_size=2, backend="mpi")
def test_the_worlds_files_are_private(comm, rank):
    _, _, folder = world(rank)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    for each in ("mpi.sock", "mpi.key", "mpi.shm", "launcher.out"):
        assert stat.S_IMODE(os.stat(os.path.join(folder, each)).st_mode) == 0o600, each
    assert stat.S_ISSOCK(os.stat(os.path.join(folder, "mpi.sock")).st_mode)
""",
        f"--ddp-mpi-launcher={launcher}",
    )
    outside.join(timeout=60)
    assert (notes / "outside").read_text().splitlines() == ["refused", "denied"][: 1 + ANOTHER_USER]
    result.assert_outcomes(passed=2)
    logged = [r.getMessage() for r in caplog.records if r.name == mpi_group.__name__]
    pytest.LineMatcher(logged).fnmatch_lines(  # in this order, one per attack
        [
            "*refused a connection to its socket: process * is not one that the MPI launcher started",
            "*: process *: its hello does not have a hello's fields",
            "*: process *: its hello is not signed with the world's secret",
            "*: process *: rank 0 has said hello already",
            "*: process *: its hello names rank 5, not one of 2",
            "*: process *: its hello names process * as its stand-in",
            "*: process * handed over more descriptors than a launcher gives",
            "*: process *: its hello is not JSON *",
            "*: process *: its hello does not have a hello's fields",
            "*: process *: its hello does not have a hello's fields",
            "*: process *: its hello's fields are not of a hello's types",
            "*: process * announced a hello of 1073741824 bytes",
            "*: process * announced a hello of -1 bytes",
            "*: process * sent no hello in 1 s",
            "*refused a connection to its socket: process * is not one that the MPI launcher started",
        ]
    )
    assert victim.poll() is None, "the world's stop killed a process that was not its own"
    assert victim_file.exists(), "the world's stop removed a file in /dev/shm it had not made"


# -- 3. signals while an MPI test runs --------------------------------------------------------

HANGING = (
    "import os, time, pytest\n"
    + WORLD_OF_A_RANK
    + """
@pytest.mark.ddp(world_size=2, backend="mpi", timeout=600)
def test_hang(comm, rank):
    stand_in, launcher, folder = world(rank)
    note(os.environ["NOTES"], f"rank{rank}", os.getpid(), stand_in, launcher, folder, *shared_memory())
    if rank == 0:
        comm.Barrier()
    time.sleep(3600)
"""
)


@needs_mpi
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_to_the_session_stops_it_and_leaves_nothing(pytester: pytest.Pytester, how: signal.Signals) -> None:
    """Ctrl-C ends the session as pytest does (status 2); SIGTERM, which pytest does not handle, kills
    it (as it kills a plain pytest).  Before, SIGTERM left the world's shared memory in /dev/shm and its
    folder in basetemp: nobody was left to remove them."""
    pytester.makepyfile(test_hang=HANGING)
    notes = pytester.mkdir("notes")
    private = Path(tempfile.mkdtemp(prefix="ddp-sig-"))  # the session's TMPDIR and basetemp
    try:
        session = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={private / 'bt'}", "test_hang.py"],
            cwd=pytester.path,
            env=dict(os.environ, NOTES=str(notes), TMPDIR=str(private)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
        )
        try:
            wait_for(lambda: all((notes / f"rank{r}").exists() for r in (0, 1)), "both ranks to start", limit=120)
            noted = [(notes / f"rank{r}").read_text().split() for r in (0, 1)]
            pids = sorted({int(pid) for fields in noted for pid in fields[:3]})
            segments = {path for fields in noted for path in fields[4:]}
            assert segments, "MPICH maps its shared memory in /dev/shm"
            session.send_signal(how)
            code = session.wait(timeout=60)
        finally:
            if session.poll() is None:
                session.kill()
                session.wait()
        assert code == (2 if how == signal.SIGINT else -signal.SIGTERM)
        wait_for(lambda: not live_pids(pids), "the world's processes to end", limit=30)
        wait_for(lambda: not any(Path(s).exists() for s in segments), "the world's shared memory to go", limit=30)
        assert [p.relative_to(private) for p in private.rglob("*")] == [Path("bt")]  # pytest's basetemp alone
    finally:
        shutil.rmtree(private)


# -- a small /dev/shm ------------------------------------------------------------------------


def _can_mount_a_small_dev_shm() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm"],
                           capture_output=True)
    return probe.returncode == 0


SMALL_SHM = """
import numpy as np

@pytest.mark.ddp(world_size=2, backend="mpi", timeout=120)
def test_moves_100_mb(comm, rank):
    buf = np.ones(100_000_000, dtype=np.uint8) if rank == 0 else np.zeros(100_000_000, dtype=np.uint8)
    comm.Bcast(buf, root=0)
    assert buf[-1] == 1

@pytest.mark.ddp(world_size=2, backend="mpi", timeout=120)
def test_shares_8_mib(comm, rank):
    from mpi4py import MPI

    size = 8 * 2**20
    window = MPI.Win.Allocate_shared(size if rank == 0 else 0, 1, comm=comm)
    memory = np.ndarray(buffer=window.Shared_query(0)[0], dtype=np.uint8, shape=(size,))
    if rank == 0:
        memory[:] = 1
    comm.Barrier()
    assert memory[-1] == 1
"""


@needs_mpi
@pytest.mark.skipif(not _can_mount_a_small_dev_shm(), reason="needs root and unshare to mount a small /dev/shm")
@pytest.mark.parametrize("size", ["4m", "1m"])
def test_a_dev_shm_too_small_fails_saying_so(pytester: pytest.Pytester, size: str) -> None:
    """Measured: MPICH's shared memory for 2 ranks is 2 MiB (2,118,784 bytes) whatever a test moves,
    and a process touching a page a full tmpfs cannot give is killed by SIGBUS.  With 4 MiB, 100 MB
    broadcast pass and an 8 MiB shared window fails; with 1 MiB, the world cannot start."""
    pytester.makepyfile(test_shm="import os, sys, time\nimport pytest\n" + SMALL_SHM)
    inner = f"{sys.executable} -m pytest -p no:cacheprovider -q test_shm.py"
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {inner}"],
        cwd=pytester.path, capture_output=True, text=True, timeout=300,
    )
    out = done.stdout
    note = f"*SIGBUS; /dev/shm, where MPI keeps the shared memory of one machine's ranks, has * of {size[0]}.0 MiB*"
    if size == "4m":
        assert "1 failed, 1 passed" in out, out
        assert "FAILED test_shm.py::test_shares_8_mib - " in out and "killed by SIGBUS" in out, out
    else:
        assert "2 errors" in out, out
        assert "rank 0 exited while starting (killed by SIGBUS)" in out or "rank 1 exited while starting" in out, out
    pytest.LineMatcher(out.splitlines()).fnmatch_lines([note])
