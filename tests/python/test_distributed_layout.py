"""loaderx.distributed: the job layout read from torchrun's and Slurm's environment."""

from __future__ import annotations

import warnings

import pytest
from loaderx.distributed import Layout, check_loader_layout, layout, node_daemon_options
from loaderx.errors import InvalidArgumentError

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "TORCHELASTIC_RUN_ID": "run17"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)",
         "SLURM_NODEID": "1", "SLURM_JOB_ID": "991"}


@pytest.mark.parametrize(("env", "launcher", "job"), [(TORCHRUN, "torchrun", "run17"), (SLURM, "slurm", "991")])
def test_the_layout_comes_from_the_launcher(env, launcher: str, job: str) -> None:
    lay = layout(environ=env)
    assert lay == Layout(5, 8, 1, 4, 1, 2, job, launcher, 1)
    assert (lay.dp_rank, lay.dp_world_size, lay.replica, lay.node_dp_ranks) == (5, 8, 0, range(4, 8))
    tp = layout(model_parallel_size=2, environ=env)
    assert (tp.dp_rank, tp.dp_world_size, tp.replica, tp.node_dp_ranks) == (2, 4, 1, range(2, 4))


def test_node_daemon_options_name_the_node_group_of_the_job() -> None:
    opts = node_daemon_options(layout(model_parallel_size=2, environ=TORCHRUN), path="/s")
    assert (opts.path, opts.group, opts.group_mode, opts.ranks, opts.replicas) == (
        "/s", "run17-node1-of2-mp2", "shard", range(2, 4), 2)


def test_no_launcher_is_one_process() -> None:
    assert layout(environ={}) == Layout(0, 1, 0, 1, 0, 1, "", "none", 1)


@pytest.mark.parametrize(
    ("env", "mp", "match"),
    [
        (TORCHRUN, 3, r"model_parallel_size 3 does not divide the 4 processes of a node"),
        (dict(TORCHRUN, RANK="6"), 1, r"global rank 6 is not node 1 x 4 \+ local rank 1"),
        (dict(TORCHRUN, WORLD_SIZE="6"), 1, r"world_size 6 is not 1 nodes x 4 processes"),
        (dict(SLURM, SLURM_NTASKS_PER_NODE="4,2"), 1, r"nodes run different numbers of tasks"),
        (dict(TORCHRUN, RANK="x"), 1, r"\$RANK='x' is not an integer"),
        (TORCHRUN, 0, r"model_parallel_size must be an int >= 1"),
    ],
)
def test_a_layout_node_groups_cannot_serve_is_refused_naming_it(env, mp: int, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        layout(model_parallel_size=mp, environ=env)


@pytest.mark.parametrize(("rank", "world", "warns"), [(5, 8, False), (2, 4, False), (0, 1, False),
                                                      (4, 8, True), (1, 3, True), (1, 4, True)])
def test_a_loader_that_disagrees_with_the_launcher_warns_naming_both(rank: int, world: int, warns: bool) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_loader_layout(rank, world, environ=TORCHRUN)
    assert len(caught) == (1 if warns else 0)
    if warns:
        msg = str(caught[0].message)
        assert f"DataLoader(rank={rank}, world_size={world})" in msg and "$RANK=5, $WORLD_SIZE=8" in msg
