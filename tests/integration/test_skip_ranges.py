"""Skipped step ranges through a real loaderxd: solo loaders and group members.

Every member of a group applies its own ranges by seeking its own position
(docs/guide.md, "Skipping steps"); the batches must equal the embedded
loader's with the same ranges, and the group must not gather the skipped steps.
"""

from __future__ import annotations

import threading

import pytest
from conftest import assert_same_batch
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader

SKIP = [(0, 2), (5, 9), (9, 12), (20, 220)]  # merged: (0, 2), (5, 12), (20, 220)
STEPS = [2, 3, 4, 12, 13, 14, 15, 16, 17, 18, 19, 220, 221]


def copy_batch(batch: dict) -> dict:
    return {k: [t.copy() for t in v] if isinstance(v, list) else v.copy() for k, v in batch.items()}


def run(loader: DataLoader, k: int) -> tuple[list[int], list[dict]]:
    steps, batches = [], []
    for _ in range(k):
        steps.append(loader.step)
        batches.append(copy_batch(next(loader)))
    return steps, batches


@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_a_daemon_loader_skips_exactly_as_the_embedded_one(daemon, stores, transform) -> None:
    s = stores["streams"]
    with DataLoader(s, batch_size=8, seed=3, skip=SKIP, transform=transform) as local:
        want_steps, want = run(local, len(STEPS))
    assert want_steps == STEPS
    with DataLoader(s, batch_size=8, seed=3, skip=SKIP, transform=transform,
                    daemon=DaemonOptions(daemon.socket)) as remote:
        got_steps, got = run(remote, len(STEPS))
        state = remote.state_dict()
    assert got_steps == STEPS
    for g, w in zip(got, want):
        assert_same_batch(g, w)
    # One seek per range: the daemon fetched the delivered steps, the one
    # pushed ahead before each seek, and those fetched ahead at the end (the
    # transform window, one pushed ahead) -- none of the 200 of (20, 220).
    stats = daemon.wait_stat("loaders", 0)
    assert stats["batches_gathered"] <= len(STEPS) + 10, stats
    # The state resumes on the other host: embedded state, daemon loader and back.
    assert state["skip"] == [[0, 2], [5, 12], [20, 220]] and state["step"] == 222
    with DataLoader(s, batch_size=8, seed=3, daemon=DaemonOptions(daemon.socket)) as resumed, \
            DataLoader(s, batch_size=8, seed=3, start_step=19) as local:
        resumed.load_state_dict({**state, "step": 19})
        assert resumed.step == 19
        assert_same_batch(next(resumed), next(local))
        assert resumed.step == 220
        resumed.skip(222, 230)
        assert run(resumed, 2)[0] == [220, 221]
        assert resumed.step == 230


def test_runtime_skip_through_the_daemon_drops_the_batch_pushed_ahead(daemon, stores) -> None:
    s = stores["streams"]
    with DataLoader(s, batch_size=8, seed=3, daemon=DaemonOptions(daemon.socket)) as remote, \
            DataLoader(s, batch_size=8, seed=3) as local:
        assert run(remote, 3)[0] == [0, 1, 2]
        remote.skip(3, 6)
        remote.skip(7, 8)
        steps, got = run(remote, 3)
        assert steps == [6, 8, 9]
        for step, g in zip(steps, got):
            local.seek(step)
            assert_same_batch(g, next(local))


@pytest.mark.parametrize("mode", ["shard", "broadcast"])
def test_group_members_skipping_the_same_ranges_get_their_embedded_batches(
    daemon_factory, stores, mode: str
) -> None:
    # Two members, each on its own thread, in lockstep as DDP ranks are (a
    # barrier after every step stands for the all-reduce). Each seeks its
    # own position past every range; in a shard group each gets its rank's
    # rows, in a broadcast group both get the full batches.
    daemon = daemon_factory("--max-skew", "3")
    s = stores["streams"]
    world = 2 if mode == "shard" else 1
    opts = DaemonOptions(daemon.socket, group="g", group_mode=mode, group_timeout=30,
                         join="start_step")
    barrier = threading.Barrier(2, timeout=60)
    got: dict[int, tuple[list[int], list[dict]]] = {}
    errors: list[BaseException] = []

    def member(r: int) -> None:
        try:
            with DataLoader(s, batch_size=4, seed=9, rank=r % world, world_size=world,
                            daemon=opts, skip=SKIP) as loader:
                if mode == "broadcast":  # it keeps steps for its members only: both join first
                    barrier.wait()
                steps, batches = [], []
                for _ in STEPS:
                    steps.append(loader.step)
                    batches.append(copy_batch(next(loader)))
                    barrier.wait()
                got[r] = steps, batches
        except BaseException as e:  # noqa: BLE001 - reported by the test
            barrier.abort()
            errors.append(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for r in range(2):
        steps, batches = got[r]
        assert steps == STEPS
        with DataLoader(s, batch_size=4, seed=9, rank=r % world, world_size=world,
                        skip=SKIP) as local:
            for step, batch in zip(steps, batches):
                assert local.step == step
                assert_same_batch(batch, next(local))
    # The group skipped (20, 220) by re-seeking its pipeline once both
    # members had moved past it: it gathered (about) the delivered steps only.
    stats = daemon.wait_stat("groups", 0)
    assert stats["batches_gathered"] <= len(STEPS) + 4, stats


def test_members_driven_in_turn_from_one_thread_time_out_loudly_at_a_range(
    daemon_factory, stores
) -> None:
    # The first member past a range longer than the skew waits for its peer,
    # which this thread has not called yet: GroupTimeoutError naming the
    # peer and step, never a hang. Nothing is consumed; once the peer has
    # moved past the range too, the first goes on with the right batch.
    from loaderx.errors import GroupTimeoutError

    daemon = daemon_factory("--max-skew", "2")
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="g", group_mode="shard", group_timeout=1)
    skip = [(3, 40)]
    with DataLoader(s, batch_size=4, seed=2, rank=0, world_size=2, daemon=opts, skip=skip) as a, \
            DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, daemon=opts, skip=skip) as b, \
            DataLoader(s, batch_size=4, seed=2, rank=0, world_size=2, start_step=40) as local:
        for _ in range(3):
            next(a), next(b)
        with pytest.raises(GroupTimeoutError, match=r"for step 40, which needs rank 1 .*at step 3"):
            next(a)
        assert a.step == 40
        assert b.step == 40 and next(b)["label"].shape == (4,)
        assert_same_batch(next(a), next(local))
