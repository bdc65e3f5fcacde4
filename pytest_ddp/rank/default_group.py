"""A rank's default process group: joined at the rank's start (``init=True``), whose it is at a
test's end, and joined afresh for a test after one that ended it or made one.

Warm ranks cannot meet again at the last rendezvous's store: its keys are still there, and Gloo
connects to the old group's addresses.  So the next test gets a fresh store
(:class:`pytest_ddp.groups.spawn.GroupStore`), where every rank :func:`renew`s.
"""

from __future__ import annotations

import os
import weakref
from datetime import timedelta
from typing import Any

from pytest_ddp.common.protocol import RankRole

_role: RankRole | None = None  # this rank's, which says how to join: kept from its start
_joined: weakref.ref[Any] | None = None  # the default group this rank joined last (init=True)
# init=False: the default groups that are not the current test's own.
_not_the_tests: list[weakref.ref[Any]] = []
_left_own = False  # the last test left a default group of its own
_store_port = 0  # of the rank group's store now: the first, or the one handed over last
_client: tuple[int, Any] | None = None  # (port, client) of store()


def start(role: RankRole) -> None:
    """At the rank's start: keep what joining again needs, and join (``init=True`` groups)."""
    global _role, _store_port
    assert role.store_port is not None  # a group of torch.distributed ranks has a store
    _role, _store_port = role, role.store_port
    if role.init:
        _join()


def _kept() -> RankRole:
    assert _role is not None, "the rank has not started"
    return _role


def _join() -> None:
    import torch
    import torch.distributed as dist

    role = _kept()
    kwargs: dict[str, Any] = {}
    if role.backend == "nccl":
        torch.cuda.set_device(role.local_rank)
        kwargs["device_id"] = torch.device("cuda", role.local_rank)
    timeout = timedelta(seconds=role.pg_timeout)
    dist.init_process_group(
        role.backend, store=store(), rank=role.rank, world_size=role.world_size, timeout=timeout, **kwargs
    )
    global _joined
    _joined = weakref.ref(dist.distributed_c10d._get_default_group())


def _current() -> Any:
    """The default group, or None (also in a rank with no torch.distributed group at all)."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group() if dist.is_initialized() else None


def test_starts() -> None:
    """A test starts: the default group now, if any, is not its own."""
    current = _current()
    _not_the_tests[:] = [] if current is None else [weakref.ref(current)]


def outlives_test() -> None:
    """The default group now, if any, belongs to a scope wider than the test's (a wider fixture's, an
    adopted class's)."""
    current = _current()
    if current is not None:
        _not_the_tests.append(weakref.ref(current))


def test_ended() -> tuple[bool, bool]:
    """(intact, alive) as :class:`~pytest_ddp.common.protocol.Done` reports them."""
    global _left_own
    current = _current()
    if _role is not None and _role.init:
        joined = None if _joined is None else _joined()
        return joined is not None and joined is current, current is not None
    _left_own = current is not None and all(ref() is not current for ref in _not_the_tests)
    return not _left_own, current is not None


def store() -> Any:
    """A client of the rank group's current store (for its default group, a harness's exchanges)."""
    global _client
    if _client is None or _client[0] != _store_port:
        import torch.distributed as dist

        role = _kept()
        timeout = timedelta(seconds=role.pg_timeout)
        client = dist.TCPStore(
            role.store_host, _store_port, role.world_size, is_master=False, timeout=timeout
        )
        _client = (_store_port, client)
    return _client[1]


def renew(store_port: int) -> None:
    """Point ``MASTER_PORT`` (a test's own ``env://`` rendezvous) at the fresh store; an
    ``init=True`` rank drops what is left of its default group and joins a fresh one there (names,
    keys and sequence numbers start afresh), an ``init=False`` rank ends the last test's own, as
    its process would have at exit.  Unrecorded: no test's calls."""
    global _store_port
    _store_port = store_port
    os.environ["MASTER_PORT"] = str(store_port)
    import torch.distributed as dist

    from pytest_ddp.record.recorder import unrecorded

    with unrecorded():
        init = _role is not None and _role.init
        if dist.is_initialized() and (init or _left_own):
            dist.destroy_process_group()
        if init:
            _join()
