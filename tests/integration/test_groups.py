"""loaderxd groups end to end: several processes sharing one pipeline.

A real daemon process, real sockets, real stores; shard members run in their
own Python processes, as DDP ranks would (docs/daemon.md, "Groups").
"""

from __future__ import annotations

import gc
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_batch
from loaderx import client as lxclient
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zsampler import Sampler

Mode = Sampler.Mode
SKEW = 3


def copy_batch(batch: dict) -> dict:
    return {k: [t.copy() for t in v] if isinstance(v, list) else v.copy() for k, v in batch.items()}


# One DDP rank: takes `steps` batches from the shard group and pickles copies.
RANK = textwrap.dedent(
    """
    import pickle, sys
    from loaderx.zrecord import Dense, Ragged
    from loaderx.dataloader import DataLoader
    from loaderx.client import DaemonOptions
    from loaderx.zsampler import Sampler
    sock, root, rank, world, steps, out, go = sys.argv[1:8]
    s = {"image": Dense.open(root + "/images"), "label": Dense.open(root + "/labels"),
         "tokens": Ragged.open(root + "/tokens")}
    opts = DaemonOptions(sock, group="ddp", group_mode="shard")
    got = []
    with DataLoader(s, batch_size=6, mode=Sampler.Mode.Cyclic, seed=9, rank=int(rank),
                    world_size=int(world), daemon=opts) as loader:
        for _ in range(int(steps)):
            b = next(loader)
            got.append({k: [t.copy() for t in v] if isinstance(v, list) else v.copy()
                        for k, v in b.items()})
        del b
        with open(out, "wb") as f:
            pickle.dump(got, f)
        # Stay a member until the test has read the settled stats.
        import os, time
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
    """
)


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


@pytest.mark.parametrize("world", [2, 3])
def test_shard_ranks_in_separate_processes_get_the_embedded_rank_batches(
    daemon_factory, stores, tmp_path: Path, world: int
) -> None:
    daemon = daemon_factory("--max-skew", str(SKEW))
    steps = 12
    outs = [tmp_path / f"rank{r}.pkl" for r in range(world)]
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, daemon.socket, str(stores["dir"]), str(r), str(world),
             str(steps), str(outs[r]), str(go)],
            env=env(),
        )
        for r in range(world)
    ]
    # Every rank took its 12 and is still a member: the pushes settle where
    # the rule puts them, each rank one batch (the push window) beyond its 12:
    # one global batch per step, 1 ahead.
    s = daemon.wait_stat("batches_served", steps * world, timeout=60)
    assert s["batches_served"] == steps * world
    time.sleep(0.1)
    s = daemon.wait_stat("batches_gathered", steps + 1)
    assert s["batches_gathered"] == steps + 1
    go.touch()
    for p in procs:
        assert p.wait(timeout=120) == 0
    for r in range(world):
        got = pickle.loads(outs[r].read_bytes())
        with DataLoader(stores["streams"], batch_size=6, mode=Mode.Cyclic, seed=9, rank=r,
                        world_size=world) as local:
            for step in range(steps):
                assert_same_batch(got[step], next(local))
    s = daemon.wait_stat("groups", 0)
    assert s["batches_gathered"] == steps + 1
    assert s["batches_served"] == steps * world
    assert s["groups"] == 0 and s["ring_bytes"] == 0  # the last rank closed the group


def test_broadcast_members_get_equal_arrays_from_one_gather(daemon, stores) -> None:
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast")
    members = [DataLoader(s, batch_size=8, mode=Mode.IID, seed=4, daemon=opts) for _ in range(3)]
    try:
        stats = daemon.stats()
        assert stats["groups"] == 1 and stats["group_members"] == 3 and stats["loaders"] == 3
        ring = stats["ring_bytes"]
        with DataLoader(s, batch_size=8, mode=Mode.IID, seed=4) as local:
            for _ in range(10):
                want = next(local)
                got = [next(m) for m in members]
                for g in got:
                    assert_same_batch(g, want)
                # All members view one slot; a write stays in the writer's copy.
                got[0]["image"][:] = 0
                got[0]["tokens"][0][:] = 0
                for g in got[1:]:
                    assert_same_batch(g, want)
        # Once per step, not once per member: the 10 consumed and the one
        # pushed ahead of them (the push window).
        stats = daemon.wait_stat("batches_gathered", 11)
        assert stats["batches_gathered"] == 11
        assert daemon.wait_stat("batches_served", 30)["batches_served"] == 30
        assert stats["ring_bytes"] == ring == stats["uid_ring_bytes"]  # one ring, charged once
    finally:
        for m in members:
            m.close()
    assert daemon.wait_stat("groups", 0)["groups"] == 0
    assert daemon.stats()["ring_bytes"] == ring  # the last step's arrays still view it
    del got, g
    assert daemon.wait_stat("ring_bytes", 0)["ring_bytes"] == 0


def test_late_broadcast_member_starts_at_the_group_step(daemon, stores) -> None:
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast")
    with DataLoader(s, batch_size=8, seed=4, daemon=opts) as first:
        for _ in range(5):
            next(first)
        with DataLoader(s, batch_size=8, seed=4, daemon=opts) as late:
            assert late.step == 5 and late.state_dict()["step"] == 5
            with DataLoader(s, batch_size=8, seed=4, start_step=5) as local:
                assert_same_batch(next(late), next(local))
        gone = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast",
                             join="start_step")
        with pytest.raises(IndexError, match="oldest step it still holds is 5"):
            DataLoader(s, batch_size=8, seed=4, start_step=2, daemon=gone)


def test_explicit_broadcast_start_step_is_honoured_or_refused_never_ignored(daemon_factory, stores) -> None:
    # The resumed member runs 4 steps ahead of the first, which stays put:
    # within --max-skew, but past the default live bound of 2 batches, at
    # which it would wait for the first to move (test_group_memory.py).
    daemon = daemon_factory("--group-live-batches", "0")
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast")
    with DataLoader(s, batch_size=8, seed=4, daemon=opts) as first:
        for _ in range(5):
            next(first)
        # A resumed trainer joining the running sweep at its checkpoint's step.
        with DataLoader(s, batch_size=8, seed=4, start_step=9, daemon=opts) as resumed, \
                DataLoader(s, batch_size=8, seed=4, start_step=9) as local:
            assert resumed.step == 9
            for _ in range(3):
                assert_same_batch(next(resumed), next(local))
        # A step the group has dropped: refused naming the oldest it holds.
        with pytest.raises(IndexError, match="oldest step it still holds is 5"):
            DataLoader(s, batch_size=8, seed=4, start_step=2, daemon=opts)
        current = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast", join="current")
        with pytest.raises(ValueError, match="start_step=7 and join='current' contradict"):
            DataLoader(s, batch_size=8, seed=4, start_step=7, daemon=current)
        assert next(first)["label"].shape == (8,)  # the group goes on


def test_mismatched_member_and_taken_rank_are_value_errors(daemon, stores) -> None:
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="ddp")
    with DataLoader(s, batch_size=4, rank=0, world_size=2, daemon=opts):
        with pytest.raises(ValueError, match="batch_size 8 differs from the group's 4"):
            DataLoader(s, batch_size=8, rank=1, world_size=2, daemon=opts)
        with pytest.raises(ValueError, match="rank 0 of 2 is already taken"):
            DataLoader(s, batch_size=4, rank=0, world_size=2, daemon=opts)


def test_a_rank_reopened_while_its_old_member_closes_waits_for_it_then_joins(daemon, stores) -> None:
    import threading
    import time

    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="ddp")
    old = DataLoader(s, batch_size=4, seed=3, rank=1, world_size=2, daemon=opts)
    joined: list[DataLoader] = []
    opener = threading.Thread(target=lambda: joined.append(
        DataLoader(s, batch_size=4, seed=3, rank=1, world_size=2, daemon=opts)))
    opener.start()
    time.sleep(0.2)  # the open waits inside the daemon for rank 1 to be free
    assert not joined
    old.close()
    opener.join(10)
    assert len(joined) == 1
    with joined[0] as new, DataLoader(s, batch_size=4, seed=3, rank=1, world_size=2) as local:
        assert new.step == 0
        assert_same_batch(next(new), next(local))
    # A rank whose member stays is still refused, after the 0.5 s handover.
    with DataLoader(s, batch_size=4, seed=3, rank=0, world_size=2, daemon=opts):
        start = time.monotonic()
        with pytest.raises(ValueError, match="rank 0 of 2 is already taken"):
            DataLoader(s, batch_size=4, seed=3, rank=0, world_size=2, daemon=opts)
        assert time.monotonic() - start >= 0.5


def test_ctrl_c_while_a_rank_waits_for_the_others_consumes_no_step(daemon_factory, stores) -> None:
    import _thread
    import time

    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="ddp", group_mode="shard")
    with DataLoader(s, batch_size=4, seed=2, rank=0, world_size=2, daemon=opts) as r0, \
            DataLoader(s, batch_size=4, seed=2, rank=0, world_size=2) as local0:
        for _ in range(SKEW + 1):  # as far as rank 1 (not joined yet) lets it run
            assert_same_batch(next(r0), next(local0))
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            next(r0)  # waits for rank 1: no error, but Ctrl-C works
        assert time.monotonic() - start < 1.5
        assert r0.step == SKEW + 1
        with DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, daemon=opts) as r1, \
                DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2) as local1:
            for _ in range(3):
                assert_same_batch(next(r1), next(local1))
            # The owed reply is rank 0's next batch: nothing skipped or repeated.
            assert_same_batch(next(r0), next(local0))
            assert r0.step == SKEW + 2


# A broadcast member that takes two batches, then holds them until killed.
MEMBER_THAT_HOLDS = textwrap.dedent(
    """
    import sys, time
    from loaderx.zrecord import Dense
    from loaderx.dataloader import DataLoader
    from loaderx.client import DaemonOptions
    s = {"image": Dense.open(sys.argv[2])}
    opts = DaemonOptions(sys.argv[1], group="sweep", group_mode="broadcast")
    loader = DataLoader(s, batch_size=4, daemon=opts)
    held = [next(loader) for _ in range(2)]
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_sigkilled_member_leaves_and_the_others_go_on(daemon_factory, stores) -> None:
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = {"image": stores["streams"]["image"]}
    opts = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast")
    with DataLoader(s, batch_size=4, daemon=opts) as mine:
        # Alone, mine is pushed its window (step 0) before the other joins (at 0).
        assert daemon.wait_stat("slots_held", 1)["slots_held"] == 1
        proc = subprocess.Popen(
            [sys.executable, "-c", MEMBER_THAT_HOLDS, daemon.socket, str(stores["dir"] / "images")],
            stdout=subprocess.PIPE, env=env(),
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            assert daemon.stats()["group_members"] == 2
            # The other holds its 2 (steps 0 and 1); mine keeps its 1 (step
            # 0). The ring then has 2 batches live, the default
            # --group-live-batches, so step 2 is not gathered nor pushed.
            assert daemon.settled(slots_held=3)["batches_gathered"] == 2
        finally:
            proc.kill()
            proc.wait()
        assert daemon.wait_stat("group_members", 1)["group_members"] == 1
        # The killed member's leases go with its session; mine's window stays.
        assert daemon.wait_stat("slots_held", 1)["slots_held"] == 1
        # The killed member stopped at step 2; we run far past 2 + max_skew.
        result: list = []

        def run() -> None:
            result.extend(next(mine)["image"].copy() for _ in range(4 * SKEW + 4))

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive(), "the surviving member hung"
        with DataLoader(s, batch_size=4) as local:
            for got in result:
                np.testing.assert_array_equal(got, next(local)["image"])
        assert daemon.stats()["groups"] == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"group": ""}, ValueError, "group must be 1..256 UTF-8 bytes, got 0"),
        ({"group": "x" * 257}, ValueError, "got 257"),
        ({"group": "\u00e9" * 129}, ValueError, "got 258"),
        ({"group": 5}, TypeError, "group must be a str"),
        ({"group": "g", "group_mode": "ring"}, ValueError, "group_mode must be"),
        ({"group": "g", "join": "later"}, ValueError, "join must be"),
        ({"join": "current"}, ValueError, "join only applies to a group member"),
    ],
)
def test_daemon_options_validation_names_the_argument(kwargs, error, needle) -> None:
    with pytest.raises(error, match=needle):
        DaemonOptions("/nonexistent.sock", **kwargs)


SEED_NODE = 5


def test_client_loader_takes_group_arguments(daemon, stores) -> None:
    c = lxclient.connect(daemon.socket)
    with pytest.raises(ValueError, match="group_mode"):
        c.loader(stores["streams"], 4, group="g", group_mode="all")
    a = c.loader(stores["streams"], 4, group="g", group_mode="broadcast")
    # Alone, a is pushed its window (step 0) before b joins at step 0.
    assert daemon.wait_stat("batches_gathered", 1)["batches_gathered"] == 1
    b = c.loader(stores["streams"], 4, group="g", group_mode="broadcast")
    try:
        assert_same_batch(next(a), next(b))
        # b reads a's steps from the one ring: no gather of its own (each
        # took step 0 and is pushed step 1, gathered once).
        time.sleep(0.1)
        s = daemon.wait_stat("batches_served", 2)
        assert (s["batches_gathered"], s["batches_served"]) == (2, 2)
    finally:
        a.close()
        b.close()
    gc.collect()


def test_client_loader_passes_every_daemon_option(daemon, stores) -> None:
    # Every DaemonOptions field but path goes to the options; the rest to
    # the DataLoader (a node group of ranks 2..3 of 4, two replicas each).
    c = lxclient.connect(daemon.socket)
    with c.loader(stores["streams"], 4, group="node1", group_mode="shard", ranks=range(2, 4),
                  replicas=2, group_timeout=30.0, leases=3, rank=3, world_size=4,
                  seed=SEED_NODE) as a:
        assert a.step == 0
        g = {g["name"]: g for g in c.stats()["named_groups"]}["node1"]
        assert (g["ranks_first"], g["ranks_count"], g["replicas"]) == (2, 2, 2)
        assert [(m["rank"], m["group_timeout_s"]) for m in g["members"]] == [(3, 30.0)]
    with pytest.raises(TypeError, match="ranks must be a range"):
        c.loader(stores["streams"], 4, group="node1", ranks=[2, 3])


def test_batches_held_past_close_are_not_rewritten_while_the_group_goes_on(daemon, stores) -> None:
    # A member that closes while holding batches keeps their slots: the group
    # (still running for the other member) must not reuse them until the
    # arrays are freed.
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast")
    stay = DataLoader(s, batch_size=8, mode=Mode.IID, seed=4, daemon=opts)
    try:
        with DataLoader(s, batch_size=8, mode=Mode.IID, seed=4, daemon=opts) as leaving:
            kept = [next(leaving) for _ in range(2)]
        want = [copy_batch(b) for b in kept]
        with DataLoader(s, batch_size=8, mode=Mode.IID, seed=4) as local:
            for b in want:
                assert_same_batch(b, next(local))
        for _ in range(40):  # many times round the ring
            next(stay)
        for got, w in zip(kept, want):
            assert_same_batch(got, w)
        stats = daemon.stats()
        assert stats["loaders"] == 1 and stats["group_members"] == 1  # it left the group
        assert stats["sessions"] == 2  # stay and the closed member (holding)
        del kept, got
        gc.collect()
        # Freeing the arrays ends the closed member's session and its leases.
        assert daemon.wait_stat("sessions", 1)["sessions"] == 1
    finally:
        stay.close()
    assert daemon.wait_stat("groups", 0)["groups"] == 0


# Two members that differ in one field of the group's spec: (field, the
# first member's kwargs, the second's, the message naming both values). The
# second member is rank 1 in a shard group (rank 0 in broadcast, whose
# members are one rank).
SPEC_FIELDS = [
    ("mode", {"mode": "IID"}, {"mode": "Cyclic"}, "mode Cyclic differs from the group's IID"),
    ("mode", {"mode": "Cyclic"}, {"mode": "IID"}, "mode IID differs from the group's Cyclic"),
    ("mode", {"mode": "Sequential"}, {"mode": "IID"}, "mode IID differs from the group's Sequential"),
    ("mode", {"mode": "IID"}, {"mode": "Sequential"}, "mode Sequential differs from the group's IID"),
    ("seed", {"seed": 3}, {"seed": 4}, "seed 4 differs from the group's 3"),
    ("seed", {"seed": 4}, {"seed": 3}, "seed 3 differs from the group's 4"),
    ("batch_size", {"batch_size": 4}, {"batch_size": 6}, "batch_size 6 differs from the group's 4"),
    ("batch_size", {"batch_size": 6}, {"batch_size": 4}, "batch_size 4 differs from the group's 6"),
    ("world_size", {"world_size": 2}, {"world_size": 3}, "world_size 3 differs from the group's 2"),
    ("world_size", {"world_size": 3}, {"world_size": 2}, "world_size 2 differs from the group's 3"),
]


@pytest.mark.parametrize("group_mode", ["shard", "broadcast"])
@pytest.mark.parametrize(("field", "first", "second", "needle"), SPEC_FIELDS,
                         ids=[f"{f}-{a[f]}-then-{b[f]}" for f, a, b, _ in SPEC_FIELDS])
def test_a_member_differing_in_one_spec_field_is_refused_naming_both_values(
    daemon, stores, group_mode, field, first, second, needle
) -> None:
    from loaderx.errors import InvalidArgumentError

    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="spec", group_mode=group_mode)
    base = {"batch_size": 4, "mode": "Cyclic", "seed": 3, "world_size": 2}
    second_rank = 1 if group_mode == "shard" else 0
    with DataLoader(s, **{**base, **first}, rank=0, daemon=opts) as member:
        with pytest.raises(InvalidArgumentError, match=f"group 'spec': {needle}"):
            DataLoader(s, **{**base, **second}, rank=second_rank, daemon=opts)
        # Refused at open, nothing served: the group still has its one member
        # and serves it the embedded batches of its own spec.
        assert daemon.stats()["group_members"] == 1
        kw = {**base, **first}
        with DataLoader(s, **kw, rank=0) as local:
            for _ in range(3):
                assert_same_batch(next(member), next(local))


@pytest.mark.parametrize("order", [("shard", "broadcast"), ("broadcast", "shard")])
def test_a_member_of_the_other_group_mode_is_refused_in_either_order(daemon, stores, order) -> None:
    from loaderx.errors import InvalidArgumentError

    s = stores["streams"]
    first, second = order
    needle = f"group 'gm': group_mode {second} differs from the group's {first}"
    with DataLoader(s, batch_size=4, rank=0, world_size=2,
                    daemon=DaemonOptions(daemon.socket, group="gm", group_mode=first)), \
            pytest.raises(InvalidArgumentError, match=needle):
        DataLoader(s, batch_size=4, rank=1, world_size=2,
                   daemon=DaemonOptions(daemon.socket, group="gm", group_mode=second))


@pytest.mark.parametrize("group_mode", ["shard", "broadcast"])
@pytest.mark.parametrize("order", ["own-file-second", "own-file-first"])
def test_a_member_over_other_files_is_refused_in_either_order(daemon, stores, tmp_path, group_mode, order) -> None:
    from loaderx.errors import InvalidArgumentError
    from loaderx.zrecord import Dense

    with Dense.create(str(tmp_path / "other"), np.int64, (), codec="raw") as w:
        w.append(np.arange(200, dtype=np.int64))
    other = Dense.open(str(tmp_path / "other"))
    try:
        mine = {"label": stores["streams"]["label"]}
        theirs = {"label": other}
        if order == "own-file-first":
            mine, theirs = theirs, mine
        opts = DaemonOptions(daemon.socket, group="files", group_mode=group_mode)
        second_rank = 1 if group_mode == "shard" else 0
        needle = "group 'files': stream 0 '.*' differs from the group's '.*' \\(another file\\)"
        with DataLoader(mine, batch_size=4, rank=0, world_size=2, daemon=opts), \
                pytest.raises(InvalidArgumentError, match=needle):
            DataLoader(theirs, batch_size=4, rank=second_rank, world_size=2, daemon=opts)
    finally:
        other.close()


def checkpoint(stores, step: int) -> dict:
    """The state_dict() of an embedded rank-0 loader of the resume tests at `step`."""
    with DataLoader(stores["streams"], batch_size=4, seed=2, rank=0, world_size=2) as src:
        for _ in range(step):
            next(src)
        return src.state_dict()


@pytest.mark.parametrize("order", ["one-rank-at-a-time", "rank0-runs-first", "both-open-then-load",
                                   "rank1-creates"])
def test_ranks_resumed_by_load_state_dict_before_next_start_at_the_checkpoint(
    daemon_factory, stores, order
) -> None:
    # The guide's checkpoint pattern through a shard group: construct, then
    # load_state_dict(state) before the first next(). The second rank used to
    # be refused ("no longer holds step 0") once the first had moved the group.
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    k = 5
    state = checkpoint(stores, k)
    opts = DaemonOptions(daemon.socket, group="resume-ddp", group_mode="shard")

    def rank(r: int) -> DataLoader:
        return DataLoader(s, batch_size=4, seed=2, rank=r, world_size=2, daemon=opts)

    locals_ = [DataLoader(s, batch_size=4, seed=2, rank=r, world_size=2, start_step=k) for r in range(2)]
    ranks: list[DataLoader] = []
    try:
        if order == "one-rank-at-a-time":
            for r in range(2):
                ranks.append(rank(r))
                ranks[r].load_state_dict(state)
        elif order == "rank0-runs-first":
            ranks.append(rank(0))
            ranks[0].load_state_dict(state)
            for _ in range(SKEW + 1):  # as far as rank 1 (not joined) lets it
                assert_same_batch(next(ranks[0]), next(locals_[0]))
            ranks.append(rank(1))
            ranks[1].load_state_dict(state)
        elif order == "both-open-then-load":
            ranks = [rank(0), rank(1)]
            for r in ranks:
                r.load_state_dict(state)
        else:  # rank 1 creates the group and moves it alone
            one = rank(1)
            one.load_state_dict(state)
            ranks = [rank(0), one]
            ranks[0].load_state_dict(state)
        assert [r.step for r in ranks] == [locals_[0].step, k]
        for _ in range(3 * SKEW):
            for r in sorted(range(2), key=lambda r: ranks[r].step):  # one thread: the slower first
                assert_same_batch(next(ranks[r]), next(locals_[r]))
        assert locals_[1].step == k + 3 * SKEW
    finally:
        for r in ranks + locals_:
            r.close()


def test_a_rank_that_does_not_seek_to_the_groups_step_gets_an_error_naming_both_steps(
    daemon_factory, stores
) -> None:
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="resume-ddp", group_mode="shard")
    with DataLoader(s, batch_size=4, seed=2, rank=0, world_size=2, daemon=opts) as r0:
        r0.load_state_dict(checkpoint(stores, 5))
        next(r0)
        # Rank 1 opens at step 0 (the constructor's) and never moves there: its
        # first next() is refused naming its step and the group's oldest,
        # never served another step.
        with DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, daemon=opts) as r1:
            assert r1.step == 0
            start = time.monotonic()
            with pytest.raises(IndexError, match="group 'resume-ddp' no longer holds step 0 \\(out of range\\): "
                                                 "the oldest step it still holds is 5"):
                next(r1)
            assert time.monotonic() - start < 5
            with pytest.raises(IndexError, match="no longer holds step 0"):
                next(r1)  # again: nothing was consumed
            assert r1.step == 0
            # A seek below what the group holds is refused at once; one at it works.
            with pytest.raises(IndexError, match="no longer holds step 3 .*oldest step it still holds is 5"):
                r1.seek(3)
            r1.seek(5)
            with DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, start_step=5) as local1:
                assert_same_batch(next(r1), next(local1))
        # Rank 1 left: a new rank 1 that never moves leaves rank 1 where it was
        # (step 6), and a third joins there.
        with DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, daemon=opts):
            pass
        with DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, start_step=6, daemon=opts) as again, \
                DataLoader(s, batch_size=4, seed=2, rank=1, world_size=2, start_step=6) as local1:
            assert_same_batch(next(again), next(local1))


# A shard rank 1 in its own process: opens, resumes at argv[3] with
# load_state_dict, takes argv[4] batches (pickled to argv[5]), says "ready"
# and stays a member until killed or argv[6] exists.
RESUMING_RANK = textwrap.dedent(
    """
    import os, pickle, sys, time
    from loaderx.zrecord import Dense
    from loaderx.dataloader import DataLoader
    from loaderx.client import DaemonOptions
    sock, images, start, steps, out, go = sys.argv[1:7]
    opts = DaemonOptions(sock, group="ddp", group_mode="shard")
    loader = DataLoader({"image": Dense.open(images)}, batch_size=4, seed=7, rank=1, world_size=2,
                        daemon=opts)
    state = loader.state_dict()
    state["step"] = int(start)
    loader.load_state_dict(state)
    got = [next(loader)["image"].copy() for _ in range(int(steps))]
    with open(out, "wb") as f:
        pickle.dump(got, f)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    loader.close()
    """
)


def test_a_sigkilled_rank_fails_its_peers_at_once_and_a_restarted_rank_rejoins(
    daemon_factory, stores, tmp_path: Path
) -> None:
    from loaderx.errors import GroupTimeoutError

    daemon = daemon_factory("--max-skew", str(SKEW))
    s = {"image": stores["streams"]["image"]}
    images = str(stores["dir"] / "images")
    opts = DaemonOptions(daemon.socket, group="ddp", group_mode="shard")  # group_timeout: 300 s

    def rank1(start: int, steps: int, name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", RESUMING_RANK, daemon.socket, images, str(start), str(steps),
             str(tmp_path / f"{name}.pkl"), str(tmp_path / f"{name}.go")],
            stdout=subprocess.PIPE, env=env())

    def ready(proc: subprocess.Popen) -> None:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"

    def expected(rank: int, start: int, steps: int) -> list:
        with DataLoader(s, batch_size=4, seed=7, rank=rank, world_size=2, start_step=start) as local:
            return [next(local)["image"].copy() for _ in range(steps)]

    with DataLoader(s, batch_size=4, seed=7, rank=0, world_size=2, daemon=opts) as r0:
        want0 = expected(0, 0, 3 * SKEW + 6)
        first = rank1(0, 3, "first")  # rank 1 at step 3
        try:
            ready(first)
            for step in range(3 + SKEW + 1):  # as far as rank 1 at 3 lets rank 0 go
                np.testing.assert_array_equal(next(r0)["image"], want0[step])
            first.kill()
            first.wait()
            start = time.monotonic()
            with pytest.raises(GroupTimeoutError) as err:
                next(r0)
            assert time.monotonic() - start < 10
        finally:
            first.kill()
            first.wait()
        assert isinstance(err.value, TimeoutError)
        message = str(err.value)
        # How it ended is read from /proc when its session ends: killed, or
        # already reaped by this test's wait().
        fate = f"process {first.pid} (was killed by signal 9 \\(SIGKILL\\)|has exited)"
        assert re.fullmatch(
            f"group 'ddp': rank 0 cannot take step {3 + SKEW + 1}, which needs rank 1 to reach step 4 "
            f"first \\(max-skew {SKEW}\\), but rank 1 left at step 3 \\(hung up without closing its loader: "
            f"{fate}\\) and its {fate}: restart rank 1 at step 3 or later \\(its checkpoint\\), "
            "or restart the job", message), message
        assert r0.step == 3 + SKEW + 1  # nothing consumed: a later next() goes on once rank 1 is back
        # The restarted rank resumes at the step it died at, as the guide shows
        # (construct, load_state_dict, next).
        again = rank1(3, 3 * SKEW, "again")
        try:
            for step in range(3 + SKEW + 1, 3 * SKEW + 6):
                np.testing.assert_array_equal(next(r0)["image"], want0[step])
            ready(again)
            (tmp_path / "again.go").touch()
            assert again.wait(timeout=60) == 0
        finally:
            again.kill()
            again.wait()
        got1 = pickle.loads((tmp_path / "again.pkl").read_bytes())
        for a, b in zip(got1, expected(1, 3, 3 * SKEW), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_rank_that_closed_cleanly_is_waited_for_as_before(daemon_factory, stores) -> None:
    from loaderx.errors import GroupTimeoutError

    daemon = daemon_factory("--max-skew", str(SKEW))
    s = {"image": stores["streams"]["image"]}
    opts = DaemonOptions(daemon.socket, group="ddp", group_mode="shard", group_timeout=1.5)
    with DataLoader(s, batch_size=4, rank=0, world_size=2, daemon=opts) as r0:
        with DataLoader(s, batch_size=4, rank=1, world_size=2, daemon=opts) as r1:
            next(r1)
        for _ in range(SKEW + 2):
            next(r0)
        # Its process (this one) still runs: it may reopen as rank 1, so rank 0
        # waits its whole group timeout, not less.
        start = time.monotonic()
        with pytest.raises(GroupTimeoutError, match="waited its group_timeout of 1.5 s .* rank 1 \\(left at step 1\\)"):
            next(r0)
        assert time.monotonic() - start >= 1.5


# A DDP rank resuming as the guide shows (loaderx.torch.StatefulLoader, a
# checkpoint from torch.save, load_state_dict before iterating): takes
# argv[5] batches and pickles them as arrays.
TORCH_RANK = textwrap.dedent(
    """
    import pickle, sys
    import torch
    from loaderx.zrecord import Dense
    from loaderx.dataloader import DataLoader
    from loaderx.client import DaemonOptions
    from loaderx.torch import StatefulLoader
    sock, images, rank, ckpt, steps, out = sys.argv[1:7]
    opts = DaemonOptions(sock, group="resume-ddp", group_mode="shard")
    loader = StatefulLoader(DataLoader({"image": Dense.open(images)}, batch_size=4, seed=2,
                                       rank=int(rank), world_size=2, daemon=opts))
    loader.load_state_dict(torch.load(ckpt, weights_only=True)["loader"])
    got = []
    for batch in loader:
        got.append(batch["image"].numpy().copy())
        if len(got) == int(steps):
            break
    assert loader.state_dict()["step"] == 5 + int(steps)
    loader.close()
    with open(out, "wb") as f:
        pickle.dump(got, f)
    """
)


def test_torch_ranks_resume_through_a_shard_group_as_the_guide_shows(daemon_factory, stores, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = {"image": stores["streams"]["image"]}
    with DataLoader(s, batch_size=4, seed=2, rank=0, world_size=2) as src:
        for _ in range(5):
            next(src)
        torch.save({"loader": src.state_dict()}, tmp_path / "ckpt.pt")
    steps = 3 * SKEW
    procs = [subprocess.Popen([sys.executable, "-c", TORCH_RANK, daemon.socket, str(stores["dir"] / "images"),
                               str(r), str(tmp_path / "ckpt.pt"), str(steps), str(tmp_path / f"r{r}.pkl")],
                              env=env())
             for r in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    for r in range(2):
        got = pickle.loads((tmp_path / f"r{r}.pkl").read_bytes())
        with DataLoader(s, batch_size=4, seed=2, rank=r, world_size=2, start_step=5) as local:
            assert len(got) == steps
            for g in got:
                np.testing.assert_array_equal(g, next(local)["image"])
