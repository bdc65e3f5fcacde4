"""init_process_group gone wrong: duplicate or out-of-range rank, world sizes that disagree,
a rank that never arrives, a slow starter, a file:// init file shared wrongly, each process its
own port.

These tests use init=False: the ranks get torchrun's environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and call init_process_group
themselves, by env://, tcp:// or file://.
"""

import os
import socket
import time

import pytest
import torch.distributed as dist

import pytest_ddp


def init(rank: int, method: str = "env", rank_as: dict | None = None, size_as: dict | None = None,
         delay: dict | None = None, skip: int | None = None, folder: str | None = None,
         shared: bool = False, own_port: bool = False, master_addr: str | None = None) -> int:
    if rank == skip:
        return -1
    if master_addr is not None:
        os.environ["MASTER_ADDR"] = master_addr
    if own_port:  # pytorch#53395: each process finds a free port of its own
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    time.sleep((delay or {}).get(rank, 0))
    given = (rank_as or {}).get(rank, rank)
    size = (size_as or {}).get(rank, int(os.environ["WORLD_SIZE"]))
    if method == "env":
        dist.init_process_group("gloo", rank=given, world_size=size)
    elif method == "tcp":
        address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        dist.init_process_group("gloo", init_method=address, rank=given, world_size=size)
    else:  # file:// in the test's folder: one file for all, or, wrongly, one per process
        path = os.path.join(folder, "init" if shared else f"init-{os.getpid()}")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=given, world_size=size)
    dist.barrier()
    world = dist.get_world_size()
    dist.destroy_process_group()
    return world


@pytest.mark.parametrize("method", ["env", "tcp"])
def test_duplicate_rank(method):
    result = pytest_ddp.run(init, world_size=3, init=False, kwargs={"method": method, "rank_as": {2: 1}}, timeout=30)
    assert result.outcome == "deadlock"
    # Process 2 passed rank 1 too. Both claimants are named when both reached
    # init before the verdict; on a loaded machine process 2's may be seen alone.
    assert result.diagnosis.kind == "init" and 2 in result.diagnosis.culprits
    assert set(result.diagnosis.culprits) <= {1, 2}
    assert "rank 1" in result.diagnosis.text


def test_rank_out_of_range():
    result = pytest_ddp.run(init, world_size=2, init=False, kwargs={"rank_as": {1: 2}}, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "init", [1])
    assert "out of range" in result.diagnosis.text


def test_world_sizes_disagree():
    result = pytest_ddp.run(init, world_size=3, init=False, kwargs={"size_as": {2: 4}}, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "init", [2])


def test_rank_that_never_arrives():
    result = pytest_ddp.run(init, world_size=2, init=False, kwargs={"skip": 1}, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "init", [1])
    assert "without calling init_process_group" in result.diagnosis.text


def test_each_process_on_its_own_port_names_those_not_on_rank_0s():
    # Rank 0 serves the store on its port; the others dial ports nobody listens on.
    result = pytest_ddp.run(init, world_size=3, init=False, kwargs={"own_port": True}, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "init", [1, 2])
    assert "as rank 0, serves the rendezvous's store there" in result.diagnosis.text


def test_an_address_no_host_of_the_group_has_names_every_process_that_dialled_it(foreign_address):
    # pytorch#49084: MASTER_ADDR set alike on every node to an address that is not node 0's:
    # no host of the group has it, no process of the group serves a store there.
    kwargs = {"master_addr": foreign_address}
    result = pytest_ddp.run(init, world_size=2, init=False, kwargs=kwargs, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "init", [0, 1])
    assert foreign_address in result.diagnosis.text and "none of their hosts has" in result.diagnosis.text


@pytest.mark.ddp(world_size=2, init=False)
def test_slow_starter_is_just_waited_for(rank):
    assert init(rank, delay={0: 2}) == 2


def test_file_init_shared_wrongly_hangs_until_the_timeout(tmp_path):
    kwargs = {"method": "file", "folder": str(tmp_path)}
    result = pytest_ddp.run(init, world_size=2, init=False, kwargs=kwargs, timeout=3)
    assert (result.outcome, result.diagnosis.kind) == ("timeout", "timeout")
    assert all(r.collectives[-1].op == "init_process_group" for r in result.ranks)


# -- the fixes, on the warm ranks of init=False tests ----------------------------------


@pytest.mark.ddp(world_size=2, init=False)
@pytest.mark.parametrize("method", ["env", "tcp"])
def test_fixed_init(rank, method):
    assert init(rank, method=method) == 2


@pytest.mark.ddp(world_size=2, init=False)
def test_fixed_file_init_shares_one_file(rank, ddp_shared_path):
    assert init(rank, method="file", folder=str(ddp_shared_path), shared=True) == 2


@pytest.mark.ddp(world_size=2, init=False)
def test_fixed_marked_init_false(rank, world_size):
    dist.init_process_group("gloo")
    assert dist.get_rank() == rank and dist.get_world_size() == world_size
    dist.barrier()  # before a destroy: see tests/test_api.py's own_init
    dist.destroy_process_group()
