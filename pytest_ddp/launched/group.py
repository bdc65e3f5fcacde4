"""A rank group of a launched world: its rank 0 forked here, its other ranks by the other ranks' pytest.

A test of ``world_size=k`` runs on the first k ranks of the launch.  Rank 0 is
forked by the controller itself, as on one machine; rank r > 0 is forked by
global rank r's pytest process (its *host*, :mod:`pytest_ddp.launched.host`),
on whatever node that is, and everything the rest of the plugin reads of it
(event log, output, stack dumps, its end) arrives through
:class:`~pytest_ddp.launched.world.LaunchedWorld` into this group's folder.
To the runner, watchdog and report this is a :class:`~pytest_ddp.groups.group.RankGroup`.
"""

from __future__ import annotations

import os
import selectors
from typing import Any

from pytest_ddp.common.protocol import Command, encode
from pytest_ddp.groups.group import GroupConfig, GroupStartError, RankGroup, RankProcess
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.world import LaunchedWorld

HOSTS = "hosts"  # the selector's mark of a host's connection


class RemoteRank:
    """A rank another host forked, in the shape the group uses of a forked rank's Process."""

    pid = None  # a pid on another machine means nothing here

    def __init__(self, world: LaunchedWorld, rank: int, slot: int) -> None:
        self.world, self.rank, self.slot = world, rank, slot
        self.exitcode: int | None = None  # told by its host

    def kill(self) -> None:
        self.world.send(self.rank, hp.Kill(self.slot))

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for here: its host reaps it."""


class LaunchedGroup(RankGroup):
    """The first ``world_size`` ranks of a launched world (see the module's docstring)."""

    def __init__(self, config: GroupConfig, world: LaunchedWorld) -> None:
        super().__init__(config)
        self.world = world
        self.store_host = world.store_host
        self.dumped: set[int] = set()  # ranks whose host says their stack dump is whole
        self.slots: dict[int, int] = {}  # rank -> slot on its host
        launch = world.launch
        nodes = {0: launch.node_rank, **{r: link.hello.node_rank for r, link in world.hosts.items()}}
        self._node_of = {rank: nodes[rank] for rank in range(config.world_size)}

    def start(self, deadline: float) -> None:
        gone = [r for r in range(1, self.config.world_size) if not self.world.hosts[r].alive]
        if gone:
            raise GroupStartError(f"the pytest processes of ranks {gone} of the launch are gone")
        super().start(deadline)

    def _start_ranks(self, store_port: int) -> None:
        """Rank 0 forked here; rank r by global rank r's pytest, in a slot of its own there."""
        cfg = self.config
        assert self._news is not None
        for rank in range(1, cfg.world_size):
            self._news.register(self.world.hosts[rank].connection, selectors.EVENT_READ, HOSTS)
        self.ranks.append(self._spawn(0, store_port))
        self.slots = self.world.attach(self, range(1, cfg.world_size))
        for rank, slot in self.slots.items():
            env = {**self.torchrun_environment(rank, store_port), **self.rank_environment()}
            self.world.send(rank, hp.Start(slot, self.portable_spec(rank, store_port), env, cfg.items))
            self.ranks.append(self.rank_process(rank, RemoteRank(self.world, rank, slot), None, None))

    # -- what each rank is told -----------------------------------------------------

    def _local_rank(self, rank: int) -> int:
        return self.world.launch.local_rank if rank == 0 else self.world.hosts[rank].hello.local_rank

    def portable_spec(self, rank: int, store_port: int | None) -> dict[str, Any]:
        return {**super().portable_spec(rank, store_port), "local_rank": self._local_rank(rank)}

    def torchrun_environment(self, rank: int, port: int) -> dict[str, str]:
        """torchrun's environment for this group's ranks: the launch's nodes and local ranks,
        the first ``world_size`` ranks' share of them."""
        env = super().torchrun_environment(rank, port)
        nodes = list(dict.fromkeys(self._node_of.values()))
        here = self._node_of[rank]
        env.update(
            LOCAL_RANK=str(self._local_rank(rank)),
            LOCAL_WORLD_SIZE=str(sum(1 for node in self._node_of.values() if node == here)),
            GROUP_RANK=str(nodes.index(here)),
            GROUP_WORLD_SIZE=str(len(nodes)),
        )
        return env

    def rank_environment(self) -> dict[str, str]:
        env = super().rank_environment()
        if not self.world.launch.one_node and "GLOO_SOCKET_IFNAME" not in os.environ:
            del env["GLOO_SOCKET_IFNAME"]  # not loopback across nodes: Gloo's own choice, or the user's
        return env

    # -- what the group does with them ------------------------------------------------

    def _send(self, rp: RankProcess, command: Command) -> None:
        if rp.rank == 0:
            super()._send(rp, command)
        elif rp.exit_code is None:
            self.world.send(rp.rank, hp.Command(self.slots[rp.rank], encode(command)))

    def _news_of(self, key: selectors.SelectorKey) -> None:
        if key.data == HOSTS:
            self.world.receive(key.fileobj)  # type: ignore[arg-type]
        else:
            super()._news_of(key)

    def ended(self, rank: int, code: int, when: float) -> None:
        """Its host says rank ``rank`` ended (or the host itself did)."""
        rp = self.ranks[rank] if rank < len(self.ranks) else None
        if rp is None or rp.exit_code is not None:
            return
        rp.exit_code = rp.proc.exitcode = code
        rp.died_at = when

    def forget(self, connection: Any) -> None:
        """A host's connection ended: stop waiting on it."""
        if self._news is not None and connection in self._news.get_map():
            self._news.unregister(connection)

    def dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        self.dumped.clear()
        return super().dump_stacks(ranks)

    def _request_dump(self, rp: RankProcess) -> None:
        if rp.rank == 0:
            super()._request_dump(rp)
        else:
            self.world.send(rp.rank, hp.Dump(self.slots[rp.rank]))

    def _dump_complete(self, rp: RankProcess, text: str, before: str | None) -> bool:
        return super()._dump_complete(rp, text, before) if rp.rank == 0 else rp.rank in self.dumped

    def peak_rss(self, rank: int) -> int | None:
        return super().peak_rss(rank) if rank == 0 else None  # another machine's /proc

    def pids(self) -> list[int]:
        return [rp.proc.pid for rp in self.ranks if rp.rank == 0]

    def kill(self) -> None:
        super().kill()
        for slot in self.slots.values():
            self.world.release(slot)
