"""An mpi4py call's arguments as :mod:`pytest_ddp.record.mpi_recorder` writes them, as JSON text."""

from __future__ import annotations

import json
from typing import Any

from mpi4py import MPI

from pytest_ddp.common.ops import Op

encode = json.JSONEncoder(separators=(",", ":")).encode

_DTYPE_KINDS = {"f": "float", "i": "int", "u": "uint", "c": "complex"}
_dtype_names: dict[Any, str] = {}  # numpy's or torch's dtype, or an MPI datatype's handle -> "float64"
_FORMATS = {
    "b": "int8", "B": "uint8", "h": "int16", "H": "uint16", "i": "int32", "I": "uint32", "l": "int64",
    "L": "uint64", "q": "int64", "Q": "uint64", "e": "float16", "f": "float32", "d": "float64", "?": "bool",
}  # fmt: skip


def _datatype_name(datatype: MPI.Datatype) -> str:
    """``float64`` for MPI.DOUBLE (named as numpy and torch name it), else MPI's name."""
    name = _dtype_names.get(datatype.handle)
    if name is None:
        typestr = datatype.typestr
        kind, size = typestr[:1], typestr[1:]
        if kind == "b":
            name = "bool"
        elif kind in _DTYPE_KINDS and size.isdigit():
            name = f"{_DTYPE_KINDS[kind]}{int(size) * 8}"
        else:
            name = datatype.Get_name() or "derived"
        _dtype_names[datatype.handle] = name
    return name


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
        name = _dtype_names.get(dtype)
        if name is None:
            name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
        nbytes = int(value.nbytes)
        return nbytes // max(int(value.itemsize), 1), name, nbytes
    view = memoryview(value)
    return view.nbytes // max(view.itemsize, 1), _FORMATS.get(view.format, view.format), view.nbytes


def buffer_fields(spec: Op, args: dict[str, Any], extra: list[str]) -> str:
    assert spec.tensors is not None
    value = args.get(spec.tensors)
    if value is MPI.IN_PLACE:  # the data is in the other buffer
        value = args.get("sendbuf" if spec.tensors == "recvbuf" else "recvbuf")
    data = _data(value)
    if data is None:
        return ""
    count, dtype, nbytes = data
    extra.append(f'"bytes":{nbytes}')
    return f',"shapes":[[{count}]],"dtypes":["{dtype}"]'


def object_fields(obj: Any) -> str:
    """``,"obj_type":"dict","obj_size":123``: what a lower-case call pickles and sends."""
    try:
        size: int | None = len(MPI.pickle.dumps(obj))
    except Exception:  # the call raises the same, and that is recorded
        size = None
    text = f',"obj_type":{encode(type(obj).__name__)}'
    return text if size is None else f'{text},"obj_size":{size}'


reductions: dict[int, str] = {}  # an MPI.Op's handle -> '"SUM"' (JSON); filled at install


def reduction(op: Any) -> str:
    """The reduction's name, as JSON."""
    if isinstance(op, MPI.Op):
        return reductions.get(op.handle, '"user-defined"')
    return encode(getattr(op, "__name__", type(op).__name__))  # a Python function given to reduce/allreduce


def extra_text(extra: list[str]) -> str:
    """``,"extra":{...}`` of its members, written as JSON."""
    return f',"extra":{{{",".join(extra)}}}' if extra else ""
