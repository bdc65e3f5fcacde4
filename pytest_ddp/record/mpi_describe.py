"""An mpi4py call's communicator and arguments as :mod:`pytest_ddp.record.mpi_recorder` writes them, as
fragments of the ``call`` event's JSON."""

from __future__ import annotations

from typing import Any, NamedTuple

from mpi4py import MPI

from pytest_ddp.common.ops import Op
from pytest_ddp.common.protocol import NULL_PEER
from pytest_ddp.record.describe import optional_fields

_DTYPE_KINDS = {"f": "float", "i": "int", "u": "uint", "c": "complex"}
_FORMATS = {
    "b": "int8", "B": "uint8", "h": "int16", "H": "uint16", "i": "int32", "I": "uint32", "l": "int64",
    "L": "uint64", "q": "int64", "Q": "uint64", "e": "float16", "f": "float32", "d": "float64", "?": "bool",
}  # fmt: skip


def _datatype_name(datatype: MPI.Datatype) -> str:
    """``float64`` for MPI.DOUBLE (named as numpy and torch name it), else MPI's name."""
    kind, size = datatype.typestr[:1], datatype.typestr[1:]
    if kind == "b":
        return "bool"
    if kind in _DTYPE_KINDS and size.isdigit():
        return f"{_DTYPE_KINDS[kind]}{int(size) * 8}"
    return datatype.Get_name() or "derived"


def _data(value: Any) -> tuple[int, str, int] | None:
    """(count, element type, bytes) of a buffer argument; None for IN_PLACE or no buffer."""
    if value is None or value is MPI.IN_PLACE or value is MPI.BOTTOM:
        return None
    if isinstance(value, (list, tuple)):  # [data, MPI.DOUBLE], [data, count, MPI.DOUBLE], ...
        data = _data(value[0]) if value else None
        datatype = value[-1] if isinstance(value[-1], MPI.Datatype) else None
        if data is None or datatype is None:
            return data
        size = datatype.Get_size()
        count = value[1] if len(value) == 3 and isinstance(value[1], int) else data[2] // max(size, 1)
        return count, _datatype_name(datatype), count * size
    dtype = getattr(value, "dtype", None)
    if dtype is not None:  # numpy, torch, cupy, ...
        nbytes = int(value.nbytes)
        return nbytes // max(int(value.itemsize), 1), str(dtype).removeprefix("torch."), nbytes
    view = memoryview(value)
    return view.nbytes // max(view.itemsize, 1), _FORMATS.get(view.format, view.format), view.nbytes


def _buffer_fields(spec: Op, args: dict[str, Any], extra: dict[str, Any]) -> str:
    assert spec.tensors is not None
    value = args.get(spec.tensors)
    if value is MPI.IN_PLACE:  # the data is in the other buffer
        value = args.get("sendbuf" if spec.tensors == "recvbuf" else "recvbuf")
    data = _data(value)
    if data is None:
        return ""
    count, dtype, nbytes = data
    extra["bytes"] = nbytes
    return f',"shapes":[[{count}]],"dtypes":["{dtype}"]'


def _object_fields(obj: Any) -> str:
    """``,"obj_type":"dict","obj_size":123``: what a lower-case call pickles and sends."""
    try:
        size: int | None = len(MPI.pickle.dumps(obj))
    except Exception:  # the call raises the same, and that is recorded
        size = None
    return optional_fields({"obj_type": type(obj).__name__, "obj_size": size})


reductions: dict[int, str] = {}  # an MPI.Op's handle -> "SUM"; filled at install


def _reduction(op: Any) -> str:
    if isinstance(op, MPI.Op):
        return reductions.get(op.handle, "user-defined")
    return getattr(op, "__name__", type(op).__name__)  # a Python function given to reduce/allreduce


class Comm(NamedTuple):
    """A communicator as the event log shows it."""

    name: str  # "WORLD", or by creation order in the test: "1", "2.2" (a Split's part from world rank 2)
    ranks: list[int]  # the world rank of each of its ranks
    rank: int  # this process's rank in it
    text: str  # '"group":"1","ranks":[0,1]'
    test: int  # the test that named it

    def world(self, rank: int) -> int:
        """A communicator's rank as a world rank; MPI.PROC_NULL as NULL_PEER."""
        if rank == MPI.PROC_NULL:
            return NULL_PEER
        return self.ranks[rank] if 0 <= rank < len(self.ranks) else rank


# (the event's fields after "t", its sequence counter's key, whether it is an open receive)
Described = tuple[str, tuple[Any, ...], bool]


def collective(spec: Op, args: dict[str, Any], comm: Comm) -> Described:
    extra: dict[str, Any] = {}
    fields = ""
    root = None
    if spec.rank:
        root = args[spec.rank]
        fields += f',"root":{comm.world(root)}'
    if spec.tensors:
        fields += _buffer_fields(spec, args, extra)
    if spec.obj and (not spec.obj_from_root or root == comm.rank):
        fields += _object_fields(args[spec.obj])
    if spec.reduction:
        extra["op"] = _reduction(args[spec.reduction])
    return fields + optional_fields({"extra": extra}), (comm.name,), False


def p2p(spec: Op, args: dict[str, Any], comm: Comm) -> Described:
    assert spec.rank is not None and spec.tag is not None
    extra: dict[str, Any] = {}
    fields = _buffer_fields(spec, args, extra) if spec.tensors else ""
    if spec.obj:
        fields += _object_fields(args[spec.obj])
    given = args[spec.rank]
    peer = None if given == MPI.ANY_SOURCE else comm.world(given)
    if peer is not None:
        fields += f',"peer":{peer}'
    tag = args[spec.tag]
    if tag != MPI.ANY_TAG:
        fields += f',"tag":{tag}'
    open_ended = spec.direction == "recv" and not spec.probe and (peer is None or tag == MPI.ANY_TAG)
    if spec.recv_from and spec.recv_tag:  # Sendrecv: its receiving end
        source, recv_tag = args[spec.recv_from], args[spec.recv_tag]
        if source != MPI.ANY_SOURCE:
            extra["recv_from"] = comm.world(source)
        if recv_tag != MPI.ANY_TAG:
            extra["recv_tag"] = int(recv_tag)
        open_ended = source == MPI.ANY_SOURCE or recv_tag == MPI.ANY_TAG
    key = (comm.name, spec.direction or spec.name, peer)
    return fields + optional_fields({"extra": extra}), key, open_ended
