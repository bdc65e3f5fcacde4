"""The plugin's settings, resolved once at configure (the command line, else the ini file, else
the default here, as pytest-timeout does), and each test's spec from them and its marks.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_ddp.config.spec import (
    MarkArgs,
    RankSpec,
    SpecError,
    parse_backend,
    parse_count,
    parse_faults,
    parse_launcher,
    parse_timeout,
)


@dataclass(frozen=True)
class Settings:
    """The controller's settings, checked; each at its default before (and outside) a pytest session."""

    backend: str = "gloo"  # of marks that name none
    # of tests whose marks set none: --ddp-timeout, lowered to pytest-timeout's global one
    timeout: float = 60.0
    grace: float = 2.0
    isolate_all: bool = False
    max_groups: int = 2
    report_dir: str | None = None  # exists and is writable
    max_world_size: int | None = None  # None: as many ranks as the machine holds
    # the MPI launcher's command; None: MPICH's, found (mpi_group.find_launcher)
    mpi_launcher: str | None = None
    launcher: str = "auto"  # --ddp-launcher: one of spec.LAUNCHER_CHOICES

    def spec(self, mark: MarkArgs, world_size: int, timeout_mark: float | None = None) -> RankSpec:
        """The spec of one test: the ddp mark's values, else pytest-timeout's mark, else these settings."""
        timeout = mark.timeout if mark.timeout is not None else timeout_mark
        return RankSpec(
            world_size=world_size,
            backend=mark.backend or self.backend,
            timeout=timeout if timeout is not None else self.timeout,
            grace=self.grace,
            init=mark.init,
            isolated=mark.isolated or self.isolate_all,
            check_collectives=mark.check_collectives,
            faults=parse_faults(mark.faults, world_size, mark.init),
        )


DEFAULTS = Settings()
_current = DEFAULTS


def current() -> Settings:
    """The settings of this process's pytest session, or the defaults outside one."""
    return _current


def set_current(settings: Settings) -> None:
    global _current
    _current = settings


def from_config(config: pytest.Config) -> Settings:
    """The settings of this session; a bad value is a UsageError naming its option."""
    try:
        timeout = parse_timeout(_value(config, "timeout"), "--ddp-timeout")
        global_timeout = pytest_timeout_global(config)
        if global_timeout is not None:
            timeout = min(timeout, global_timeout)
        max_world_size = config.getoption("--ddp-max-world-size")
        report_dir = config.getoption("--ddp-report-dir")
        return Settings(
            backend=parse_backend(_value(config, "backend"), "--ddp-backend"),
            timeout=timeout,
            grace=parse_timeout(_value(config, "grace"), "--ddp-grace"),
            isolate_all=config.getoption("--ddp-isolate"),
            max_groups=parse_count(_value(config, "max_groups"), "--ddp-max-groups"),
            report_dir=None if report_dir is None else writable_dir(report_dir),
            max_world_size=(
                None if max_world_size is None else parse_count(max_world_size, "--ddp-max-world-size")
            ),
            mpi_launcher=_value(config, "mpi_launcher"),
            launcher=parse_launcher(_value(config, "launcher")),
        )
    except SpecError as exc:
        raise pytest.UsageError(f"pytest-ddp: {exc}") from None


def adopt_enabled(config: pytest.Config) -> bool:
    """``--ddp-adopt`` or the ``ddp_adopt`` ini value: torch's harness classes run as ddp tests."""
    return bool(config.getoption("--ddp-adopt", False) or config.getini("ddp_adopt"))


def _value(config: pytest.Config, name: str) -> Any:
    """``--ddp-<name>``, else the ini value ``ddp_<name>``, else the default (``Settings``' field of
    that name)."""
    value = config.getoption(f"--ddp-{name.replace('_', '-')}")
    if value is None:
        value = config.getini(f"ddp_{name}") or None
    return getattr(DEFAULTS, name) if value is None else value


def pytest_timeout_global(config: pytest.Config) -> float | None:
    """pytest-timeout's global timeout, read as it reads it; None when unset, <= 0 or not installed."""
    if not config.pluginmanager.hasplugin("timeout"):
        return None
    for value, where in (
        (config.getoption("timeout", None), "--timeout"),
        (os.environ.get("PYTEST_TIMEOUT"), "PYTEST_TIMEOUT"),
        (config.getini("timeout"), "the timeout ini value"),
    ):
        if value is None or value == "":
            continue
        try:
            seconds = float(value)
        except ValueError:
            raise SpecError(f"{where}={value!r}: must be a number of seconds") from None
        return seconds if seconds > 0 else None
    return None


def writable_dir(path: str) -> str:
    """The directory ``path``, created if need be, where this process may write."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise SpecError(f"--ddp-report-dir={path!r}: is a file, not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--ddp-report-dir={path!r}: cannot be created: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(f"--ddp-report-dir={path!r}: is not writable")
    # Report names are predictable: where another user can write, a link planted under one is theirs.
    info = folder.stat()
    if info.st_uid != os.geteuid() or info.st_mode & stat.S_IWOTH:
        whose = f"is user {info.st_uid}'s" if info.st_uid != os.geteuid() else "is writable by every user"
        advice = "give a folder of yours that others cannot write"
        raise SpecError(f"--ddp-report-dir={path!r}: {whose}; {advice}")
    return path


# The start of pytest's warning about a module imported before its session could rewrite it.
ALREADY_IMPORTED = "Module already imported so cannot be rewritten"


def rank_pytest_args(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """The command line of a rank's pytest session: this session's set-up, these items only."""
    # No capture: a rank's fds 1 and 2 go to files, which keep its output even if it is killed.
    args = [
        "-q", "-p", "no:cacheprovider", "--capture=no", "-o", "addopts=", "--rootdir", str(config.rootpath),
    ]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    for plugin in config.option.plugins or []:
        args += ["-p", plugin]
    for override in config.option.override_ini or []:
        args += ["-o", override]
    for warning in config.known_args_namespace.pythonwarnings or []:
        args += ["-W", warning]
    # The forkserver imported pytest's plugins, so the rank's session warns it cannot rewrite them:
    # the plugin's doing, which a user's `filterwarnings = error` must not fail (-W wins over the ini).
    args += ["-W", f"ignore:{ALREADY_IMPORTED}:pytest.PytestAssertRewriteWarning"]
    args += [f"--import-mode={config.option.importmode}", f"--tb={config.option.tbstyle}"]
    if config.option.strict_markers:
        args.append("--strict-markers")
    if config.option.confcutdir:
        args += ["--confcutdir", str(config.option.confcutdir)]
    if config.option.noconftest:
        args.append("--noconftest")
    if config.option.showlocals:
        args.append("--showlocals")
    if config.getoption("--ddp-adopt", False):
        args.append("--ddp-adopt")
    # pytest-randomly reseeds random, numpy and torch before each test from its seed: a rank with a
    # seed of its own would draw other numbers than its peers.
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        args.append(f"--randomly-seed={seed}")
    root = config.rootpath
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        args.append(f"{root / path}::{rest}" if rest else str(root / path))
    return args
