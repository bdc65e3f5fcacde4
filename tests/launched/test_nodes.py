"""The simulated machines themselves (nodes.py), without pytest-ddp."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from conftest import live_pids, wait_for

from .nodes import TwoNodes, isolated_node_command, namespaces_unavailable

pytestmark = pytest.mark.skipif(namespaces_unavailable() is not None, reason=str(namespaces_unavailable()))

# Node 0's server: listens on its address, tells the port on stdout, answers one client.
SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
connection, peer = server.accept()
connection.sendall(f"hello {peer[0]}".encode())
connection.close()
"""
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as connection:
    print(connection.recv(100).decode())
"""


def namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())


def test_node1_reaches_a_server_on_node0(tmp_path: Path) -> None:
    with TwoNodes() as nodes:
        server = nodes.popen(0, [sys.executable, "-c", SERVER, nodes.address(0)], tmp_path,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        assert port.isdigit(), port
        # By hostname: each node's /etc/hosts names both.
        client = nodes.run(1, [sys.executable, "-c", CLIENT, nodes.hostname(0), port], tmp_path)
        assert (client.returncode, client.stdout) == (0, f"hello {nodes.address(1)}\n"), client.stderr
        assert server.wait(timeout=30) == 0


def test_each_node_has_its_own_tmp_and_hostname_and_shares_the_cwd(tmp_path: Path) -> None:
    probe = f"/tmp/ddp-nodes-probe-{uuid.uuid4().hex}"
    show = f"hostname; test -e {probe} && echo seen || echo unseen; cat shared"
    with TwoNodes() as nodes:
        writer = nodes.run(0, ["sh", "-c", f"echo 0 > {probe} && echo from-node0 > shared && {show}"], tmp_path)
        reader = nodes.run(1, ["sh", "-c", show], tmp_path)
        assert not os.path.exists(probe)
    assert writer.stdout.split() == ["node0", "seen", "from-node0"], writer.stderr
    assert reader.stdout.split() == ["node1", "unseen", "from-node0"], reader.stderr
    assert (tmp_path / "shared").read_text() == "from-node0\n"


def links() -> set[str]:
    """The machine's own network interfaces."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def test_nothing_outlives_the_nodes(tmp_path: Path) -> None:
    before = links()
    with TwoNodes() as nodes:
        names = {nodes.name(0), nodes.name(1)}
        assert names <= namespaces()
        sleeper = nodes.popen(0, ["sleep", "600"], tmp_path)
        # On node 1, one that left its shell (a daemon's way): no Popen of ours holds it.
        orphan = nodes.run(1, ["sh", "-c", "sleep 600 </dev/null >/dev/null 2>&1 & echo $!"], tmp_path)
        # Until the sleeper's setup in node 0 (a short mount, mkdir) has ended too.
        expected = {sleeper.pid, int(orphan.stdout)}
        wait_for(lambda: set(nodes.pids()) == expected, "the two sleepers alone in the nodes", limit=30)
        pids = nodes.pids()
    assert not names & namespaces()
    assert sleeper.returncode == -9
    # A zombie waiting for its parent (here init) counts as gone.
    assert not live_pids(pids), orphan.stdout
    assert links() == before


def test_isolated_node_sees_only_loopback() -> None:
    script = textwrap.dedent("""
        import socket, subprocess
        server = socket.create_server(("0.0.0.0", 0))  # reachable only inside
        print(subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout)
    """)
    out = subprocess.run(isolated_node_command([sys.executable, "-c", script]), capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    interfaces = {line.split()[1] for line in out.stdout.splitlines() if line.strip()}
    addresses = {line.split()[3] for line in out.stdout.splitlines() if line.strip()}
    assert interfaces == {"lo"}
    assert addresses <= {"127.0.0.1/8", "::1/128"}
