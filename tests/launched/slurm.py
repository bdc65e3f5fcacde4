"""A one-node SLURM cluster on loopback, started and stopped by the tests themselves.

Debian's ``slurm-wlm`` and ``munge`` (``make slurm``), run as root: a private munged,
slurmctld and slurmd, each in the foreground as a child of this process, with slurm.conf,
state and logs in a folder of the caller's and the sockets in a short one under /tmp.
slurmctld, slurmd and srun listen on 127.0.0.1 only (``CommunicationParameters=
NoCtldInAddrAny,NoInAddrAny``: they bind the address this machine's hostname resolves to,
127.0.0.1 here), the daemons on ports free at start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from conftest import alive, parent, poll
from pytest_ddp.common import prctl, procfs

DAEMONS = ("munged", "slurmctld", "slurmd")
# What stop() leaves none of: slurmstepd outlives slurmd by design (it runs the tasks).
PROCESS_NAMES = (*DAEMONS, "slurmscriptd", "slurmstepd")
# Every process of a cluster carries TAG=<owner pid>:<owner start time>:<workdir> in its
# environment (daemons, slurmstepd, srun, tasks, batch scripts): what stop() and sweep() kill.
TAG = "DDP_TEST_SLURM_CLUSTER"
# A job in one of these states has not ended yet.
UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"}


def slurm_unavailable() -> str | None:
    """Why a cluster cannot be started here, or None if it can."""
    if os.geteuid() != 0:
        return "a SLURM cluster of the tests' own needs root"
    missing = [name for name in (*DAEMONS, "srun", "sbatch", "sinfo", "squeue", "scancel") if not shutil.which(name)]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing; Debian: make slurm)"
    if not Path("/etc/munge/munge.key").is_file():
        return "munge has no key (/etc/munge/munge.key)"
    return None


def free_port() -> int:
    """A port free on 127.0.0.1 now (the daemon that gets it binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _tag_of(pid: int) -> bytes | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(TAG.encode() + b"="):
            return entry
    return None


def _kill_tagged(match: Callable[[bytes], bool], grace: float) -> None:
    """Wait up to ``grace`` seconds for the slurm processes whose tag matches to exit, then
    SIGKILL every process whose tag matches; raise if any survives that."""
    # A process on its way out no longer shows its environment: remember each one seen, with
    # its start time so that a reused pid is not taken for it.
    seen: set[tuple[int, str]] = set()

    def remaining() -> list[int]:
        for pid in _all_pids():
            tag = _tag_of(pid)
            if tag is not None and match(tag):
                seen.add((pid, _start_time(pid)))
        return [pid for pid, started in seen if alive(pid) and _start_time(pid) == started]

    poll(lambda: not any(_comm(pid) in PROCESS_NAMES for pid in remaining()), grace, interval=0.1)
    for pid in remaining():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not poll(lambda: not remaining(), 10):
        raise RuntimeError(f"processes of a test SLURM cluster survived SIGKILL: {remaining()}")


def sweep() -> None:
    """Kill what clusters of dead owners left (a session killed before its stop(): its daemons
    died with it, but slurmstepd, srun and the tasks of a running step live on)."""
    prefix = TAG.encode() + b"="
    _kill_tagged(lambda entry: _orphaned(entry[len(prefix) :].decode(errors="replace")), grace=0)
    for folder in Path(tempfile.gettempdir()).glob("ddp-slurm-*"):
        tag = _read(folder / "tag")  # none yet: a cluster being made
        if tag and _orphaned(tag):
            shutil.rmtree(folder, ignore_errors=True)


def _orphaned(tag: str) -> bool:
    """Whether the owner a tag names is gone."""
    owner, _, started = tag.partition(":")
    started = started.partition(":")[0]
    return not (owner.isdigit() and alive(int(owner)) and _start_time(int(owner)) == started)


def children(pid: int) -> list[int]:
    return [child for child in _all_pids() if parent(child) == pid]


class SlurmCluster:
    """One node (this machine's hostname, address 127.0.0.1), one partition ``debug``."""

    def __init__(self, workdir: Path, settings: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.conf = workdir / "slurm.conf"
        self.logs = workdir / "log"
        self.state = workdir / "state"
        # The sockets, in a short folder of their own (removed by stop()): slurmstepd's, in the
        # spool folder, must fit in 108 bytes, and munged wants every parent folder of its own
        # searchable by all, which pytest's tmp folders (0700) are not.
        self.run_dir = Path(tempfile.mkdtemp(prefix="ddp-slurm-"))
        self.run_dir.chmod(0o755)
        self.spool = self.run_dir / "spool"
        self.node = socket.gethostname().split(".")[0]
        self.ctld_port = free_port()
        self.slurmd_port = free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        self.settings = dict(settings or {})
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.tag = f"{os.getpid()}:{_start_time(os.getpid())}:{workdir}"
        (self.run_dir / "tag").write_text(self.tag)
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), **{TAG: self.tag})
        for name in list(self.env):
            # An outer job's variables (this suite run under SLURM) would steer srun and sbatch.
            if name.startswith(("SLURM_", "SBATCH_", "SALLOC_", "PMI_")) and name != "SLURM_CONF":
                del self.env[name]

    @classmethod
    def start(cls, workdir: Path, settings: Mapping[str, str] | None = None, limit: float = 60.0) -> SlurmCluster:
        """A cluster up, its node idle; ``settings`` add to or replace slurm.conf's lines.
        Raises RuntimeError with the daemons' logs if the node is not idle within ``limit``."""
        sweep()
        cluster = cls(workdir, settings)
        try:
            cluster._start(limit)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _conf_text(self) -> str:
        w = self.workdir
        lines = {
            "ClusterName": "ddptest",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmctldPort": str(self.ctld_port),
            "SlurmdPort": str(self.slurmd_port),
            # Bind to the address the hostname resolves to (127.0.0.1), not to every address.
            "CommunicationParameters": "NoCtldInAddrAny,NoInAddrAny",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.run_dir / 'sock'}",
            "StateSaveLocation": str(self.state),
            "SlurmdSpoolDir": str(self.spool),
            "SlurmctldPidFile": str(w / "slurmctld.pid"),
            "SlurmdPidFile": str(w / "slurmd.pid"),
            "SlurmctldLogFile": str(self.logs / "slurmctld.log"),
            "SlurmdLogFile": str(self.logs / "slurmd.log"),
            # No init system, no cgroups to delegate: track tasks by /proc, bind nothing.
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "MpiDefault": "none",
            # No accounting daemon; finished jobs go to a text file.
            "JobCompType": "jobcomp/filetxt",
            "JobCompLoc": str(self.logs / "jobcomp.txt"),
            "AccountingStorageType": "accounting_storage/none",
            "JobAcctGatherType": "jobacct_gather/none",
            # The node may declare more CPUs than the machine has.
            "SlurmdParameters": "config_overrides",
            "ReturnToService": "2",
            "SchedulerType": "sched/builtin",
            # Batch jobs start at once, not up to 3 s after submission.
            "SchedulerParameters": "batch_sched_delay=0",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
        }
        lines.update(self.settings)
        text = "".join(f"{key}={value}\n" for key, value in lines.items())
        return text + (
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n"
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        parent = os.getpid()
        with open(self.logs / f"{name}.out", "wb") as out:
            self.daemons[name] = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Should this process die without stop(), its daemons follow it.
                preexec_fn=lambda: prctl.die_with_parent(parent, signal.SIGTERM) or os._exit(1),
            )

    def _start(self, limit: float) -> None:
        for folder in (self.workdir, self.logs, self.spool, self.state):
            folder.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self._conf_text())
        # munged insists on a key owned by the user it runs as: a copy, root's.
        key = self.run_dir / "key"
        shutil.copyfile("/etc/munge/munge.key", key)
        key.chmod(0o400)
        m = self.run_dir
        self._spawn(
            "munged",
            ["munged", "--foreground", f"--socket={m / 'sock'}", f"--key-file={key}", f"--pid-file={m / 'pid'}",
             f"--seed-file={m / 'seed'}", f"--log-file={self.logs / 'munged.log'}"],
        )  # fmt: skip
        if not poll(lambda: (m / "sock").exists() or self.daemons["munged"].poll() is not None, limit):
            raise RuntimeError(f"munged did not start\n{self.logs_text()}")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        ok = poll(self._node_idle, limit, interval=0.2)
        if not ok:
            raise RuntimeError(f"the node never became idle within {limit} s\n{self.logs_text()}")

    def _node_idle(self) -> bool:
        dead = [name for name, p in self.daemons.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited at start\n{self.logs_text()}")
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30)
        return r.stdout.strip() == "idle"

    def logs_text(self) -> str:
        """The daemons' logs, for a failure's message."""
        parts = []
        for path in sorted(self.logs.glob("*")):
            text = _read(path)
            parts.append(f"--- {path.name}\n{text[-4000:]}")
        return "\n".join(parts)

    def srun(
        self, args: list[str], cwd: Path | str, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``srun --overcommit ARGS`` (more tasks than the node's CPUs start at once)."""
        return subprocess.run(
            ["srun", "--overcommit", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,  # else srun hands this process's stdin to task 0
            env=self._env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def sbatch(
        self, script: str, cwd: Path | str, timeout: float = 120, env: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """Submit ``script``, wait for the job's end: its exit code (128 + N if the batch script
        died of signal N) and its output file's text (stdout and stderr together)."""
        cwd = Path(cwd)
        fd, name = tempfile.mkstemp(prefix="sbatch-", suffix=".sh", dir=cwd)
        with os.fdopen(fd, "w") as f:
            f.write(script)
        output = Path(name).with_suffix(".out")
        r = subprocess.run(
            ["sbatch", "--parsable", "--overcommit", f"--output={output}", name],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            env=self._env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed ({r.returncode}): {r.stdout}{r.stderr}")
        job = r.stdout.strip().split(";")[0]
        # Not `sbatch --wait`: it looks at the job 2 s, 10 s, then 42 s after submitting. Four
        # looks a second: each is a process and a request to slurmctld, and a job lasts seconds.
        fields: dict[str, str] = {}

        def ended() -> bool:
            nonlocal fields
            fields = self._job(job)
            return fields.get("JobState", "PENDING") not in UNFINISHED

        if not poll(ended, timeout, interval=0.25):
            subprocess.run(["scancel", job], env=self.env, capture_output=True)  # not left to later tests
            raise TimeoutError(f"batch job {job} still {fields.get('JobState')} after {timeout} s")
        code, sig = (int(n) for n in fields["ExitCode"].split(":"))
        return (128 + sig if sig else code), _read(output)

    def _job(self, job: str) -> dict[str, str]:
        r = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env, capture_output=True, text=True)
        return dict(field.split("=", 1) for field in r.stdout.split() if "=" in field)

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**self.env, **(extra or {})}

    def stop(self, limit: float = 30.0) -> None:
        """Kill every job, process and file of this cluster's (but ``workdir`` and the logs)."""
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=30)
            poll(lambda: not self._jobs(), limit / 3, interval=0.1)
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.daemons.get(name)
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(limit / 3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # slurmstepd outlives slurmd by a few seconds (it reports its step's end): let it go
        # by itself, then kill it and whatever else is left.
        entry = f"{TAG}={self.tag}".encode()
        _kill_tagged(lambda value: value == entry, grace=limit / 3)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.state, ignore_errors=True)

    def processes(self) -> list[int]:
        """The live processes of this cluster's (daemons, slurmstepd, srun, tasks)."""
        entry = f"{TAG}={self.tag}".encode()
        return [pid for pid in _all_pids() if _tag_of(pid) == entry and alive(pid)]

    def _jobs(self) -> list[str]:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True, timeout=30)
        return r.stdout.split()


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _start_time(pid: int) -> str:
    found = procfs.stat(pid)
    return "" if found is None else str(found.started)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
