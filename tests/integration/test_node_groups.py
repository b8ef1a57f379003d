"""Shard groups over part of the ranks (node groups) and with replicas.

A node group serves the local data-parallel ranks of one node of a
multi-node job; replicas are the model-parallel ranks of one data-parallel
replica, which must receive byte-identical batches. Real loaderxd, real
stores; the members are driven round-robin from one thread (the daemon's
skew window lets each run ahead by a few steps).
"""

from __future__ import annotations

import pytest
from conftest import assert_same_batch
from loaderx import connect
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.errors import InvalidArgumentError
from loaderx.zsampler import Sampler

Mode = Sampler.Mode
B = 5
SEED = 11


def embedded(streams, rank: int, world: int, steps: int, start: int = 0) -> list[dict]:
    with DataLoader(streams, batch_size=B, mode=Mode.Cyclic, seed=SEED, rank=rank,
                    world_size=world, start_step=start) as loader:
        return [next(loader) for _ in range(steps)]


def member(streams, sock: str, group: str, rank: int, world: int, *, ranks=None, replicas=1,
           start: int = 0) -> DataLoader:
    opts = DaemonOptions(sock, group=group, group_mode="shard", ranks=ranks, replicas=replicas)
    return DataLoader(streams, batch_size=B, mode=Mode.Cyclic, seed=SEED, rank=rank,
                      world_size=world, start_step=start, daemon=opts)


def round_robin(loaders: list[DataLoader], steps: int, daemon=None) -> tuple[list[list[dict]], dict | None]:
    """`steps` batches of every member, taken in turns; then the daemon's status; then all closed."""
    got: list[list[dict]] = [[] for _ in loaders]
    try:
        for _ in range(steps):
            for i, loader in enumerate(loaders):
                got[i].append(next(loader))
        return got, None if daemon is None else connect(daemon.socket).stats()
    finally:
        for loader in loaders:
            loader.close()


def test_two_node_groups_of_a_world_of_four_serve_each_rank_its_embedded_batches(
    daemon_factory, stores
) -> None:
    d = daemon_factory("--max-skew", "3")
    s = stores["streams"]
    steps = 9
    loaders = [member(s, d.socket, f"job-node{r // 2}", r, 4, ranks=range(r // 2 * 2, r // 2 * 2 + 2))
               for r in range(4)]
    got, status = round_robin(loaders, steps, d)
    assert status is not None
    for r in range(4):
        for a, b in zip(got[r], embedded(s, r, 4, steps)):
            assert_same_batch(a, b)
    groups = {g["name"]: g for g in status["named_groups"]}
    assert [(groups[n]["ranks_first"], groups[n]["ranks_count"], groups[n]["replicas"])
            for n in ("job-node0", "job-node1")] == [(0, 2, 1), (2, 2, 1)]
    assert sorted(m["rank"] for m in groups["job-node1"]["members"]) == [2, 3]
    # Each node's ring holds batches of its own two ranks' rows only.
    with DataLoader(s, batch_size=B, mode=Mode.Cyclic, seed=SEED, rank=0, world_size=4,
                    daemon=DaemonOptions(d.socket, group="whole", group_mode="shard")) as whole:
        assert whole is not None
        whole_ring = {g["name"]: g for g in connect(d.socket).stats()["named_groups"]}["whole"]["ring_bytes"]
    assert groups["job-node0"]["ring_bytes"] < whole_ring


def test_replicas_of_a_rank_receive_byte_identical_batches_from_the_same_step(
    daemon_factory, stores
) -> None:
    d = daemon_factory("--max-skew", "3")
    s = stores["streams"]
    steps = 7
    # world 2 (data-parallel), 2 replicas per rank (tensor-parallel size 2).
    loaders = [member(s, d.socket, "tp", r // 2, 2, replicas=2, start=4) for r in range(4)]
    got, _ = round_robin(loaders, steps)
    for r in range(4):
        want = embedded(s, r // 2, 2, steps, start=4)
        for a, b in zip(got[r], want):
            assert_same_batch(a, b)
    for a, b in zip(got[0], got[1]):  # the two replicas of rank 0
        for name in ("image", "label"):
            assert a[name].tobytes() == b[name].tobytes()


def test_a_third_member_of_a_rank_with_two_replicas_is_refused(daemon_factory, stores) -> None:
    d = daemon_factory()
    s = stores["streams"]
    a = member(s, d.socket, "tp", 0, 2, replicas=2)
    b = member(s, d.socket, "tp", 0, 2, replicas=2)
    try:
        with pytest.raises(InvalidArgumentError, match=r"rank 0 of 2 is already taken by sessions .*replicas 2"):
            member(s, d.socket, "tp", 0, 2, replicas=2)
    finally:
        a.close()
        b.close()


def test_replicas_that_start_at_different_steps_are_refused_naming_both(daemon_factory, stores) -> None:
    d = daemon_factory()
    s = stores["streams"]
    a = member(s, d.socket, "tp", 1, 2, replicas=2, start=10)
    try:
        with pytest.raises(InvalidArgumentError,
                           match=r"rank 1 replica 1 would start at step 12, but rank 1 replica 0 "
                                 r"\(pid \d+\) started at step 10"):
            member(s, d.socket, "tp", 1, 2, replicas=2, start=12)
    finally:
        a.close()


@pytest.mark.parametrize(
    ("rank", "ranks", "match"),
    [
        (1, range(1, 3), r"ranks 1\.\.2 .* are not an aligned part of world_size 4"),
        (0, range(3), r"ranks 0\.\.2 .* are not an aligned part of world_size 4"),
        (3, range(2), r"rank 3 is not one of this group's ranks 0\.\.1"),
        (0, range(2, 6), r"ranks 2\.\.5 .* are not ranks of world_size 4"),
    ],
)
def test_a_rank_range_that_does_not_fit_the_world_is_refused_naming_it(
    daemon, stores, rank: int, ranks: range, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        member(stores["streams"], daemon.socket, "bad", rank, 4, ranks=ranks)


@pytest.mark.parametrize("first", ["creator", "joiner"])
@pytest.mark.parametrize(
    ("field", "mine", "theirs", "match"),
    [
        ("ranks", range(2), None, r"ranks 0\.\.1 differs from the group's 0\.\.3"),
        ("replicas", 2, 1, r"replicas 2 differs from the group's 1"),
    ],
)
def test_members_that_differ_in_ranks_or_replicas_are_refused_naming_the_field(
    daemon, stores, first: str, field: str, mine, theirs, match: str
) -> None:
    s = stores["streams"]
    kw_joiner = {field: mine}
    kw_creator = {field: theirs} if theirs is not None else {}
    if first == "joiner":  # the other order: the group has the joiner's spec
        kw_joiner, kw_creator = kw_creator, kw_joiner
        match = match.replace("0\\.\\.1 differs from the group's 0\\.\\.3",
                              "0\\.\\.3 differs from the group's 0\\.\\.1")
        match = match.replace("replicas 2 differs from the group's 1",
                              "replicas 1 differs from the group's 2")
    creator = member(s, daemon.socket, "g", 0, 4, **kw_creator)
    try:
        with pytest.raises(InvalidArgumentError, match=match):
            member(s, daemon.socket, "g", 1, 4, **kw_joiner)
    finally:
        creator.close()


def test_ranks_and_replicas_need_a_shard_group() -> None:
    with pytest.raises(InvalidArgumentError, match="for shard groups"):
        DaemonOptions("/nonexistent", group="g", group_mode="broadcast", replicas=2)
    with pytest.raises(InvalidArgumentError, match="for shard groups"):
        DaemonOptions("/nonexistent", ranks=range(2))
    with pytest.raises(TypeError, match="ranks must be a range"):
        DaemonOptions("/nonexistent", group="g", ranks=[0, 1])
    # The engine's rule (LoaderSpec::ValidateOptions), named as Python writes the range.
    with pytest.raises(InvalidArgumentError,
                       match=r"^ranks must be a range of consecutive ranks, got range\(0, 4, 2\)$"):
        DaemonOptions("/nonexistent", group="g", ranks=range(0, 4, 2))
    with pytest.raises(InvalidArgumentError, match=r"got range\(3, 0, -1\)$"):
        DaemonOptions("/nonexistent", ranks=range(3, 0, -1))


def test_replicas_resumed_by_load_state_dict_before_next_start_together(daemon_factory, stores) -> None:
    # Construct, then load_state_dict before the first next(), member by
    # member: the first moves the group; the others join "not started" at
    # their constructor's step 0 and move to the checkpoint themselves.
    d = daemon_factory("--max-skew", "3")
    s = stores["streams"]
    with DataLoader(s, batch_size=B, mode=Mode.Cyclic, seed=SEED, rank=0, world_size=2) as src:
        for _ in range(5):
            next(src)
        state = src.state_dict()
    loaders = []
    for r in range(4):
        loaders.append(member(s, d.socket, "tp", r // 2, 2, replicas=2))
        loaders[-1].load_state_dict(state)
    steps = 6
    got, _ = round_robin(loaders, steps)
    for r in range(4):
        for a, b in zip(got[r], embedded(s, r // 2, 2, steps, start=5), strict=True):
            assert_same_batch(a, b)


def test_a_not_started_replica_seeking_elsewhere_than_its_replica_is_refused(daemon_factory, stores) -> None:
    d = daemon_factory()
    s = stores["streams"]
    a = member(s, d.socket, "tp", 1, 2, replicas=2)
    a.seek(10)  # alone: moves the group
    b = member(s, d.socket, "tp", 1, 2, replicas=2)  # at 0: not started
    try:
        assert b.step == 0
        with pytest.raises(InvalidArgumentError,
                           match=r"rank 1 replica 1 would start at step 12, but rank 1 replica 0 "
                                 r"\(pid \d+\) started at step 10"):
            b.seek(12)
        b.seek(10)
        with DataLoader(s, batch_size=B, mode=Mode.Cyclic, seed=SEED, rank=1, world_size=2,
                        start_step=10) as local:
            want = next(local)
            assert_same_batch(next(a), want)
            assert_same_batch(next(b), want)
    finally:
        a.close()
        b.close()
