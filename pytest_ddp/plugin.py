"""The pytest plugin (the ``pytest11`` entry point): the ``ddp`` marker, its options, the
world-size parametrization and the rank fixtures.

Nothing until used: pytest loads this module in every session, so it imports only the settings
and the rank's context; the controller (:mod:`pytest_ddp.controller`), torch and the forkserver
start once a ddp test is collected (under a launcher, at configure).  Inside a rank the plugin
only provides the fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ddp.config import settings as settings_module
from pytest_ddp.config.settings import DEFAULTS, Settings
from pytest_ddp.config.spec import LAUNCHER_CHOICES, WORLD_SIZE_PARAM, SpecError, parse_mark
from pytest_ddp.rank import context as rank_module

if TYPE_CHECKING:
    from pytest_ddp.launched.launch import Launch

# The settings of a session whose controller starts when it has collected a ddp test.
settings_key = pytest.StashKey[Settings]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddp", "distributed tests (pytest-ddp)")

    def option(name: str, text: str, ini: bool = True, **kwargs: Any) -> None:
        """``--ddp-<name>``, and (``ini``) the ini value ``ddp_<name>``, read where it is not given."""
        kwargs.setdefault("default", None)
        group.addoption(f"--ddp-{name.replace('_', '-')}", help=text, **kwargs)
        if ini:
            parser.addini(f"ddp_{name}", text)

    option(
        "backend",
        f"backend of ddp tests whose mark names none: gloo, nccl or mpi (default {DEFAULTS.backend})",
    )
    option(
        "mpi_launcher",
        "the MPI launcher of backend='mpi' tests, before its '-n N', e.g. 'mpirun --oversubscribe' "
        "(default: MPICH's mpiexec.gforker, else mpiexec)",
        metavar="COMMAND",
    )
    option(
        "timeout", f"seconds a ddp test may run before its ranks are stopped (default {DEFAULTS.timeout:g})"
    )
    option("grace", f"seconds a failed rank's peers get before they are stopped (default {DEFAULTS.grace:g})")
    option(
        "isolate", "give every ddp test fresh rank processes", ini=False, action="store_true", default=False
    )
    option("max_groups", f"rank groups kept warm at once (default {DEFAULTS.max_groups})")
    option("report_dir", "write a JSON report of each failing ddp test into DIR", ini=False, metavar="DIR")
    option(
        "max_world_size",
        "largest world size accepted (default: what this machine's memory and process limit hold)",
        ini=False,
        metavar="N",
    )
    option(
        "launcher",
        "how this pytest was started: auto (default: torchrun, srun or mpiexec, from their "
        "environment), local (fork every test's ranks here, even under a launcher), or torchrun, slurm, mpi",
        choices=LAUNCHER_CHOICES,
    )
    option(
        "adopt",
        "run torch's distributed test classes (MultiProcessTestCase and its children, "
        "MultiProcContinuousTest) on warm ranks, as they are (docs/adopt.md)",
        ini=False,
        action="store_true",
        default=False,
    )
    parser.addini("ddp_adopt", "see --ddp-adopt", type="bool", default=False)


@pytest.hookimpl(tryfirst=True)  # before junitxml's: a launched rank other than 0 writes none
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ddp(world_size, backend=None, timeout=None, init=True, isolated=False, check_collectives=True, "
        "faults=()): "
        "run the test on world_size ranks in a torch.distributed process group",
    )
    if rank_module.current() is not None:
        return
    settings = settings_module.from_config(config)
    previous = settings_module.current()
    settings_module.set_current(settings)  # for pytest_ddp.run() in this session's tests
    config.add_cleanup(lambda: settings_module.set_current(previous))
    launch = _launch(config, settings.launcher)
    if launch is None:
        config.stash[settings_key] = settings
    elif launch.controller:
        from pytest_ddp.controller import Controller

        config.pluginmanager.register(Controller(config, settings, launch), "ddp_controller")
    else:
        from pytest_ddp.launched.host import HostSession

        config.pluginmanager.register(HostSession(config, launch), "ddp_host")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--ddp-adopt: torch's harness classes become ddp tests (here, and alike in each rank)."""
    if settings_module.adopt_enabled(config):
        from pytest_ddp.adopt import collect

        collect.adopt(items, in_rank=rank_module.current() is not None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The controller starts here, once a ddp test is collected (under a launcher it is there
    already, and compares the launched collections whatever they hold)."""
    config = session.config
    controller = config.pluginmanager.get_plugin("ddp_controller")
    if controller is None:
        settings = config.stash.get(settings_key, None)
        if settings is None or not any(item.get_closest_marker("ddp") is not None for item in session.items):
            return
        from pytest_ddp.controller import Controller

        controller = Controller(config, settings, None)
        config.pluginmanager.register(controller, "ddp_controller")
    controller.collected(session)


def _launch(config: pytest.Config, launcher: str) -> Launch | None:
    """The launch this pytest is part of (:mod:`pytest_ddp.launched.launch`), or None for an
    ordinary session."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller's launch, not its own
        return None
    from pytest_ddp.launched.launch import LaunchError, detect

    try:
        launch = detect(os.environ, launcher)
    except LaunchError as exc:
        raise pytest.UsageError(f"pytest-ddp: {exc}") from None
    if launch is not None and config.getoption("numprocesses", None):
        raise pytest.UsageError(
            f"pytest-ddp: {launch.describe()}: pytest-xdist's -n does not combine with it"
        )
    return launch


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A list of world sizes makes one test per size (in the ranks too: they collect the same
    items).  A bad mark leaves the test as it is, to be reported as that test's error."""
    marker = metafunc.definition.get_closest_marker("ddp")
    if marker is None:
        return
    try:
        mark = parse_mark(marker.args, marker.kwargs)
    except SpecError:
        return
    if mark.parametrized:
        # Parametrize on a name the test need not request.
        if WORLD_SIZE_PARAM not in metafunc.fixturenames:
            metafunc.fixturenames.append(WORLD_SIZE_PARAM)
        metafunc.parametrize(
            WORLD_SIZE_PARAM, mark.world_sizes, ids=[f"ws{n}" for n in mark.world_sizes]
        )


# -- fixtures (they work inside the ranks) -------------------------------------


def _context(name: str) -> rank_module.RankContext:
    context = rank_module.current()
    if context is None:
        raise pytest.UsageError(f"the {name!r} fixture is only available in tests marked @pytest.mark.ddp")
    return context


@pytest.fixture(scope="session")
def rank() -> int:
    """This rank's number, 0 .. world_size - 1."""
    return _context("rank").rank


@pytest.fixture(scope="session")
def world_size() -> int:
    """The number of ranks running this test."""
    return _context("world_size").world_size


@pytest.fixture(scope="session")
def device() -> Any:
    """``torch.device("cpu")`` on Gloo, ``cuda:<local rank>`` on NCCL."""
    import torch

    return torch.device(_context("device").device)


@pytest.fixture(scope="session")
def process_group() -> Any:
    """The default process group (``init=True`` tests)."""
    _context("process_group")
    import torch.distributed as dist

    if not dist.is_initialized():
        raise pytest.UsageError(
            "process_group: no process group here (init=False test that has not called init_process_group)"
        )
    return dist.group.WORLD


@pytest.fixture(scope="session")
def comm() -> Any:
    """``MPI.COMM_WORLD``, recorded (``backend="mpi"`` tests)."""
    if _context("comm").backend != "mpi":
        raise pytest.UsageError("comm: the MPI world of backend='mpi' tests; this test's backend is not mpi")
    from mpi4py import MPI

    return MPI.COMM_WORLD


_attempt_key = pytest.StashKey[int]()  # ddp_shared_path's set-ups of an item in this rank


@pytest.fixture
def ddp_shared_path(request: pytest.FixtureRequest) -> Path:
    """A directory for this test, the same path on every rank (checkpoints, files one rank
    writes and another reads); under the controller's basetemp, which pytest rotates."""
    _context("ddp_shared_path")
    from pytest_ddp.groups.group import SHARED_ROOT_ENV
    from pytest_ddp.report.writable import file_name

    root = os.environ.get(SHARED_ROOT_ENV)
    if root is None:
        raise pytest.UsageError(
            "ddp_shared_path: this rank group has no shared directory (a pytest_ddp.run() group)"
        )
    # Every rank derives the same name; each attempt of a rerun (pytest-rerunfailures) gets its
    # own directory, as tmp_path does.
    attempt = request.node.stash.get(_attempt_key, 0) + 1
    request.node.stash[_attempt_key] = attempt
    name = file_name(request.node.nodeid) + (f"-rerun{attempt - 1}" if attempt > 1 else "")
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path
