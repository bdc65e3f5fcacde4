"""Object collectives, held out (the fifth set): objects gathered through a buffer of fixed size,
which one rank's object outgrows."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="all_gather_list_object_outgrows_fixed_buffer",
        url="https://github.com/facebookresearch/ParlAI/pull/3291",
        summary="all_gather_list pickles each worker's object into a slot of a fixed-size buffer and "
        "all-reduces it; a worker whose object is larger raises 'encoded data exceeds max_size' while "
        "the others wait in the all-reduce (the fix: sync the sizes first, then the buffer)",
        world_size=2,
        body="""\
import pickle


def all_gather_list(data, max_size=16384):  # parlai.utils.distributed before #3291
    buffer = torch.zeros(max_size * world_size, dtype=torch.uint8)
    enc = list(pickle.dumps(data))
    enc_size = len(enc)
    if enc_size + 2 > max_size:
        raise ValueError(f"encoded data exceeds max_size: {enc_size}")  # <- culprit line
    start = rank * max_size
    buffer[start] = enc_size // 255
    buffer[start + 1] = enc_size % 255
    buffer[start + 2 : start + enc_size + 2] = torch.tensor(enc, dtype=torch.uint8)
    dist.all_reduce(buffer)
    result = []
    for i in range(world_size):
        out = buffer[i * max_size : (i + 1) * max_size]
        size = 255 * out[0].item() + out[1].item()
        result.append(pickle.loads(bytes(out[2 : size + 2].tolist())))
    return result


texts = [f"generated response {i}" for i in range(2000 if rank == 1 else 1)]  # rank 1 logged its texts
metrics = {"ppl": 12.5, "texts": texts}
gathered = all_gather_list(metrics)
""",
        twin="""\
import pickle


def all_gather_list(data):  # #3291: the sizes synced first, then a buffer of the largest size
    enc = list(pickle.dumps(data))
    sizes = torch.zeros(world_size, dtype=torch.long)
    sizes[rank] = len(enc)
    dist.all_reduce(sizes)
    max_size = int(sizes.max())
    buffer = torch.zeros(max_size * world_size, dtype=torch.uint8)
    start = rank * max_size
    buffer[start : start + len(enc)] = torch.tensor(enc, dtype=torch.uint8)
    dist.all_reduce(buffer)
    result = []
    for i in range(world_size):
        out = buffer[i * max_size : i * max_size + int(sizes[i])]
        result.append(pickle.loads(bytes(out.tolist())))
    return result


texts = [f"generated response {i}" for i in range(2000 if rank == 1 else 1)]
metrics = {"ppl": 12.5, "texts": texts}
gathered = all_gather_list(metrics)
assert len(gathered[1]["texts"]) == 2000
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
        held_out=True,
    ),
]
