"""The backend hook, the one module that uses torch's private names: when it hooks the c10d
operations, and its fallbacks."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pytest_ddp
from pytest_ddp.record import backend_hook, describe


def _never(*args: Any) -> Any:
    raise AssertionError("nothing may be recorded")


def test_a_torch_that_refuses_the_kernels_gets_none_and_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where registering a kernel fails (an older or newer torch), nothing is hooked: install says
    so, and only the torch.distributed functions are recorded."""
    assert backend_hook._functional_library is None  # not installed in this process

    class Refusing:
        def __init__(self, *args: Any) -> None:
            raise RuntimeError("no such dispatch key")

    monkeypatch.setattr(torch.library, "Library", Refusing)
    assert backend_hook.install(_never, _never, _never, lambda: True) is False
    assert backend_hook._functional_library is None
    backend_hook.arm()  # what DDP's constructor does: nothing to arm
    assert not backend_hook.armed()


def test_a_torch_that_refuses_the_c10d_kernels_records_the_functions_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def refusing(*args: Any) -> Any:
        raise RuntimeError("no such operation")

    monkeypatch.setattr(backend_hook, "_collective_kernels", refusing)
    assert backend_hook.install(_never, _never, _never, lambda: True)
    try:
        backend_hook.arm()  # raises nothing into DDP's constructor or a functional collective
        assert not backend_hook.armed()
    finally:
        backend_hook.uninstall()


def test_a_torch_that_does_not_count_its_groups_keeps_torchs_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist.distributed_c10d, "_world", types.SimpleNamespace())
    assert backend_hook.groups_made() is None
    describe.start_test()
    assert describe._name_in_test("7") == "7"


def test_groups_made_during_a_test_are_numbered_from_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist.distributed_c10d, "_world", types.SimpleNamespace(group_count=5))
    describe.start_test()
    assert [describe._name_in_test(n) for n in ("5", "6", "3", "my-desc")] == ["1", "2", "before-3", "my-desc"]


# The c10d operations are hooked (at about 8 us of CPU per collective, recorded or not) only once
# a rank may issue collectives outside the torch.distributed functions, each of which records its
# own call.


def armed_after_plain_calls_then_ddp(rank: int) -> list[bool]:
    armed = [backend_hook.armed()]
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    armed.append(backend_hook.armed())
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    armed.append(backend_hook.armed())
    return armed


def test_plain_calls_leave_the_c10d_operations_unhooked_until_ddp_is_built() -> None:
    result = pytest_ddp.run(armed_after_plain_calls_then_ddp, world_size=2, timeout=60)
    assert result.values == [[False, False, True]] * 2
    # DDP's constructor checks the parameters' shapes and broadcasts the state, in C++: recorded.
    ddp_constructor = ["all_gather", "broadcast", "broadcast"]
    assert [c.op for c in result.ranks[0].collectives] == ["all_reduce", "barrier", *ddp_constructor]


def functional_all_reduce(rank: int) -> list[bool]:
    armed = [backend_hook.armed()]
    funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD).wait()
    return [*armed, backend_hook.armed()]


# Whether this torch's wait_tensor finds work registered by another thread (not in 2.8): only then
# are functional collectives recorded at their own operations.
WAITS_ACROSS_THREADS = backend_hook._waits_across_threads()


def test_a_functional_collective_is_recorded_once_at_its_own_operation() -> None:
    """Hooking nothing more; where waits do not cross threads, at the c10d operation it issues,
    which it hooks (the recorder then has its Work)."""
    result = pytest_ddp.run(functional_all_reduce, world_size=2, timeout=60)
    assert result.values == [[False, not WAITS_ACROSS_THREADS]] * 2
    [call] = result.ranks[0].collectives
    assert (call.op, call.is_async, call.state) == ("all_reduce", True, "ok")
    assert call.extra == {"via": "backend", "op": "SUM"}


def functional_collectives_waited_for_late_or_never(rank: int) -> None:
    funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD)  # never waited for; every rank issued it
    gathered = funcol.all_gather_into_tensor_coalesced([torch.ones(1), torch.ones(2)], dist.group.WORLD)
    for output in gathered:  # one work, waited for through each of its outputs
        output.wait()


def test_a_functional_collective_runs_until_its_first_wait_or_the_tests_end() -> None:
    result = pytest_ddp.run(functional_collectives_waited_for_late_or_never, world_size=2, timeout=60)
    assert (result.outcome, result.unfinished_work) == ("passed", [])
    for rank in result.ranks:
        calls = [(c.op, c.state) for c in rank.collectives]
        assert calls == [("all_reduce", "ok"), ("all_gather_into_tensor_coalesced", "ok")]


def functional_collectives_of_every_kind(rank: int) -> None:
    """Each functional collective in the table but batch_p2p_ops (broadcast names a root), one
    on a subgroup, mixed with a torch.distributed function, and one never waited for."""
    tensor = torch.arange(4.0) + rank
    funcol.all_reduce(tensor, "sum", dist.group.WORLD).wait()
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(tensor, 2, dist.group.WORLD.group_name)
    torch.ops._c10d_functional.wait_tensor(gathered)
    funcol.reduce_scatter_tensor(tensor, "sum", 0, dist.group.WORLD).wait()
    for output in funcol.all_reduce_coalesced([tensor, tensor[:2]], "sum", dist.group.WORLD):
        output.wait()
    funcol.all_to_all_single(tensor, None, None, dist.group.WORLD).wait()
    funcol.broadcast(tensor, 0, dist.group.WORLD).wait()
    pair = dist.new_group([0, 1])
    funcol.all_reduce(tensor, "max", pair).wait()
    dist.all_reduce(tensor)
    funcol.all_reduce(tensor, "sum", dist.group.WORLD)  # never waited for


def test_functional_collectives_of_every_kind_are_recorded_in_one_sequence() -> None:
    """Each in order among the function's calls, on its group, and returned (the last at the
    test's end)."""
    result = pytest_ddp.run(functional_collectives_of_every_kind, world_size=2, timeout=60)
    assert (result.outcome, result.unfinished_work) == ("passed", []), result.report
    calls = [(c.op, c.group, c.seq, c.state) for c in result.ranks[0].collectives]
    pair = calls[7][1]
    assert pair not in ("WORLD", "?")
    assert calls == [
        ("all_reduce", "WORLD", 1, "ok"),
        ("all_gather_into_tensor", "WORLD", 2, "ok"),
        ("reduce_scatter_tensor", "WORLD", 3, "ok"),
        ("all_reduce_coalesced", "WORLD", 4, "ok"),
        ("all_to_all_single", "WORLD", 5, "ok"),
        ("broadcast", "WORLD", 6, "ok"),
        ("new_group", "WORLD", 0, "ok"),  # no collective: no number in the group's sequence
        ("all_reduce", pair, 1, "ok"),
        ("all_reduce", "WORLD", 7, "ok"),
        ("all_reduce", "WORLD", 8, "ok"),
    ]
    functional = [call for call in result.ranks[0].collectives if call.op != "new_group"]
    assert [c.is_async for c in functional] == [True] * 7 + [False, True]
    assert [c.extra.get("via") for c in functional] == ["backend"] * 7 + [None, "backend"]


def armed_by_a_functional_collective_not_in_the_table(rank: int) -> list[bool]:
    """``batch_p2p_ops`` issues several c10d operations: it is recorded at those."""
    armed = [backend_hook.armed()]
    tensor = torch.ones(2)
    op = "isend" if rank == 0 else "irecv"
    for output in torch.ops._c10d_functional.batch_p2p_ops([op], [1 - rank], [0], [tensor], "0"):
        torch.ops._c10d_functional.wait_tensor(output)
    return [*armed, backend_hook.armed()]


def armed_by_a_coalescing_manager(rank: int) -> list[bool]:
    armed = [backend_hook.armed()]
    with dist._coalescing_manager():
        dist.all_reduce(torch.ones(1))
        dist.all_reduce(torch.ones(2))
    return [*armed, backend_hook.armed()]


@pytest.mark.parametrize(
    ("workload", "recorded"),
    [
        pytest.param(
            armed_by_a_functional_collective_not_in_the_table,
            ["send"],
            marks=pytest.mark.skipif(
                "_c10d_functional::batch_p2p_ops" not in torch._C._dispatch_get_all_op_names(),
                reason="this torch has no functional batch_p2p_ops",
            ),
        ),
        # The manager's calls are recorded as made, then the one call it issues on leaving.
        (armed_by_a_coalescing_manager, ["all_reduce", "all_reduce", "all_reduce_coalesced"]),
    ],
)
def test_what_issues_collectives_itself_hooks_the_c10d_operations_first(workload: Any, recorded: list[str]) -> None:
    result = pytest_ddp.run(workload, world_size=2, timeout=60)
    assert result.values == [[False, True]] * 2
    assert [c.op for c in result.ranks[0].collectives] == recorded


def test_a_ddp_model_hooks_the_c10d_operations_for_the_test_that_uses_it(ddp_pytester: Any) -> None:
    """On warm ranks, a test after one that built DDP does not pay for the hook; a model kept by
    a module fixture hooks them again in each test that runs it."""
    result = ddp_pytester.run(
        """
        from torch.nn.parallel import DistributedDataParallel
        from pytest_ddp.record import backend_hook

        @pytest.fixture(scope="module")
        def model():
            return DistributedDataParallel(torch.nn.Linear(2, 2))

        @pytest.mark.ddp(world_size=2)
        def test_builds_ddp(model):
            assert backend_hook.armed()

        @pytest.mark.ddp(world_size=2)
        def test_plain_calls():
            assert not backend_hook.armed()
            dist.all_reduce(torch.ones(1))
            assert not backend_hook.armed()

        @pytest.mark.ddp(world_size=2)
        def test_runs_the_kept_model(model):
            assert not backend_hook.armed()
            model(torch.ones(3, 2)).sum().backward()
            assert backend_hook.armed()
        """
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*ddp: 3 tests on 1 rank group started*"])
