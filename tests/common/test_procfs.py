"""pytest_ddp.common.procfs: /proc's files parsed on hand-made text, and read from live processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from pytest_ddp.common import procfs

# A process named ") (x) R 1 2" by prctl: the name holds what a naive parser takes for fields.
STAT = "4242 () (x) R 1 2) S 17 4242 4200 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100\n"


def test_a_stat_line_whose_name_holds_parentheses_and_spaces() -> None:
    stat = procfs.parse_stat(STAT)
    assert stat == procfs.Stat(name=") (x) R 1 2", state="S", parent=17, group=4242, session=4200, started=987654)


@pytest.mark.parametrize("text", ["", "4242 (name", "4242 name) S 1 2 3", "4242 (name) S 1 2 3\n"])
def test_what_is_not_a_stat_line_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a /proc/PID/stat line"):
        procfs.parse_stat(text)


def test_this_process_as_proc_says() -> None:
    me = procfs.stat(os.getpid())
    assert me is not None
    assert me.parent == os.getppid() and me.group == os.getpgrp() and me.session == os.getsid(0)
    assert procfs.parent_of(os.getpid()) == os.getppid()
    assert procfs.descends_from(os.getpid(), os.getppid())
    assert not procfs.descends_from(os.getppid(), os.getpid())
    assert os.getpid() in set(procfs.pids())


def test_a_process_gone_is_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()  # reaped: its pid names no process
    assert procfs.stat(child.pid) is None and procfs.parent_of(child.pid) is None
    with pytest.raises(OSError):
        procfs.environment_of(child.pid)


def test_a_child_knows_its_start_and_ancestry() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        found = procfs.stat(child.pid)
        me = procfs.stat(os.getpid())
        assert found is not None and me is not None
        assert found.parent == os.getpid() and found.started >= me.started
        assert procfs.descends_from(child.pid, os.getppid())  # its grandparent
    finally:
        child.communicate(b"")


def test_status_and_meminfo_fields() -> None:
    text = "Name:\tpython3\nState:\tS (sleeping)\nUid:\t1001\t1001\t1001\t1001\nVmSize:\t  123456 kB\nbad line\n"
    fields = procfs.parse_fields(text)
    uid = "1001\t1001\t1001\t1001"
    assert fields == {"Name": "python3", "State": "S (sleeping)", "Uid": uid, "VmSize": "123456 kB"}
    assert procfs.size(fields["VmSize"]) == 123456 * 1024
    assert procfs.size("12") == 12
    with pytest.raises(ValueError):
        procfs.size("12 MB")
    mine = procfs.status()
    assert int(mine["Pid"]) == os.getpid() and int(mine["Uid"].split()[0]) == os.getuid()
    assert procfs.size(procfs.meminfo()["MemTotal"]) > 0


def test_an_environment_with_equals_signs_and_bytes_not_utf8() -> None:
    data = b"A=1\0B=x=y\0EMPTY=\0NOEQUALS\0C=\xff\0"
    assert procfs.parse_environ(data) == {"A": "1", "B": "x=y", "EMPTY": "", "C": "\udcff"}
    # Popen returns once the child's exec began, before the kernel has laid out its new
    # environment: the child says it runs (a line on its stdout) before /proc is read.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"DDP_PROCFS": "a=b"},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert procfs.environment_of(child.pid)["DDP_PROCFS"] == "a=b"
    finally:
        child.communicate(b"")


def test_peer_credentials_of_a_unix_socket() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert procfs.peer_credentials(left) == (os.getpid(), os.geteuid())
