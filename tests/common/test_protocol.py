"""The rank protocol: every record survives the wire, unknown kinds are refused, the
recorder's hand-built lines decode into the calls it meant."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ddp.common import protocol
from pytest_ddp.common.event_log import EventLog, EventReader, LineDecoder
from pytest_ddp.common.protocol import (
    CALL_KEYS,
    CallEvent,
    CallFunction,
    Done,
    Fatal,
    PhaseStart,
    ProtocolError,
    Ready,
    Report,
    RetEvent,
    RunItem,
    Stop,
    TestStart,
)
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.launched import protocol as hp
from pytest_ddp.rank.channel import Channel
from pytest_ddp.record import numbering

RECORDS: list[protocol.Record] = [
    RunItem("t.py::test_a", next="t.py::test_b"),
    RunItem("t.py::test_b"),
    CallFunction("m.f", module="m", qualname="f", args="gASVAAAAAAAAAAA="),
    Stop(),
    Ready(["t.py::test_a"], ["t.py: ImportError"], time=1.5),
    Fatal("Traceback ...", time=1.5),
    TestStart("t.py::test_a", time=1.5),
    PhaseStart("setup", time=1.5),
    Report("call", "failed", 0.25, {"longrepr": "boom"}, time=1.5),
    Report("call", "passed", 0.25, time=1.5),
    Done(
        group_intact=False, in_flight=[{"i": 0, "err": "not complete"}], peak_rss=1 << 20, peak_cuda=None,
        time=1.5,
    ),
    CallEvent(
        index=3, op="broadcast", group="g1", group_ranks=[0, 2], seq=2, site="t.py:9", shapes=[[2, 3]],
        dtypes=["torch.float32"], devices=["cpu"], root=2, is_async=True, extra={"via": "ddp"}, time=1.5,
    ),
    CallEvent(index=0, op="recv_object_list", peer=1, obj_type="dict", obj_size=120, time=1.5),
    RetEvent(3, time=2.5),
    RetEvent(4, ok=False, error="RuntimeError: closed", time=2.5),
    RetEvent(5, ok=False, error="ValueError: no MAX on complex tensors", before_backend=True, time=2.5),
    protocol.Setting("their pipeline schedules' n_microbatches", 4, "t.py:7", time=2.5),
    protocol.SessionEnd("passed", 0.5, time=1.5),
    protocol.SessionEnd("failed", 0.25, {"longrepr": "boom"}, time=1.5),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_survives_the_wire(record: protocol.Record) -> None:
    line = protocol.encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode(line) == record


def test_a_stream_cut_anywhere_decodes_to_the_same_records() -> None:
    stream = b"".join(protocol.encode(r) for r in RECORDS)
    decoder = LineDecoder()
    decoded: list[protocol.Record] = []
    for start in range(0, len(stream), 7):  # chunks that cut lines in the middle
        decoded += decoder.feed(stream[start : start + 7])
    assert decoded == RECORDS


def test_a_line_cut_short_is_a_fatal_event_and_the_lines_around_it_are_read() -> None:
    """A full disk cuts a write short: the next line is appended to the half line."""
    first, second, third = (protocol.encode(r) for r in RECORDS[:3])
    decoded = LineDecoder().feed(first + second[:9] + third + protocol.encode(RECORDS[3]))
    assert decoded[0] == RECORDS[0] and decoded[2] == RECORDS[3]
    assert isinstance(decoded[1], protocol.Fatal) and "not an event" in decoded[1].error
    assert len(decoded) == 3


@pytest.mark.parametrize(
    "line",
    [
        b'{"e":"gossip","t":1.0}', b'{"cmd":"reboot"}', b'{"id":"t.py::test_a"}', b'{"e":"test","t":1.0}',
        b"[1]",
    ],
    ids=["unknown event", "unknown command", "no kind", "missing key", "not an object"],
)
def test_what_is_not_a_known_record_is_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.decode(line)


def test_an_event_log_reads_back_what_was_written(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path / "events"))
    reader = EventReader(str(tmp_path / "events"))
    events = [r for r in RECORDS if not isinstance(r, (RunItem, CallFunction, Stop))]
    for event in events[:3]:
        log.write(event)
    assert reader.read_new() == events[:3]
    for event in events[3:]:
        log.write(event)
    assert reader.read_new() == events[3:]
    assert reader.read_new() == []
    log.close()
    reader.close()


# -- a rank's start -----------------------------------------------------------------------

ROLE = protocol.RankRole(
    rank=1, world_size=2, backend="gloo", init=True, mode="pytest", pg_timeout=60.0, store_host="127.0.0.1",
    store_port=29500, local_rank=1,
)
START = protocol.RankStart(
    role=ROLE, events="/g/rank1.events", stdout="/g/rank1.stdout", stderr="/g/rank1.stderr",
    dump="/g/rank1.dump", env={"PATH": "/bin"}, cwd="/w", pytest_args=["t.py::test_a", "-p", "x"],
    sys_path=[], basetemp="/g/rank1.tmp",
)


START_DICT, ROLE_DICT = dataclasses.asdict(START), dataclasses.asdict(ROLE)
NO_STORE = dataclasses.replace(START, role=dataclasses.replace(ROLE, store_port=None))  # an MPI rank's


@pytest.mark.parametrize("start", [START, NO_STORE])
def test_a_ranks_start_survives_its_file(start: protocol.RankStart) -> None:
    assert protocol.RankStart.from_json(start.to_json()) == start


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def _role_with(**fields: Any) -> dict[str, Any]:
    """START's dict, its role's ``fields`` replaced."""
    return {**START_DICT, "role": {**ROLE_DICT, **fields}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_without(START_DICT, "cwd"), "a rank's start without ['cwd']"),
        ({**START_DICT, "log_capture": True}, "a rank's start with unknown keys ['log_capture']"),
        ({**START_DICT, "role": _without(ROLE_DICT, "rank")}, "a rank's role without ['rank']"),
        (_role_with(rank="1"), "a rank's role whose 'rank' is not int"),
        (_role_with(init=1), "a rank's role whose 'init' is not bool"),
        ({**START_DICT, "env": {"PATH": 1}}, "a rank's start whose 'env' is not dict[str, str]"),
        ({**START_DICT, "role": None}, "a rank's role: not a JSON object"),
        ([START_DICT], "a rank's start: not a JSON object"),
    ],
    ids=[
        "missing", "unknown", "role missing", "role's type", "a number for a bool", "env", "no role",
        "a list",
    ],
)
def test_a_ranks_start_that_is_not_one_field_for_field_is_refused(data: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        protocol.RankStart.from_json(json.dumps(data))
    assert str(refused.value).startswith(message)


def test_a_start_file_that_is_not_json_is_refused() -> None:
    with pytest.raises(ProtocolError, match="a rank's start: not JSON"):
        protocol.RankStart.from_json(START.to_json()[:-1])


def test_a_host_is_started_with_a_ranks_role_or_refuses_the_message() -> None:
    frame = hp.encode(hp.Start(2, ROLE, {"RANK": "1"}, ["t.py::test_a"]))
    assert hp.decode(frame) == hp.Start(2, ROLE, {"RANK": "1"}, ["t.py::test_a"])
    refusal = r"a malformed start message: .* \(a rank's role whose 'rank' is not int"
    with pytest.raises(ProtocolError, match=refusal):
        hp.decode(frame.replace(b'"rank": 1', b'"rank": "1"'))


# -- the recorder's hand-built lines ---------------------------------------------------


def test_the_recorders_lines_decode_into_the_calls_it_recorded(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path / "events"))
    numbers = numbering.Numbers()
    # The body as the recorder builds it for an async broadcast on a subgroup.
    body = (
        '"op":"broadcast","group":"g1","ranks":[0,2],"site":"t.py:9","t":1.5,'
        '"shapes":[[2,3]],"dtypes":["torch.float32"],"devices":["cpu"],"root":2,"async":true,'
        '"extra":{"via":"ddp"}'
    )
    numbers.write_call(log, body, ("g1",))
    numbers.write_call(log, '"op":"send_object_list","group":"WORLD","ranks":[0,1],"site":"t.py:12","t":1.75,'
                       '"peer":1,"obj_type":"dict","obj_size":120', ("WORLD", "send", 1))
    all_reduce = '"op":"all_reduce","group":"WORLD","ranks":[0,1],"site":"t.py:14","t":2.0'
    numbers.write_call(log, all_reduce, ("WORLD",))
    numbering.write_ret(log, 0, None)
    numbering.write_ret(log, 1, TypeError("cannot pickle"))
    numbering.write_ret(log, 2, ValueError("complex"), before_backend=True)
    log.close()

    lines = [json.loads(line) for line in (tmp_path / "events").read_text().splitlines()]
    assert all(set(line) <= CALL_KEYS for line in lines if line["e"] == "call")
    assert all(set(line) <= protocol.RET_KEYS for line in lines if line["e"] == "ret")

    state = RankState(0)
    for event in EventReader(str(tmp_path / "events")).read_new():
        state.apply(event)
    broadcast = Call(
        index=0, op="broadcast", group="g1", group_ranks=(0, 2), seq=1, site="t.py:9", enter=1.5,
        shapes=[[2, 3]], dtypes=["torch.float32"], devices=["cpu"], root=2, is_async=True,
        extra={"via": "ddp"},
    )
    send = Call(
        index=1, op="send_object_list", group="WORLD", group_ranks=(0, 1), seq=1, site="t.py:12", enter=1.75,
        peer=1, obj_type="dict", obj_size=120, error="TypeError: cannot pickle",
    )
    checked = Call(
        index=2, op="all_reduce", group="WORLD", group_ranks=(0, 1), seq=1, site="t.py:14", enter=2.0,
        error="ValueError: complex", before_backend=True,
    )
    assert all(c.exit is not None for c in state.calls)
    broadcast.exit, send.exit, checked.exit = (c.exit for c in state.calls)
    assert state.calls == [broadcast, send, checked]
    assert [c.state for c in state.calls] == ["ok", "raised", "raised"]


# -- who accepts what ------------------------------------------------------------------


def test_an_event_with_no_place_in_a_test_is_refused() -> None:
    with pytest.raises(ProtocolError):
        RankState(0).apply(Ready(["t.py::test_a"]))


@pytest.fixture
def rank_channel(tmp_path: Path) -> Iterator[tuple[Channel, Any]]:
    """A rank's channel in this process, and the controller's end of its command pipe."""
    read, write = multiprocessing.Pipe(duplex=False)
    notify_read, notify_write = multiprocessing.Pipe(duplex=False)
    channel = Channel(str(tmp_path / "events"), read, notify_write)
    yield channel, write
    channel.log.close()
    for end in (read, write, notify_read, notify_write):
        end.close()


def test_a_rank_runs_the_commands_of_its_mode_until_stop(rank_channel: tuple[Channel, Any]) -> None:
    channel, controller = rank_channel
    for command in (RunItem("t.py::test_a", "t.py::test_b"), RunItem("t.py::test_b"), Stop()):
        controller.send_bytes(protocol.encode(command))
    expected = [RunItem("t.py::test_a", "t.py::test_b"), RunItem("t.py::test_b")]
    assert list(channel.commands(RunItem)) == expected


def test_a_rank_ends_when_the_controller_closes_the_pipe(rank_channel: tuple[Channel, Any]) -> None:
    channel, controller = rank_channel
    controller.send_bytes(protocol.encode(CallFunction("m.f", "m", "f", "")))
    controller.close()
    assert list(channel.commands(CallFunction)) == [CallFunction("m.f", "m", "f", "")]


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (RunItem, protocol.encode(CallFunction("m.f", "m", "f", ""))),
        (CallFunction, protocol.encode(RunItem("t.py::test_a"))),
        (RunItem, b'{"cmd":"reboot"}'),
        (RunItem, protocol.encode(Ready())),
    ],
    ids=["call to a pytest rank", "run to a function rank", "unknown command", "an event"],
)
def test_a_command_a_rank_cannot_run_is_an_error(
    rank_channel: tuple[Channel, Any], mode: type[Any], message: bytes
) -> None:
    channel, controller = rank_channel
    controller.send_bytes(message)
    with pytest.raises(ProtocolError):
        next(channel.commands(mode))
