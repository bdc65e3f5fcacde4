"""The controller's side of a launched world: the other launched pytest processes (hosts), and their ranks.

Global rank 0's pytest listens (:mod:`pytest_ddp.launched.link`) for every other
rank's pytest, each of which says hello with what it collected; the
collections are compared before any test runs.  From then on each host holds
the rank processes of the groups the controller forms (:mod:`pytest_ddp.launched.group`),
one *slot* each, and its messages (:mod:`pytest_ddp.launched.protocol`) are routed
here to the group that owns the slot: whatever group is waiting reads them, so
a warm group's rank that dies while another group runs a test is still seen.
At the end every host is told the session's exit status, to exit with.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from pytest_ddp.groups.group import rank_files
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.launch import Launch, collection_differences
from pytest_ddp.launched.link import listen

if TYPE_CHECKING:
    from pytest_ddp.launched.group import LaunchedGroup


# What launchers send the processes of a run they end (torchrun SIGTERM, gforker SIGQUIT).
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGHUP)


def exit_on_signal(status: int) -> None:
    """From now on, a launcher's signal ends this process at once with ``status`` (its work is done)."""
    for number in ENDING_SIGNALS:
        signal.signal(number, lambda *_: os._exit(int(status)))


@dataclass
class HostLink:
    """One other rank's pytest process, as the controller knows it."""

    connection: Connection
    hello: hp.Hello
    alive: bool = True


class LaunchedWorld:
    """Every rank of the launch, seen from global rank 0 (see the module's docstring)."""

    def __init__(self, launch: Launch, timeout: float) -> None:
        self.launch = launch
        self.listener: socket.socket | None = listen(launch, timeout)
        self.hosts: dict[int, HostLink] = {}
        self.slots: dict[int, tuple[LaunchedGroup, int]] = {}  # slot -> (its group, its rank there)
        self.groups: weakref.WeakSet[LaunchedGroup] = weakref.WeakSet()
        self._next_slot = 0
        self.problem: str | None = None  # what gather found wrong: the session ends, every host is told why
        # Where groups' stores listen: loopback on one node, else the address every node reached.
        self.store_host = "127.0.0.1" if launch.one_node else socket.gethostbyname(launch.master_addr or "")

    # -- before the tests ---------------------------------------------------------

    def gather(self, items: list[str], timeout: float) -> str | None:
        """Wait for every other rank's hello; what their collections differ in, or why some never came."""
        assert self.listener is not None
        pending = selectors.DefaultSelector()
        pending.register(self.listener, selectors.EVENT_READ, None)
        deadline = time.monotonic() + timeout
        expected = self.launch.world_size - 1
        try:
            while len(self.hosts) < expected and (left := deadline - time.monotonic()) > 0:
                for key, _ in pending.select(left):
                    if key.data is None:
                        try:
                            sock, _ = self.listener.accept()
                        except BlockingIOError:
                            continue
                        sock.setblocking(True)
                        pending.register(Connection(sock.detach()), selectors.EVENT_READ, "new")
                        continue
                    connection: Connection = key.fileobj  # type: ignore[assignment]
                    pending.unregister(connection)
                    try:
                        hello = hp.decode(connection.recv_bytes())
                    except (EOFError, OSError):
                        connection.close()
                        continue
                    assert isinstance(hello, hp.Hello)
                    self.hosts[hello.rank] = HostLink(connection, hello)
        finally:
            pending.close()
        self.problem = self._collection_problem(items, timeout)
        return self.problem

    def _collection_problem(self, items: list[str], timeout: float) -> str | None:
        """Ranks that never said what they collected, or how the collections differ; None if alike."""
        missing = sorted(set(range(1, self.launch.world_size)) - set(self.hosts))
        if missing:
            return f"ranks {missing} of the launch did not report what they collected within {timeout:g} s"
        collected = {0: items, **{rank: link.hello.items for rank, link in self.hosts.items()}}
        nodes = {0: socket.gethostname(), **{rank: link.hello.node for rank, link in self.hosts.items()}}
        errors = [error for link in self.hosts.values() for error in link.hello.errors]
        difference = collection_differences(collected, nodes)
        if difference and errors:
            difference += "\ntheir collection errors:\n" + "\n".join(dict.fromkeys(errors))
        return difference

    # -- while the tests run ------------------------------------------------------------

    def attach(self, group: LaunchedGroup, ranks: range) -> dict[int, int]:
        """Slots on the hosts of ``ranks`` for ``group``: {rank: slot}."""
        self.groups.add(group)
        slots = {}
        for rank in ranks:
            slots[rank] = self._next_slot
            self.slots[self._next_slot] = (group, rank)
            self._next_slot += 1
        return slots

    def release(self, slot: int) -> None:
        """The slot's group is gone: what its host still sends of it is dropped."""
        self.slots.pop(slot, None)

    def send(self, rank: int, message: hp.Message) -> None:
        link = self.hosts[rank]
        if not link.alive:
            return
        try:
            link.connection.send_bytes(hp.encode(message))
        except OSError:
            pass  # its end shows when its connection is read

    def receive(self, connection: Connection) -> None:
        """Route every message waiting on a host's connection to the group of its slot."""
        try:
            while True:
                message = hp.decode(connection.recv_bytes())
                self._route(message)
                if not connection.poll(0):
                    return
        except (EOFError, OSError):
            self._host_gone(connection)

    def _route(self, message: hp.Message) -> None:
        owner = self.slots.get(getattr(message, "slot", -1))
        if owner is None:
            return
        group, rank = owner
        if isinstance(message, hp.Data):
            with open(rank_files(group.workdir, rank)[message.file], "ab") as f:
                f.write(message.payload)
        elif isinstance(message, hp.Dumped):
            group.dumped.add(rank)
        elif isinstance(message, hp.Exited):
            group.ended(rank, message.code, message.time)
            self.release(message.slot)

    def _host_gone(self, connection: Connection) -> None:
        """A host's pytest ended or was killed: its ranks with it."""
        for rank, link in self.hosts.items():
            if link.connection is connection and link.alive:
                link.alive = False
                for group in list(self.groups):
                    group.forget(connection)
                for slot, (group, slot_rank) in list(self.slots.items()):
                    if slot_rank == rank:
                        group.ended(rank, -signal.SIGKILL, time.time())
                        self.release(slot)
        connection.close()

    # -- at the end ------------------------------------------------------------------------

    def logs(self) -> list[str]:
        """Where each other rank's pytest wrote its output."""
        return [f"rank {rank} ({link.hello.node}): {link.hello.log}" for rank, link in sorted(self.hosts.items())]

    def end(self, status: int) -> None:
        """Tell every host the session's exit status (and what gather found wrong, for its log);
        they exit with it once this process has.

        The connections stay open until this process exits: a host waits for that, so
        that a launcher which kills every process once one fails (MPICH's gforker, torchrun)
        does not kill this one while the output it forwards is still in its pipe.  This
        process then exits with that status even if such a launcher sends it a signal first.
        """
        exit_on_signal(status)
        for rank, link in self.hosts.items():
            self.send(rank, hp.End(int(status), self.problem or ""))
            link.alive = False
        if self.listener is not None:
            self.listener.close()
            self.listener = None
