"""The ``ddp`` marker and options, parsed and checked in one place, at collection: a message names
the argument, and nothing is spawned for a bad test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_ddp.faults import Fault

BACKENDS = ("gloo", "nccl", "mpi")
# The launchers launched mode joins (pytest_ddp.launched.launch), and --ddp-launcher's choices.
LAUNCHERS = ("torchrun", "slurm", "mpi")
LAUNCHER_CHOICES = ("auto", "local", *LAUNCHERS)
# The longest timeout (or grace) accepted: the process group's timeout, 2 x this + 60 s, still
# fits the int32 milliseconds that epoll/poll and some store calls take.
MAX_TIMEOUT = 1_000_000
# The parameter a list of world sizes parametrizes a ddp test on (one test per size).
WORLD_SIZE_PARAM = "_ddp_world_size"
MARK_ARGUMENTS = ("world_size", "backend", "timeout", "init", "isolated", "check_collectives", "faults")


class SpecError(ValueError):
    """A ddp marker or option that cannot be run."""


@dataclass(frozen=True)
class MarkArgs:
    """The ``@pytest.mark.ddp(...)`` arguments, checked, before defaults apply."""

    world_sizes: tuple[int, ...]
    parametrized: bool  # world_size was a list: one test per size
    backend: str | None
    timeout: float | None
    init: bool
    isolated: bool
    check_collectives: bool
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True)
class RankSpec:
    """How one ddp test runs: everything resolved."""

    world_size: int
    backend: str
    timeout: float
    grace: float
    init: bool = True
    isolated: bool = False
    check_collectives: bool = True
    faults: tuple[Fault, ...] = ()  # checked against world_size and init

    @property
    def group_key(self) -> tuple[int, str, bool]:
        """Tests with the same key may share warm rank processes."""
        return (self.world_size, self.backend, self.init)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_world_sizes(value: Any) -> tuple[tuple[int, ...], bool]:
    """An int, or a non-empty list/tuple of ints: (sizes, parametrized)."""
    if not isinstance(value, (list, tuple)):
        if not _is_int(value) or value < 1:
            raise SpecError(f"world_size={value!r}: must be an int >= 1")
        return (value,), False
    if not value:
        raise SpecError("world_size=[]: the list of world sizes is empty")
    for item in value:
        if not _is_int(item) or item < 1:
            raise SpecError(f"world_size={value!r}: {item!r} is not an int >= 1")
    if len(set(value)) != len(value):
        raise SpecError(f"world_size={value!r}: a world size is listed twice")
    return tuple(value), True


def parse_backend(value: Any, name: str = "backend") -> str:
    if not isinstance(value, str) or value.lower() not in BACKENDS:
        raise SpecError(f"{name}={value!r}: must be one of {', '.join(BACKENDS)}")
    return value.lower()


def parse_launcher(value: str) -> str:
    """``--ddp-launcher`` (the option's own choices check the command line; this, the ini value)."""
    if value not in LAUNCHER_CHOICES:
        raise SpecError(f"--ddp-launcher={value!r}: must be one of {', '.join(LAUNCHER_CHOICES)}")
    return value


def _number(value: Any) -> float | None:
    """A number, given as one (or, from ini files and the command line, as a string); else None."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def parse_timeout(value: Any, name: str = "timeout") -> float:
    """Seconds, finite, > 0 and at most MAX_TIMEOUT."""
    seconds = _number(value)
    if seconds is None or not (0 < seconds <= MAX_TIMEOUT):  # also refuses nan and inf
        raise SpecError(f"{name}={value!r}: must be a number of seconds > 0 and <= {MAX_TIMEOUT}")
    return seconds


def parse_count(value: Any, name: str) -> int:
    """An int >= 1, given as one or as a string."""
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            pass
    if not _is_int(number) or number < 1:
        raise SpecError(f"{name}={value!r}: must be an int >= 1")
    return number


def parse_timeout_mark(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> float | None:
    """The timeout of ``@pytest.mark.timeout(N)``; None where N <= 0 (pytest-timeout: none)."""
    value = args[0] if args else kwargs.get("timeout")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None and seconds <= 0:
        return None
    return parse_timeout(value)


def process_group_timeout(longest_test_timeout: float) -> float:
    """The process group's own timeout: above every test's, so that the plugin sees a hang first."""
    return max(2 * longest_test_timeout + 60, 600)


def _flag(kwargs: Mapping[str, Any], name: str, default: bool) -> bool:
    value = kwargs.get(name, default)
    if not isinstance(value, bool):
        raise SpecError(f"{name}={value!r}: must be True or False")
    return value


def parse_mark(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> MarkArgs:
    """Check the arguments of one ``ddp`` marker."""
    if args:
        raise SpecError(
            f"positional arguments {args!r} are not accepted: use keywords, e.g. ddp(world_size=2)"
        )
    unknown = sorted(set(kwargs) - set(MARK_ARGUMENTS))
    if unknown:
        raise SpecError(
            f"unknown argument {', '.join(unknown)}: ddp takes {', '.join(MARK_ARGUMENTS)}"
        )
    if "world_size" not in kwargs:
        raise SpecError("world_size is required, e.g. ddp(world_size=2)")
    sizes, parametrized = parse_world_sizes(kwargs["world_size"])
    backend = kwargs.get("backend")
    return MarkArgs(
        world_sizes=sizes,
        parametrized=parametrized,
        backend=None if backend is None else parse_backend(backend),
        timeout=None if kwargs.get("timeout") is None else parse_timeout(kwargs["timeout"]),
        init=_flag(kwargs, "init", True),
        isolated=_flag(kwargs, "isolated", False),
        check_collectives=_flag(kwargs, "check_collectives", True),
        faults=parse_faults(kwargs.get("faults", ()), None, _flag(kwargs, "init", True)),
    )


def parse_faults(value: Any, world_size: int | None, init: bool) -> tuple[Fault, ...]:
    """The ``faults=[...]`` argument, checked (against ``world_size`` once it is known)."""
    if isinstance(value, (list, tuple)) and not value:
        return ()
    from pytest_ddp.faults import FaultError, check_all  # for a mark with faults only: not at configure

    try:
        return check_all(value, world_size, init)
    except FaultError as exc:
        raise SpecError(f"faults: {exc}") from None
