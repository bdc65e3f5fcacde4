"""What one test changes in a warm rank does not reach the next: each pair's first test changes
a piece of a rank's state and leaves it so, its second checks it sees the rank as it was; the same
tests in reversed order (each check before its change) pass as well, on the same ranks.

Real ranks, one inner session for every pair (its modules in file order, then reversed).  The
list, and what is done about each, is docs/design.md's "What a test leaves in a warm rank".
"""

from __future__ import annotations

import textwrap

from conftest import HEADER, Session, outcomes, session_in_process

# (name, the change a test makes and leaves, the check the next test makes)
PAIRS = [
    (
        "dtype_and_modes",
        """
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.autograd.set_detect_anomaly(True)
        """,
        """
        assert torch.get_default_dtype() == torch.float32
        assert torch.is_grad_enabled() and not torch.is_anomaly_enabled()
        """,
    ),
    (
        "deterministic",
        """
        torch.use_deterministic_algorithms(True, warn_only=True)
        """,
        """
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        """,
    ),
    (
        "backend_flags",
        """
        torch.backends.cudnn.enabled = False
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = True
        torch.backends.mkldnn.enabled = False
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_float32_matmul_precision("medium")
        """,
        """
        assert torch.backends.cudnn.enabled and not torch.backends.cudnn.benchmark
        assert not torch.backends.cudnn.deterministic and torch.backends.mkldnn.enabled
        assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
        """,
    ),
    (
        "seeds",
        """
        import random, numpy
        torch.manual_seed(1234)
        random.seed(1234)
        numpy.random.seed(1234)
        """,
        """
        import random, numpy
        assert torch.rand(3).tolist() != torch.rand(3, generator=torch.Generator().manual_seed(1234)).tolist()
        assert random.random() != random.Random(1234).random()
        assert numpy.random.random() != numpy.random.RandomState(1234).random()
        """,
    ),
    (
        "threads",
        """
        torch.set_num_threads(13)
        """,
        """
        assert torch.get_num_threads() != 13
        """,
    ),
    (
        "environment",
        """
        os.environ["DDP_LEFT"] = "1"
        del os.environ["HOME"]
        """,
        """
        assert "DDP_LEFT" not in os.environ and "HOME" in os.environ
        """,
    ),
    (
        "cwd",
        """
        os.chdir("/")
        """,
        """
        assert os.getcwd() == os.path.dirname(__file__)
        """,
    ),
    (
        "sys_path",
        """
        sys.path.insert(0, "/nowhere-left")
        """,
        """
        assert "/nowhere-left" not in sys.path
        """,
    ),
    (
        "sys_modules",
        """
        # A module a test writes and imports, as a plugin's or a code generator's test does.
        folder = tmp_path_factory.mktemp("mod")
        (folder / "ddp_left_module.py").write_text("VALUE = 1\\n")
        sys.path.insert(0, str(folder))
        import ddp_left_module
        assert ddp_left_module.VALUE == 1
        """,
        """
        assert "ddp_left_module" not in sys.modules
        """,
    ),
    (
        "logging",
        """
        import logging
        logging.basicConfig(level=logging.DEBUG)
        logging.getLogger("torch.distributed.distributed_c10d").setLevel(logging.DEBUG)
        logging.getLogger("torch.distributed.distributed_c10d").addHandler(logging.NullHandler())
        logging.disable(logging.WARNING)
        """,
        """
        import logging
        assert not any(type(h) is logging.StreamHandler for h in logging.getLogger().handlers)
        assert logging.getLogger().level == logging.WARNING
        c10d = logging.getLogger("torch.distributed.distributed_c10d")
        assert c10d.level != logging.DEBUG and not any(type(h) is logging.NullHandler for h in c10d.handlers)
        assert logging.root.manager.disable == logging.NOTSET
        """,
    ),
    (
        "distributed_functions",
        """
        import torch.distributed.distributed_c10d as c10d
        dist.all_reduce = lambda tensor, *args, **kwargs: None
        c10d.broadcast = lambda tensor, *args, **kwargs: None
        dist.ddp_left_function = print
        """,
        """
        import torch.distributed.distributed_c10d as c10d
        t = torch.full((1,), float(rank))
        dist.all_reduce(t)
        assert t.item() == 1.0
        c10d.broadcast(t, src=0)
        assert not hasattr(dist, "ddp_left_function")
        """,
    ),
    (
        "monkeypatched_and_undone",
        """
        # Changed on purpose and put back by the test itself: nothing to do, nothing penalised.
        monkeypatch.setattr(dist, "all_reduce", lambda tensor, *args, **kwargs: None)
        monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float16)
        """,
        """
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2.0 and torch.get_default_dtype() == torch.float32
        """,
    ),
    (
        "backend",
        """
        dist.Backend.register_backend("ddpleft", lambda *args: None, devices=["cpu"])
        """,
        """
        assert "ddpleft" not in dist.Backend.backend_list and not hasattr(dist.Backend, "DDPLEFT")
        dist.Backend.register_backend("ddpleft", lambda *args: None, devices=["cpu"])  # as if first
        """,
    ),
    (
        # Kept, as in one pytest process: libraries cache their subgroups across tests (DeepSpeed's
        # groups; renewing the default group made tests/libraries/test_deepspeed.py fail).
        "subgroups",
        """
        LEFT["subgroup"] = dist.new_group([0, 1])
        """,
        """
        if "subgroup" in LEFT:  # made, and its group not renewed since
            t = torch.ones(1)
            dist.all_reduce(t, group=LEFT["subgroup"])
            assert t.item() == 2.0
        """,
    ),
    (
        # Kept too, for the same reason (a renewed store renews the default group); a test that
        # ends or replaces the default group gets a fresh store.
        "store_keys",
        """
        from torch.distributed.distributed_c10d import _get_default_store
        _get_default_store().set(f"ddp-left-{rank}", "x")
        LEFT["key"] = True
        """,
        """
        from torch.distributed.distributed_c10d import _get_default_store
        assert _get_default_store().check([f"ddp-left-{rank}"]) == LEFT.get("key", False)
        """,
    ),
    (
        "default_group_destroyed",
        """
        LEFT.clear()  # the subgroup and the key go with the group
        dist.destroy_process_group()
        """,
        """
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2.0
        """,
    ),
]

# Each test writes down its rank's process: the ranks are kept (or replaced) as the docs say.
PIDS = """
from conftest import LEFT

pytestmark = pytest.mark.ddp(world_size=2)


def same_rank(name, rank):
    with open(os.path.join(os.path.dirname(__file__), "pids"), "a") as f:
        f.write(f"{__name__} {name} {rank} {os.getpid()}\\n")
"""


def _test(name: str, body: str) -> str:
    source = f"def test_{name}(rank, monkeypatch, tmp_path_factory):\n    same_rank({name!r}, rank)\n"
    return source + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"


def _module(checks_first: bool) -> str:
    tests = []
    for index, (name, change, check) in enumerate(PAIRS):
        pair = [_test(f"{index:02}_{name}_change", change), _test(f"{index:02}_{name}_check", check)]
        tests += pair[::-1] if checks_first else pair
    return HEADER + PIDS + "\n\n" + "\n\n".join(tests)


# A module fixture's changes are its module's, until it is torn down (test_reversed.py, next,
# checks that they went with it).
MODULE_FIXTURE = """
@pytest.fixture(scope="module", autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)
    sys.path.append("/module-fixture")


def test_sees_the_fixtures_dtype(rank):
    same_rank("fixture_1", rank)
    assert torch.get_default_dtype() == torch.float64
    torch.set_default_dtype(torch.float16)


def test_sees_it_again(rank):
    same_rank("fixture_2", rank)
    assert torch.get_default_dtype() == torch.float64 and "/module-fixture" in sys.path
"""


def test_what_a_test_leaves_in_a_warm_rank_the_next_does_not_see(pytester) -> None:
    files = {
        "conftest.py": "LEFT = {}  # what a change kept (a subgroup, a key) for its check, in any module\n",
        "test_in_order.py": _module(False),
        "test_module_fixture.py": HEADER + PIDS + MODULE_FIXTURE,
        "test_reversed.py": _module(True),
    }
    result = session_in_process(pytester, "warm", Session(files, ("-rA",)))
    for module in list(files)[1:]:
        found = outcomes(result, module)
        assert found, "\n".join(result.outlines[-60:])
        failed = {name: outcome for name, outcome in found.items() if outcome != "PASSED"}
        assert not failed, "\n".join(result.outlines)
    # Each state is put back in the rank, or kept: no rank replaced.
    ran = [line.split() for line in (pytester.path / "warm" / "pids").read_text().splitlines()]
    assert len(ran) == 2 * (4 * len(PAIRS) + 2)
    assert {rank: {pid for _, _, r, pid in ran if r == rank} for rank in "01"} == {
        rank: {pid} for _, _, rank, pid in ran[:2]
    }
