"""What each recorded operation is: the one table the recorder, the watchdog and the report
read (no torch import: the controller uses it too).

An operation's *kind* decides how the watchdog pairs it:

``collective``  every member of its group enters it; numbered per group
``p2p``         one send pairs with one receive; numbered per (group, direction, peer)
``batch``       ``batch_isend_irecv``: sends and receives to many peers at once;
                a count of its own per group, in no collective sequence
``group``       sets up or tears down groups (``init_process_group``, ...); not numbered

mpi4py's communicator methods are in the same table as ``mpi.<method>``, with mpi4py's parameter
names; making a communicator (``Dup``, ``Split``) is a collective of the one it is made from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["collective", "p2p", "batch", "group"]
Api = Literal["torch", "mpi"]
MPI_PREFIX = "mpi."
Direction = Literal["send", "recv"]


@dataclass(frozen=True)
class Op:
    """One operation, and where a call of it keeps what the recorder describes."""

    name: str
    kind: Kind
    tensors: str | None = None  # parameter holding the tensor(s) described
    rank: str | None = None  # parameter holding the root (collectives) or peer (p2p), a global rank
    group_rank: str | None = None  # the same given as a rank in the group (group_src, group_dst)
    obj: str | None = None  # *_object calls: parameter holding the object(s) sent
    obj_from_root: bool = False  # only the root's objects mean anything (broadcast, scatter)
    direction: Direction | None = None  # p2p: which end of the exchange
    blocks: bool = True  # the caller stays inside until the work is done
    uneven: bool = False  # its tensors may differ in size between ranks (uneven splits)
    python: bool = True  # a torch.distributed function the recorder wraps (where this torch has it)
    api: Api = "torch"
    # MPI only:
    tag: str | None = None  # parameter holding the tag (a send's, a receive's: absent means any tag)
    recv_from: str | None = None  # Sendrecv: the receiving end's source and tag parameters
    recv_tag: str | None = None
    reduction: str | None = None  # parameter holding the reduction operation (ReduceOp.SUM, MPI.SUM, ...)
    probe: bool = False  # waits for a matching message without receiving it
    synchronous: bool = False  # a send that returns only once its receive has started (Ssend)
    makes_comm: bool = False  # returns a new communicator (Dup, Split, Create)
    # torch's Flight Recorder (report.flight_recorder): its name there, and the described tensor's part.
    recorded_as: str | None = None
    described: Literal["part_of_output", "part_of_input", "whole_input"] | None = None

    @property
    def is_collective(self) -> bool:
        """Every member of its group must enter it before any can leave it."""
        return self.kind == "collective"

    @property
    def method(self) -> str:
        """The name the user called: ``all_reduce``, ``Send`` (of ``mpi.Send``)."""
        return self.name.removeprefix(MPI_PREFIX) if self.api == "mpi" else self.name

    @property
    def flight_recorder_name(self) -> str:
        """The collective's name in torch's Flight Recorder (Gloo's names the gathers into a
        tensor all_gather; object collectives as the collective torch makes of them)."""
        return self.recorded_as or self.name

    @property
    def pairs(self) -> bool:
        """A send or receive between two ranks."""
        return self.kind == "p2p"


def _table(*ops: Op) -> dict[str, Op]:
    return {op.name: op for op in ops}


OPS: dict[str, Op] = _table(
    Op("all_reduce", "collective", "tensor", reduction="op"),
    Op("all_gather", "collective", "tensor", described="part_of_output"),
    Op("all_gather_into_tensor", "collective", "input_tensor", recorded_as="all_gather",
       described="part_of_output"),
    Op("all_gather_object", "collective", obj="obj", recorded_as="all_gather"),
    Op("reduce_scatter", "collective", "output", reduction="op", described="part_of_input"),
    Op("reduce_scatter_tensor", "collective", "input", reduction="op", recorded_as="reduce_scatter",
       described="whole_input"),
    Op("all_to_all", "collective", "input_tensor_list", uneven=True),
    Op("all_to_all_single", "collective", "input", uneven=True, recorded_as="all_to_all"),
    Op("broadcast", "collective", "tensor", "src", "group_src"),
    Op("broadcast_object_list", "collective", None, "src", "group_src", "object_list", obj_from_root=True,
       recorded_as="broadcast"),
    Op("reduce", "collective", "tensor", "dst", "group_dst", reduction="op"),
    Op("gather", "collective", "tensor", "dst", "group_dst"),
    Op("gather_object", "collective", None, "dst", "group_dst", "obj", recorded_as="gather"),
    Op("scatter", "collective", "tensor", "src", "group_src"),
    Op("scatter_object_list", "collective", None, "src", "group_src", "scatter_object_input_list",
       obj_from_root=True, recorded_as="scatter"),
    Op("barrier", "collective"),
    Op("monitored_barrier", "collective", recorded_as="barrier"),
    Op("send", "p2p", "tensor", "dst", "group_dst", direction="send"),
    Op("recv", "p2p", "tensor", "src", "group_src", direction="recv"),
    Op("isend", "p2p", "tensor", "dst", "group_dst", direction="send", blocks=False),
    Op("irecv", "p2p", "tensor", "src", "group_src", direction="recv", blocks=False),
    Op("send_object_list", "p2p", None, "dst", "group_dst", "object_list", direction="send"),
    Op("recv_object_list", "p2p", None, "src", "group_src", direction="recv"),
    Op("batch_isend_irecv", "batch", blocks=False),
    Op("init_process_group", "group"),
    Op("new_group", "group"),
    Op("destroy_process_group", "group"),
    Op("all_gather_single", "collective", "input_tensor", recorded_as="all_gather",
       described="part_of_output"),
    Op("reduce_scatter_single", "collective", "input", recorded_as="reduce_scatter", described="whole_input"),
    Op("all_gather_coalesced", "collective", "input_tensor_list", recorded_as="all_gather",
       described="part_of_output"),
    Op("all_reduce_coalesced", "collective", "tensors", reduction="op", recorded_as="allreduce_coalesced"),
    # Reached only through the backend; the first two are newer than torch 2.13.
    Op("gather_into_tensor", "collective", "tensor", "dst", "group_dst", recorded_as="gather"),
    Op("gather_single", "collective", "tensor", "dst", "group_dst", recorded_as="gather"),
    Op("all_gather_into_tensor_coalesced", "collective", python=False, recorded_as="all_gather"),
    Op("reduce_scatter_tensor_coalesced", "collective", python=False, recorded_as="reduce_scatter"),
)


def _mpi(method: str, kind: Kind, buffer: str | None = None, rank: str | None = None, **facts: Any) -> Op:
    """An mpi4py communicator method: ``Send`` describes ``buffer``, its pickling twin ``send`` ``obj``."""
    return Op(f"{MPI_PREFIX}{method}", kind, buffer, rank, api="mpi", python=False, **facts)


_SEND: dict[str, Any] = {"direction": "send", "tag": "tag"}
_RECV: dict[str, Any] = {"direction": "recv", "tag": "tag"}
_ASYNC: dict[str, Any] = {"blocks": False}

MPI_OPS: dict[str, Op] = _table(
    _mpi("Send", "p2p", "buf", "dest", **_SEND),
    _mpi("Ssend", "p2p", "buf", "dest", **_SEND, synchronous=True),
    _mpi("Isend", "p2p", "buf", "dest", **_SEND, **_ASYNC),
    _mpi("Issend", "p2p", "buf", "dest", **_SEND, **_ASYNC, synchronous=True),
    _mpi("Recv", "p2p", "buf", "source", **_RECV),
    _mpi("Irecv", "p2p", "buf", "source", **_RECV, **_ASYNC),
    _mpi("Sendrecv", "p2p", "sendbuf", "dest", tag="sendtag", recv_from="source", recv_tag="recvtag"),
    _mpi("Probe", "p2p", None, "source", **_RECV, probe=True),
    _mpi("Iprobe", "p2p", None, "source", **_RECV, **_ASYNC, probe=True),
    _mpi("send", "p2p", None, "dest", **_SEND, obj="obj"),
    _mpi("ssend", "p2p", None, "dest", **_SEND, obj="obj", synchronous=True),
    _mpi("isend", "p2p", None, "dest", **_SEND, **_ASYNC, obj="obj"),
    _mpi("issend", "p2p", None, "dest", **_SEND, **_ASYNC, obj="obj", synchronous=True),
    _mpi("recv", "p2p", None, "source", **_RECV),
    _mpi("irecv", "p2p", None, "source", **_RECV, **_ASYNC),
    _mpi("sendrecv", "p2p", None, "dest", tag="sendtag", recv_from="source", recv_tag="recvtag",
         obj="sendobj"),
    _mpi("probe", "p2p", None, "source", **_RECV, probe=True),
    _mpi("iprobe", "p2p", None, "source", **_RECV, **_ASYNC, probe=True),
    _mpi("Barrier", "collective", recorded_as="barrier"),
    _mpi("barrier", "collective", recorded_as="barrier"),
    _mpi("Bcast", "collective", "buf", "root", recorded_as="broadcast"),
    _mpi("bcast", "collective", None, "root", obj="obj", obj_from_root=True, recorded_as="broadcast"),
    _mpi("Reduce", "collective", "sendbuf", "root", reduction="op", recorded_as="reduce"),
    _mpi("reduce", "collective", None, "root", obj="sendobj", reduction="op", recorded_as="reduce"),
    _mpi("Allreduce", "collective", "sendbuf", reduction="op", recorded_as="all_reduce"),
    _mpi("allreduce", "collective", None, obj="sendobj", reduction="op", recorded_as="all_reduce"),
    # With MPI.IN_PLACE a rank's own buffer holds every rank's part: sizes are not compared.
    _mpi("Gather", "collective", "sendbuf", "root", uneven=True, recorded_as="gather"),
    _mpi("Gatherv", "collective", "sendbuf", "root", uneven=True, recorded_as="gather"),
    _mpi("gather", "collective", None, "root", obj="sendobj", recorded_as="gather"),
    _mpi("Scatter", "collective", "recvbuf", "root", uneven=True, recorded_as="scatter"),
    _mpi("Scatterv", "collective", "recvbuf", "root", uneven=True, recorded_as="scatter"),
    _mpi("scatter", "collective", None, "root", obj="sendobj", obj_from_root=True, recorded_as="scatter"),
    _mpi("Allgather", "collective", "sendbuf", uneven=True, recorded_as="all_gather"),
    _mpi("Allgatherv", "collective", "sendbuf", uneven=True, recorded_as="all_gather"),
    _mpi("allgather", "collective", None, obj="sendobj", recorded_as="all_gather"),
    _mpi("Alltoall", "collective", "sendbuf", recorded_as="all_to_all"),
    _mpi("Alltoallv", "collective", "sendbuf", uneven=True, recorded_as="all_to_all"),
    _mpi("alltoall", "collective", None, obj="sendobj", recorded_as="all_to_all"),
    _mpi("Dup", "collective", makes_comm=True, recorded_as="split"),
    _mpi("Clone", "collective", makes_comm=True, recorded_as="split"),
    _mpi("Split", "collective", makes_comm=True, recorded_as="split"),
    _mpi("Split_type", "collective", makes_comm=True, recorded_as="split"),
    _mpi("Create", "collective", makes_comm=True, recorded_as="split"),
    # A topology's communicator is returned as made (a recording one would lose its methods, Shift,
    # Get_coords): the calls on it are not recorded.
    _mpi("Create_cart", "collective", recorded_as="split"),
    _mpi("Create_graph", "collective", recorded_as="split"),
    # Ends every rank of the world: recorded as the aborting rank's last call, never returns.
    _mpi("Abort", "group"),
)
OPS.update(MPI_OPS)
MPI_ABORT = f"{MPI_PREFIX}Abort"

# Collectives of one tensor (or none) and nothing else to agree on: faults.change(op=...) swaps them.
INTERCHANGEABLE = ("all_reduce", "broadcast", "reduce", "barrier")
# torch's collectives that take a reduce op (its parameter: Op.reduction).
REDUCING = tuple(name for name, o in OPS.items() if o.reduction and o.api == "torch")
# The reduce op's parameter in the c10d and the functional collectives' schemas.
BACKEND_REDUCTION = "reduce_op"
# What a torch.distributed function reduces with when given no op: SUM, for each of REDUCING.
DEFAULT_REDUCTION = "SUM"

# The names of the collectives, for passes over every call of a long run (faster than is_collective).
COLLECTIVES = frozenset(name for name, o in OPS.items() if o.is_collective)
# torch's sends and receives, each -> whether it receives, for the same passes.
TORCH_P2P = {name: o.direction == "recv" for name, o in OPS.items() if o.pairs and o.api == "torch"}

# The names code calls to send to one rank (torch's ``send``, mpi4py's ``Send``, ...): what a rank's
# code may still do for a peer that waits to receive.
SENDS = frozenset(o.method for o in OPS.values() if o.direction == "send")

# Collectives after which the tensors or lists passed to them hold the same on every rank.
AGREEING = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object",
            "broadcast_object_list")

INIT = "init_process_group"
NEW_GROUP = "new_group"
MONITORED_BARRIER = "monitored_barrier"
DESTROY = "destroy_process_group"
# The object collectives an adopted harness's own exchanges are recorded as (pytest_ddp.adopt).
BROADCAST_OBJECTS = "broadcast_object_list"
GATHER_OBJECTS = "all_gather_object"


def op(name: str) -> Op:
    """The operation of that name; every name the recorder writes is in the table."""
    return OPS[name]


@dataclass(frozen=True)
class BackendOp:
    """A ``c10d::`` dispatcher operation, through which every collective reaches a backend, or a
    functional collective's own; parameters named as in its schema."""

    op: str  # the table's name for what it does
    tensors: str | None  # the tensors described
    rank: str | None = None  # the root or peer, as a rank in the group; None: a receive from any source


BACKEND_OPS: dict[str, BackendOp] = {
    "allreduce_": BackendOp("all_reduce", "tensors"),
    "allreduce_coalesced_": BackendOp("all_reduce_coalesced", "tensors"),
    "allgather_": BackendOp("all_gather", "input_tensors"),
    "_allgather_base_": BackendOp("all_gather_into_tensor", "input_tensor"),
    "allgather_coalesced_": BackendOp("all_gather_coalesced", "input_list"),
    "allgather_into_tensor_coalesced_": BackendOp("all_gather_into_tensor_coalesced", "inputs"),
    "reduce_scatter_": BackendOp("reduce_scatter", "output_tensors"),
    "_reduce_scatter_base_": BackendOp("reduce_scatter_tensor", "input_tensor"),
    "reduce_scatter_tensor_coalesced_": BackendOp("reduce_scatter_tensor_coalesced", "inputs"),
    "alltoall_": BackendOp("all_to_all", "input_tensors"),
    "alltoall_base_": BackendOp("all_to_all_single", "input"),
    "broadcast_": BackendOp("broadcast", "tensors", "root_rank"),
    "reduce_": BackendOp("reduce", "tensors", "root_rank"),
    "gather_": BackendOp("gather", "input_tensors", "root_rank"),
    "gather_into_tensor_": BackendOp("gather_into_tensor", "input_tensor", "root_rank"),
    "scatter_": BackendOp("scatter", "output_tensors", "root_rank"),
    "barrier": BackendOp("barrier", None),
    "monitored_barrier_": BackendOp("monitored_barrier", None),
    "send": BackendOp("send", "tensors", "dst"),
    "recv_": BackendOp("recv", "tensors", "src"),
    "recv_any_source_": BackendOp("recv", "tensors"),
}

# The functional collectives (``_c10d_functional::``) recorded at their own operation, named as
# the torch.distributed function that does the same (not always the c10d operation it issues:
# all_gather_into_tensor issues allgather_into_tensor_coalesced_, which Gloo matches with
# _allgather_base_).  Others are recorded at the c10d operations they issue (see backend_hook).
FUNCTIONAL_OPS: dict[str, BackendOp] = {
    "all_reduce": BackendOp("all_reduce", "input"),
    "all_reduce_": BackendOp("all_reduce", "input"),
    "all_reduce_coalesced": BackendOp("all_reduce_coalesced", "inputs"),
    "all_reduce_coalesced_": BackendOp("all_reduce_coalesced", "inputs"),
    "all_gather_into_tensor": BackendOp("all_gather_into_tensor", "input"),
    "all_gather_into_tensor_out": BackendOp("all_gather_into_tensor", "input"),
    "all_gather_into_tensor_coalesced": BackendOp("all_gather_into_tensor_coalesced", "inputs"),
    "reduce_scatter_tensor": BackendOp("reduce_scatter_tensor", "input"),
    "reduce_scatter_tensor_out": BackendOp("reduce_scatter_tensor", "input"),
    "reduce_scatter_tensor_coalesced": BackendOp("reduce_scatter_tensor_coalesced", "inputs"),
    "all_to_all_single": BackendOp("all_to_all_single", "input"),
    "broadcast": BackendOp("broadcast", "input", "src"),
    "broadcast_": BackendOp("broadcast", "input", "src"),
    "isend": BackendOp("send", "tensor", "dst"),
    "irecv": BackendOp("recv", "tensor", "src"),
}
