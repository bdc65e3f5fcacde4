"""How a call is described in its call event (record/describe.py), on its own: no group, no rank."""

from __future__ import annotations

import datetime
import json
from typing import Any

import torch

from pytest_ddp.common.ops import BACKEND_OPS, FUNCTIONAL_OPS, OPS
from pytest_ddp.record import describe


def fields(described: describe.Described) -> dict[str, Any]:
    return json.loads("{" + described[1].removeprefix(",") + "}")


def describe_call(op: str, args: dict[str, Any]) -> describe.Described:
    """As the recorder's wrapper of torch.distributed's ``op`` describes a call of it."""
    return describe.DESCRIBERS[OPS[op].kind](OPS[op], args)


def test_a_call_at_the_backend_is_described_as_at_its_function_but_marked() -> None:
    # One describer: the dispatcher's call (its root a rank in the group, its reduce op as c10d
    # gives it) reads as the function's, its extra field marking where it was recorded.
    tensor = torch.ones(2, 3)
    at_function = describe_call("broadcast", {"tensor": tensor, "src": 1, "async_op": True})
    at_c10d = {"tensors": [tensor], "root_rank": 1}
    at_backend = describe.backend_call(BACKEND_OPS["broadcast_"], at_c10d, None, True)
    assert fields(at_backend) == {**fields(at_function), "extra": {"via": "backend"}}
    assert fields(at_function) == {
        "shapes": [[2, 3]], "dtypes": ["float32"], "devices": ["cpu"], "root": 1, "async": True
    }
    assert at_backend[2] == at_function[2] == ("WORLD",)
    reduced = {"input": tensor, "reduce_op": "max"}
    assert fields(describe.backend_call(FUNCTIONAL_OPS["all_reduce"], reduced, None, True))["extra"] == {
        "via": "backend", "op": "MAX"
    }
    # torch's default reduce op, written out
    assert fields(describe_call("all_reduce", {"tensor": tensor}))["extra"] == {"op": "SUM"}


def test_a_send_is_numbered_per_peer_wherever_it_is_recorded() -> None:
    tensor = torch.ones(1)
    at_function = describe_call("send", {"tensor": tensor, "dst": 1})
    at_backend = describe.backend_call(BACKEND_OPS["send"], {"tensors": [tensor], "dst": 1}, None, False)
    assert fields(at_function)["peer"] == fields(at_backend)["peer"] == 1
    assert at_function[2] == at_backend[2] == ("WORLD", "send", 1)
    any_source = describe.backend_call(BACKEND_OPS["recv_any_source_"], {"tensors": [tensor]}, None, False)
    assert "peer" not in fields(any_source) and any_source[2] == ("WORLD", "recv", None)


def test_a_group_set_up_says_what_it_will_use_its_timeout_last() -> None:
    timeout = datetime.timedelta(seconds=5)
    given = {"ranks": (1, 0), "use_local_synchronization": True, "timeout": timeout}
    made = fields(describe_call("new_group", given))
    assert made == {"extra": {"ranks": [0, 1], "local": True, "timeout": 5.0}}
    # An iterator is left for the real call to consume: what is known besides it, else nothing.
    assert fields(describe_call("new_group", {"ranks": iter([1, 0]), "timeout": timeout})) == {
        "extra": {"timeout": 5.0}
    }
    assert fields(describe_call("new_group", {"ranks": iter([1, 0])})) == {}
    given = {"backend": "gloo", "init_method": "tcp://h:29500", "rank": 1, "world_size": 2}
    given["timeout"] = timeout
    extra = fields(describe_call("init_process_group", given))["extra"]
    assert list(extra) == ["rank", "world_size", "init_method", "address", "backend", "timeout"]
    assert extra["address"] == "h:29500"


def test_an_init_says_whether_its_host_has_the_address_it_dials(foreign_address: str) -> None:
    """An IP address none of this machine's cannot be bound here: no process here serves a store
    there.  A name would need a lookup that may block: not told."""
    told = {}
    for host in (foreign_address, "127.0.0.1", "localhost"):
        given = {"backend": "gloo", "init_method": f"tcp://{host}:29500", "rank": 1, "world_size": 2}
        told[host] = fields(describe_call("init_process_group", given))["extra"].get("elsewhere")
    assert told == {foreign_address: True, "127.0.0.1": False, "localhost": None}
