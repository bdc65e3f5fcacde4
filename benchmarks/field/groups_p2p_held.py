"""Groups and point-to-point, held out (the fifth set): a pipeline's last-to-first token send made
when the pipeline has one stage, so each rank sends to itself."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="pp_token_send_to_itself_with_one_stage",
        url="https://github.com/pytorch/torchchat/pull/1149",
        summary="dist_run.py sends each new token from the last pipeline rank to the first; with one "
        "pipeline stage (pp=1, tp=2) the last rank is the first, so every rank sends to itself (the "
        "fix: the send and recv only when first_pp_rank != last_pp_rank)",
        world_size=2,
        body="""\
pp_degree, tp_degree = 1, 2
mesh = init_device_mesh("cpu", (pp_degree, tp_degree), mesh_dim_names=("pp", "tp"))
pp_group = mesh.get_group("pp")
pp_rank = pp_group.rank()
first_pp_rank, last_pp_rank = 0, pp_degree - 1
new_token = torch.tensor([42])
if pp_rank == last_pp_rank:
    dist.send(new_token, dst=dist.get_global_rank(pp_group, first_pp_rank), group=pp_group)  # <- culprit line
elif pp_rank == first_pp_rank:
    dist.recv(new_token, src=dist.get_global_rank(pp_group, last_pp_rank), group=pp_group)
""",
        twin="""\
pp_degree, tp_degree = 1, 2
mesh = init_device_mesh("cpu", (pp_degree, tp_degree), mesh_dim_names=("pp", "tp"))
pp_group = mesh.get_group("pp")
pp_rank = pp_group.rank()
first_pp_rank, last_pp_rank = 0, pp_degree - 1
new_token = torch.tensor([42])
if pp_rank == last_pp_rank and pp_rank != first_pp_rank:  # only between two distinct stages
    dist.send(new_token, dst=dist.get_global_rank(pp_group, first_pp_rank), group=pp_group)
elif pp_rank == first_pp_rank and pp_rank != last_pp_rank:
    dist.recv(new_token, src=dist.get_global_rank(pp_group, last_pp_rank), group=pp_group)
""",
        kind="failed",
        culprits=(0, 1),
        op="send",
        held_out=True,
    ),
]
