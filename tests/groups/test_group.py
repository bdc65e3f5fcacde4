"""A rank group's pure parts (groups/group.py), without starting a rank: the torchrun environment
each rank gets from where the group placed it."""

from __future__ import annotations

from pathlib import Path

from pytest_ddp.groups.group import GroupConfig, RankGroup


class PlacedGroup(RankGroup):
    """A group of 5 ranks on three nodes, numbered as a launcher might: 7, 7, 3, 3, 9."""

    NODES = (7, 7, 3, 3, 9)

    def place(self, rank: int) -> tuple[int, int]:
        node = self.NODES[rank]
        return node, self.NODES[:rank].count(node)


def test_each_ranks_torchrun_environment_says_its_node_in_the_order_of_their_first_ranks(
    tmp_path: Path,
) -> None:
    group = PlacedGroup(GroupConfig(5, "gloo", init=True, pg_timeout=60.0, workdir_parent=str(tmp_path)))
    try:
        keys = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_PORT")
        environments = [group.torchrun_environment(rank, 29500) for rank in range(5)]
        assert [tuple(env[key] for key in keys) for env in environments] == [
            ("0", "0", "2", "0", "3", "29500"),
            ("1", "1", "2", "0", "3", "29500"),
            ("2", "0", "2", "1", "3", "29500"),
            ("3", "1", "2", "1", "3", "29500"),
            ("4", "0", "1", "2", "3", "29500"),
        ]
        assert {env["TORCHELASTIC_RUN_ID"] for env in environments} == {group.run_id}
    finally:
        group.kill()
