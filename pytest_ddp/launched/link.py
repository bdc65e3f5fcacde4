"""The link between the launched pytest processes: the controller listens, every other rank's pytest connects.

Where is :func:`pytest_ddp.launched.launch.channel_address`'s answer: a Unix socket in
the abstract namespace on one node; on several, a TCP address on the first
node, whose OS-chosen port torchrun's own store carries to the others.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from pytest_ddp.launched.launch import Launch, LaunchError, channel_address, store_key

RETRY = 0.05  # seconds between attempts to reach a controller not listening yet


def listen(launch: Launch, timeout: float) -> socket.socket:
    """The controller's listening socket (non-blocking), published where the others look."""
    address = channel_address(launch)
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address.encode())
        except OSError as exc:
            sock.close()
            raise LaunchError(f"{launch.describe()}: another pytest of this launch listens already ({exc})") from None
    else:
        sock = socket.create_server(address)
        if address[1] == 0:
            host, port = sock.getsockname()[:2]
            _torchrun_store(launch, timeout).set(store_key(launch), f"{host}:{port}")
    sock.listen(launch.world_size)
    sock.setblocking(False)
    return sock


def connect(launch: Launch, timeout: float) -> Connection:
    """This rank's connection to the controller, which may not listen yet: tried until ``timeout``."""
    address = channel_address(launch)
    deadline = time.monotonic() + timeout
    if not isinstance(address, str) and address[1] == 0:
        host, _, port = _torchrun_store(launch, timeout).get(store_key(launch)).decode().rpartition(":")
        address = (host, int(port))
    while True:
        family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.connect(address.encode() if isinstance(address, str) else address)
            return Connection(sock.detach())
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"rank {launch.rank} ({launch.describe()}) could not reach rank 0's pytest "
                    f"within {timeout:g} s"
                ) from None
            time.sleep(RETRY)  # rank 0's pytest is still starting: nothing to wait on but time


def _torchrun_store(launch: Launch, timeout: float) -> Any:
    """torchrun's own store (its agent's), as a client, as TORCHELASTIC_USE_AGENT_STORE says every worker is."""
    import torch.distributed as dist

    assert launch.master_addr is not None and launch.master_port is not None
    return dist.TCPStore(
        launch.master_addr, launch.master_port, is_master=False, timeout=timedelta(seconds=timeout)
    )
