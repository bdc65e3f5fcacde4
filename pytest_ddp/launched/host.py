"""A launched pytest process other than global rank 0's: it serves the controller its rank.

Under a launcher, global rank 0's pytest is the controller; each other is a *host*
(:mod:`pytest_ddp.launched.protocol`): it collects, sends what it collected, then forks the
ranks the controller asks for (from its own forkserver) and relays commands to them, and their
files and ends back (the controller may be on another machine).  A rank that dies or hangs is
the host's child, so the launcher sees no process of its own fail and kills nothing.  The host's
pytest output goes to a log file; it exits with the controller session's status.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import _pytest.config
import pytest

from pytest_ddp.common.protocol import ProtocolError
from pytest_ddp.config.settings import rank_pytest_args
from pytest_ddp.groups.group import STACK_DUMP_WAIT
from pytest_ddp.groups.spawn import (
    NOT_FOR_RANKS,
    ForkedRank,
    dump_complete,
    file_size,
    fork_context,
    fork_rank,
    rank_files,
    read_bytes_from,
    read_from,
    write_start_file,
)
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.launch import Launch, LaunchError
from pytest_ddp.launched.link import Link, connect
from pytest_ddp.launched.signals import exit_on_signal, interrupt_on_signals
from pytest_ddp.launched.world import log_line

CONTROLLER_EXIT_WAIT = 60.0  # seconds a host waits for rank 0's pytest to exit before it does
TICK = 0.02  # seconds between looks at the ranks' files while any rank lives
GATHER_WAIT = 300.0  # seconds a rank's pytest waits for rank 0's to listen (imports, collection)


@dataclass
class Slot:
    """One rank process this host holds for the controller."""

    number: int
    rank: ForkedRank
    files: dict[str, Path]
    sent: dict[str, int] = field(default_factory=dict)  # bytes forwarded, by file
    dump_asked: float | None = None  # when the controller asked for a stack dump
    dump_offset: int = 0  # where that dump starts: a warm rank's file holds its earlier ones
    dump_seen: str | None = None


class Host:
    """The relay loop of one host (see the module's docstring)."""

    def __init__(
        self, connection: Link, folder: Path, pytest_args: Callable[[list[str]], list[str]],
        log: Callable[[str], None] = log_line,
    ) -> None:
        self.connection = connection
        self.folder = folder
        self.pytest_args = pytest_args  # node ids -> the rank's pytest command line
        self.log = log  # what was dropped, and why
        self.slots: dict[int, Slot] = {}
        self.selector = selectors.DefaultSelector()
        self.selector.register(connection, selectors.EVENT_READ, None)

    def serve(self) -> hp.End:
        """Relay until the controller ends the session (or goes away)."""
        try:
            while True:
                for key, _ in self.selector.select(TICK if self.slots else None):
                    if key.data is None:
                        end = self._orders()
                        if end is not None:
                            return end
                    else:
                        self._rank_news(key)
                for slot in list(self.slots.values()):
                    self._forward(slot)
                    self._check_dump(slot)
        finally:
            for slot in list(self.slots.values()):
                slot.rank.kill()
                self._close(slot)
            self.selector.close()

    def _orders(self) -> hp.End | None:
        """Obey what the controller sent: its End, or one of this host's if it went away."""
        for frame in self.connection.receive():  # proven: no frame is too long now
            try:
                message = hp.decode(frame)
            except ProtocolError as exc:
                self.log(f"ddp: dropped a message from rank 0's pytest: {exc}")
                continue
            if isinstance(message, hp.End):
                return message
            self._obey(message)
        if self.connection.closed:
            return hp.End(pytest.ExitCode.INTERRUPTED, "rank 0's pytest went away")
        return None

    def _obey(self, message: hp.Message) -> None:
        if isinstance(message, hp.Start):
            self._start(message)
            return
        slot = self.slots.get(getattr(message, "slot", -1))
        if slot is None:  # ended already; its exit is on its way
            return
        if isinstance(message, hp.Command):
            slot.rank.send_encoded(message.payload)
        elif isinstance(message, hp.Dump):
            slot.dump_asked, slot.dump_seen = time.monotonic(), None
            slot.dump_offset = file_size(slot.files["dump"])
            slot.rank.request_dump()
        elif isinstance(message, hp.Kill):
            slot.rank.kill()

    def _start(self, message: hp.Start) -> None:
        rank = message.role.rank
        folder = self.folder / f"slot{message.slot}"
        folder.mkdir(parents=True)
        env = {**os.environ, **message.env}
        for name in NOT_FOR_RANKS:
            env.pop(name, None)
        start = write_start_file(folder, message.role, env, self.pytest_args(message.items), list(sys.path))
        slot = Slot(message.slot, fork_rank(start, rank), rank_files(folder, rank))
        self.slots[slot.number] = slot
        slot.rank.watch(self.selector, slot)

    def _rank_news(self, key: selectors.SelectorKey) -> None:
        slot: Slot = key.data
        if not slot.rank.news(self.selector, key.fileobj):
            return  # what it wrote is forwarded next: its Data wakes the controller
        self._close(slot)
        self._forward(slot)
        assert slot.rank.exitcode is not None
        self._send(hp.Exited(slot.number, slot.rank.exitcode, time.time()))

    def _forward(self, slot: Slot) -> None:
        """Send what the rank appended to its files since the last look."""
        for name, path in slot.files.items():
            data = read_bytes_from(path, slot.sent.get(name, 0))
            if data:
                slot.sent[name] = slot.sent.get(name, 0) + len(data)
                self._send(hp.Data(slot.number, name, data))

    def _check_dump(self, slot: Slot) -> None:
        """Tell the controller once the stack dump it asked for is whole (or its time is up)."""
        if slot.dump_asked is None:
            return
        text = read_from(slot.files["dump"], slot.dump_offset)
        if dump_complete(text, slot.dump_seen) or time.monotonic() - slot.dump_asked > STACK_DUMP_WAIT:
            self._forward(slot)
            self._send(hp.Dumped(slot.number))
            slot.dump_asked = None
        slot.dump_seen = text

    def _close(self, slot: Slot) -> None:
        """Forget a slot whose rank ended or was killed, once reaped."""
        slot.rank.unwatch(self.selector)
        slot.rank.join()
        del self.slots[slot.number]

    def _send(self, message: hp.Message) -> None:
        try:
            self.connection.send_bytes(hp.encode(message))
        except OSError:
            pass  # the controller is gone: the next read says so


class HostSession:
    """The pytest plugin of a host's session (see the module's docstring)."""

    def __init__(self, config: pytest.Config, launch: Launch) -> None:
        self.config = config
        self.launch = launch
        self.end: hp.End | None = None
        self.basetemp: Path | None = None  # pytest's, once the session starts
        self.items: dict[str, pytest.Item] = {}  # collected, by node id
        self.collect_errors: list[str] = []
        self.connection: Link | None = None  # to the controller, once collected
        # Only rank 0 writes junitxml (this runs before junitxml's configure).
        config.option.xmlpath = None
        interrupt_on_signals()  # SIGTERM stops the session as Ctrl-C does

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter writes its header
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = self.config
        self.basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            # Line by line: a launcher's signal ends a host with os._exit, buffers unwritten.
            log = open(self._log_path(), "w", buffering=1)  # noqa: SIM115 - written for the session's life
            reporter._tw = _pytest.config.create_terminal_writer(config, log)

    def _log_path(self) -> Path:
        assert self.basetemp is not None
        return self.basetemp / f"ddp-rank{self.launch.rank}.log"

    def _rank_args(self, node_ids: list[str]) -> list[str]:
        """The pytest command line of a rank that runs these of this session's items."""
        return rank_pytest_args(self.config, [self.items[i] for i in node_ids if i in self.items])

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = {item.nodeid: item for item in session.items}
        if any(item.get_closest_marker("ddp") for item in session.items):
            fork_context()  # the forkserver imports torch while the controller gathers the others
        try:
            self.connection = connect(self.launch, GATHER_WAIT)
        except LaunchError as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
        hello = hp.Hello(
            self.launch.rank, self.launch.local_rank, self.launch.node_rank, socket.gethostname(),
            list(self.items), self.collect_errors, str(self._log_path()),
        )
        self.connection.send_bytes(hp.encode(hello))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}: {report.longreprtext}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        assert self.connection is not None and self.basetemp is not None  # collected, started
        self.end = Host(self.connection, self.basetemp / "ddp-host", self._rank_args, self._log).serve()
        exit_on_signal(self.end.status)
        if self.end.reason:  # before the controller exits: the launcher may then end this process
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"ddp: {self.end.reason}")
        _wait_for_end_of(self.connection, CONTROLLER_EXIT_WAIT)
        return True

    def _log(self, line: str) -> None:
        """A line in this host's log (its pytest output)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            log_line(line)
        else:
            reporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.end is not None:
            session.exitstatus = self.end.status


def _wait_for_end_of(connection: Link, timeout: float) -> None:
    """Until the controller's process has exited (its end of the connection closes)."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            connection.recv_frame(deadline)
    except (EOFError, OSError):  # TimeoutError is an OSError; a proven link's frames have no limit
        pass
    connection.close()
