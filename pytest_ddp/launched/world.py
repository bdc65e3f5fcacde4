"""The controller's side of a launched world: the other launched pytest processes (hosts), and their ranks.

Every other rank's pytest proves it holds the session's secret (:mod:`pytest_ddp.launched.link`)
and says what it collected; the collections are compared before any test runs.  Then each host
holds one *slot* per rank of the controller's groups, and its messages
(:mod:`pytest_ddp.launched.protocol`) are routed to the slot's group: whichever group is waiting
reads them, so a warm group's rank that dies while another group runs a test is still seen.
"""

from __future__ import annotations

import selectors
import signal
import socket
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_ddp.common.protocol import Command, ProtocolError, encode
from pytest_ddp.groups.group import LOOPBACK, GroupConfig, GroupStartError, RankGroup
from pytest_ddp.groups.spawn import RankHandle
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.launch import Launch, collection_differences
from pytest_ddp.launched.link import Incoming, Link, LinkError, Listener, listen
from pytest_ddp.launched.signals import exit_on_signal, interrupt_on_signals


def log_line(line: str) -> None:
    """Where a launched pytest says what it dropped, when it is given nowhere else."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class HostLink:
    """One other rank's pytest process, as the controller knows it."""

    connection: Link
    hello: hp.Hello
    alive: bool = True


class LaunchedWorld:
    """Every rank of the launch, seen from global rank 0 (see the module's docstring)."""

    def __init__(self, launch: Launch, timeout: float, log: Callable[[str], None] = log_line) -> None:
        self.launch = launch
        self.log = log  # what was dropped, and why
        self.listener: Listener | None = listen(launch, timeout)
        self.hosts: dict[int, HostLink] = {}
        self.slots: dict[int, RemoteRank] = {}  # by slot: the ranks the hosts hold for this world's groups
        self.groups: weakref.WeakSet[LaunchedGroup] = weakref.WeakSet()
        self._next_slot = 0
        self.problem: str | None = None  # what gather found wrong: the session ends, every host is told why
        # Where groups' stores listen: loopback on one node, else the address every node reached.
        self.store_host = LOOPBACK if launch.one_node else socket.gethostbyname(launch.master_addr or "")
        interrupt_on_signals()  # SIGTERM stops the session as Ctrl-C does

    # -- before the tests ---------------------------------------------------------

    def gather(self, items: list[str], timeout: float) -> str | None:
        """Wait for every other rank's hello; what their collections differ in, or why some never came.
        An unproven connection, or one that sends no hello or a second one, is dropped and logged."""
        assert self.listener is not None
        pending = selectors.DefaultSelector()
        pending.register(self.listener.sock, selectors.EVENT_READ, None)
        deadline = time.monotonic() + timeout
        expected = self.launch.world_size - 1
        try:
            while len(self.hosts) < expected and (left := deadline - time.monotonic()) > 0:
                for key, _ in pending.select(left):
                    if key.data is None:
                        incoming = self.listener.accept()
                        if incoming is not None:
                            pending.register(incoming.link, selectors.EVENT_READ, incoming)
                        continue
                    incoming = key.data
                    try:
                        frame = incoming.first_frame()
                        if frame is not None:
                            self._admit(incoming.link, frame)
                            pending.unregister(incoming.link)
                    except LinkError as exc:
                        self._drop(incoming, pending, str(exc))
        finally:
            for key in list(pending.get_map().values()):
                if key.data is not None:
                    self._drop(key.data, pending, f"no hello within {timeout:g} s")
            pending.close()
            self.listener.close()  # every rank is here, or the session ends: no one else may join
            self.listener = None
        self.problem = self._collection_problem(items, timeout)
        return self.problem

    def _admit(self, link: Link, frame: bytes) -> None:
        """The proven peer's hello: its rank joins; LinkError if it is no hello of a rank still expected."""
        try:
            hello = hp.decode(frame)
        except ProtocolError as exc:
            raise LinkError(str(exc)) from None
        if not isinstance(hello, hp.Hello):
            raise LinkError(f"{hello.KIND!r} where its hello was due")
        if not 0 < hello.rank < self.launch.world_size:
            size = self.launch.world_size
            raise LinkError(f"a hello from rank {hello.rank}, not a rank of this launch of {size}")
        if hello.rank in self.hosts:
            raise LinkError(f"a second hello from rank {hello.rank}")
        self.hosts[hello.rank] = HostLink(link, hello)

    def place(self, rank: int) -> tuple[int, int]:
        """Global rank ``rank``'s (node rank, local rank): rank 0's from its launcher, the others' hellos."""
        if rank == 0:
            return self.launch.node_rank, self.launch.local_rank
        hello = self.hosts[rank].hello
        return hello.node_rank, hello.local_rank

    def _drop(self, incoming: Incoming, pending: selectors.BaseSelector, why: str) -> None:
        pending.unregister(incoming.link)
        incoming.link.close()
        self.log(f"pytest-ddp: dropped a connection to rank 0's pytest: {why}")

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

    def attach(self, remote: RemoteRank) -> int:
        """A new slot on ``remote``'s host for it."""
        self.groups.add(remote.group)
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        self.slots[slot] = remote
        return slot

    def release(self, slot: int) -> None:
        """The slot's rank is gone: what its host still sends of it is dropped."""
        self.slots.pop(slot, None)

    def send(self, rank: int, message: hp.Message) -> None:
        link = self.hosts[rank]
        if not link.alive:
            return
        try:
            link.connection.send_bytes(hp.encode(message))
        except OSError:
            pass  # its end shows when its connection is read

    def receive(self, host: HostLink) -> None:
        """Route every message that has come whole on a host's link to the group of its slot."""
        sender = host.hello.rank
        for frame in host.connection.receive():  # proven: no frame is too long now
            try:
                self._route(sender, hp.decode(frame))
            except ProtocolError as exc:
                self.log(f"pytest-ddp: dropped a message from rank {sender}'s pytest: {exc}")
        if host.connection.closed:
            self._host_gone(host)

    def _route(self, sender: int, message: hp.Message) -> None:
        remote = self.slots.get(getattr(message, "slot", -1))
        if remote is None:
            return
        if remote.rank != sender:
            raise ProtocolError(f"a {message.KIND} message for a slot of rank {remote.rank}")
        if isinstance(message, hp.Data):
            path = remote.group.ranks[remote.rank].files.get(message.file)
            if path is None:
                raise ProtocolError(f"data for a file a rank does not have: {message.file[:80]!r}")
            with open(path, "ab") as f:
                f.write(message.payload)
        elif isinstance(message, hp.Dumped):
            remote.dumped = True
        elif isinstance(message, hp.Exited):
            remote.ended(message.code, message.time)

    def _host_gone(self, host: HostLink) -> None:
        """A host's pytest ended or was killed: its ranks with it."""
        if host.alive:
            host.alive = False
            for group in list(self.groups):
                group.forget(host.connection)
            for remote in list(self.slots.values()):
                if remote.rank == host.hello.rank:
                    remote.ended(-signal.SIGKILL, time.time())
        host.connection.close()

    # -- at the end ------------------------------------------------------------------------

    def logs(self) -> list[str]:
        """Where each other rank's pytest wrote its output."""
        hosts = sorted(self.hosts.items())
        return [f"rank {rank} ({link.hello.node}): {link.hello.log}" for rank, link in hosts]

    def end(self, status: int) -> None:
        """Tell every host the session's exit status (and what gather found wrong); they exit with
        it once this process has: the connections stay open until then, so that a launcher that
        kills all once one exits (MPICH's gforker, torchrun) cannot cut this one's forwarded output.
        """
        exit_on_signal(status)
        for rank, link in self.hosts.items():
            self.send(rank, hp.End(int(status), self.problem or ""))
            link.alive = False
        if self.listener is not None:  # it never gathered (an interrupt, an error in collection)
            self.listener.close()
            self.listener = None


# -- a group of the launched world ----------------------------------------------------
#
# A test of ``world_size=k`` runs on the launch's first k ranks: rank 0 forked here, rank r by
# global rank r's pytest (its *host*, :mod:`pytest_ddp.launched.host`), whose event log, output,
# dumps and end arrive into this group's folder.  To the rest it is a RankGroup.


class RemoteRank(RankHandle):
    """A rank another host forked, in a slot of its own there: what the group does to it goes to its host."""

    def __init__(self, group: LaunchedGroup, rank: int) -> None:
        self.group, self.world, self.rank = group, group.world, rank
        self.slot = self.world.attach(self)
        self.code: int | None = None  # how it ended, told by its host
        self.dumped = False  # its host says the stack dump asked for last is whole

    @property
    def exitcode(self) -> int | None:
        return self.code

    def send(self, command: Command) -> None:
        if self.code is None:
            self.world.send(self.rank, hp.Command(self.slot, encode(command)))

    def request_dump(self) -> None:
        self.dumped = False
        self.world.send(self.rank, hp.Dump(self.slot))

    def dump_complete(self, text: str, before: str | None) -> bool:
        return self.dumped

    def kill(self) -> None:
        self.world.send(self.rank, hp.Kill(self.slot))

    def join(self) -> None:
        """Its host reaps it: what the host still sends of it is dropped."""
        self.world.release(self.slot)

    def ended(self, code: int, when: float) -> None:
        """Its host says it ended (or the host itself did)."""
        self.world.release(self.slot)
        self.code = code
        rp = self.group.ranks[self.rank]
        rp.exit_code, rp.died_at = code, when


class LaunchedGroup(RankGroup):
    """The first ``world_size`` ranks of a launched world (see the module's docstring)."""

    def __init__(self, config: GroupConfig, world: LaunchedWorld) -> None:
        super().__init__(config)
        self.world = world
        self.store_host = world.store_host

    def _start_ranks(self, store_port: int) -> None:
        """Rank 0 forked here; rank r by global rank r's pytest, in a slot of its own there."""
        cfg = self.config
        hosts = [self.world.hosts[rank] for rank in range(1, cfg.world_size)]
        gone = [host.hello.rank for host in hosts if not host.alive]
        if gone:
            raise GroupStartError(f"the pytest processes of ranks {gone} of the launch are gone")
        for host in hosts:
            self._news.register(host.connection, selectors.EVENT_READ, host)
        self.ranks.append(self._spawn(0, store_port))
        for rank in range(1, cfg.world_size):
            remote = RemoteRank(self, rank)
            self.ranks.append(self.rank_process(rank, remote))  # before its host is told: kill() releases it
            env = {**self.torchrun_environment(rank, store_port), **self.rank_environment()}
            self.world.send(rank, hp.Start(remote.slot, self.role(rank, store_port), env, cfg.items))

    # -- what each rank is told -----------------------------------------------------

    def place(self, rank: int) -> tuple[int, int]:
        """The rank's (node, rank on its node), as the launcher placed the process that forks it."""
        return self.world.place(rank)

    # -- what the group does with them ------------------------------------------------

    def _news_of(self, key: selectors.SelectorKey) -> None:
        if isinstance(key.data, HostLink):
            self.world.receive(key.data)
        else:
            super()._news_of(key)

    def forget(self, connection: Any) -> None:
        """A host's connection ended: stop waiting on it."""
        if not self.killed and connection in self._news.get_map():
            self._news.unregister(connection)
