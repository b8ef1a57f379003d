"""Group ring memory on a real loaderxd (docs/daemon.md "Memory").

What a group keeps resident is what it has live: the daemon's ring memfd is
measured directly (``st_blocks`` of the daemon's own descriptor, i.e. the
shmem pages allocated), not estimated. Also the two ways members could fill a
ring: a member asking for more leases than the group's, and broadcast members
at different speeds.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest
from loaderx.client import DaemonOptions, connect
from loaderx.dataloader import DataLoader
from loaderx.errors import GroupTimeoutError, ResourceExhausted
from loaderx.zrecord import Dense

RECORD = (64, 1024)  # 64 KiB uint8 records
BATCH = 8  # 512 KiB batches
BATCH_BYTES = BATCH * RECORD[0] * RECORD[1]
SEED = 5


@pytest.fixture
def big(tmp_path: Path):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=(96, *RECORD), dtype=np.uint8)
    with Dense.create(str(tmp_path / "big"), data.dtype, RECORD, codec="raw") as s:
        s.append(data)
    store = Dense.open(str(tmp_path / "big"))
    with DataLoader({"x": store}, batch_size=BATCH, seed=SEED) as local:
        want = [next(local)["x"].copy() for _ in range(60)]
    yield {"streams": {"x": store}, "want": want}
    store.close()


def ring_resident_bytes(daemon_pid: int) -> list[int]:
    """Shmem bytes allocated to each ring memfd loaderxd holds open."""
    out = []
    for fd in Path(f"/proc/{daemon_pid}/fd").iterdir():
        try:
            if "loaderx-ring-" in os.readlink(fd):
                out.append(os.stat(fd).st_blocks * 512)
        except OSError:
            continue  # closed meanwhile
    return out


def group_row(socket: str) -> dict:
    [g] = connect(socket).stats()["named_groups"]
    return g


def test_a_named_groups_prefetch_is_capped_by_group_prefetch_and_solo_keeps_its_own(
        daemon_factory, big) -> None:
    # Default --group-prefetch 1: the creator's prefetch 4 becomes 1, so the
    # ring has 1 + leases + max_skew + 1 slots; a solo loader keeps 4.
    d = daemon_factory("--max-skew", "2")
    opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=5)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, prefetch=4, daemon=opts) as a:
        np.testing.assert_array_equal(next(a)["x"], big["want"][0])
        assert group_row(d.socket)["slots"] == 1 + 5 + 2 + 1
        with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, prefetch=4,
                        daemon=DaemonOptions(d.socket, leases=5)) as solo:
            np.testing.assert_array_equal(next(solo)["x"], big["want"][0])
            assert connect(d.socket).stats()["solo_loaders"][0]["slots"] == 4 + 5 + 1
    # --group-prefetch 0: no cap; a lower creator prefetch is kept under a cap.
    d0 = daemon_factory("--max-skew", "2", "--group-prefetch", "0", name="d0.sock")
    opts = DaemonOptions(d0.socket, group="g", group_mode="broadcast", leases=5)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, prefetch=4, daemon=opts) as a:
        np.testing.assert_array_equal(next(a)["x"], big["want"][0])
        assert group_row(d0.socket)["slots"] == 4 + 5 + 2 + 1
    d3 = daemon_factory("--max-skew", "2", "--group-prefetch", "3", name="d3.sock")
    opts = DaemonOptions(d3.socket, group="g", group_mode="broadcast", leases=5)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, prefetch=2, daemon=opts) as a:
        np.testing.assert_array_equal(next(a)["x"], big["want"][0])
        assert group_row(d3.socket)["slots"] == 2 + 5 + 2 + 1
        assert connect(d3.socket).stats()["daemon"]["limits"]["group_prefetch"] == 3


def test_a_group_ring_keeps_its_live_batches_resident_not_every_slot(daemon_factory, big) -> None:
    # Two broadcast members in step for 40 steps over a 26-slot ring: the
    # ring's allocated pages stay at the few batches live at once.
    d = daemon_factory()  # --max-skew 8, --group-prefetch 1
    opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=16)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=opts) as a, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=opts) as b:
        for step in range(40):
            xa, xb = next(a)["x"], next(b)["x"]
            np.testing.assert_array_equal(xa, big["want"][step])
            np.testing.assert_array_equal(xb, big["want"][step])
            del xa, xb
        g = group_row(d.socket)
        assert g["slots"] == 1 + 16 + 8 + 1
        [resident] = ring_resident_bytes(d.proc.pid)
        assert resident <= 5 * BATCH_BYTES + (1 << 20), resident
        assert resident >= 2 * BATCH_BYTES, resident  # it did gather into the ring
        assert resident < g["ring_bytes"] / 4


def test_a_member_asking_for_more_leases_than_the_group_gets_the_groups_cap(
        daemon_factory, big) -> None:
    d = daemon_factory("--max-skew", "4")
    creator = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=2)
    # Read-only views stay in the ring, so holding the cap of them refuses
    # (writable batches would move out instead: test_daemon_model).
    greedy = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=8, shared_view=True)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=creator) as a, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=greedy) as b:
        assert b._source._native.lease_cap == 2
        held = [next(b) for _ in range(2)]
        with pytest.raises(ResourceExhausted, match="lease cap 2"):
            next(b)
        assert b.step == 2
        for step in range(3):  # the creator is not starved by the hoarder
            np.testing.assert_array_equal(next(a)["x"], big["want"][step])
        held.pop(0)
        gc.collect()
        np.testing.assert_array_equal(next(b)["x"], big["want"][2])
        np.testing.assert_array_equal(held[0]["x"], big["want"][1])


def test_broadcast_members_at_different_speeds_wait_at_the_skew_and_never_fill_the_ring(
        daemon_factory, big) -> None:
    # A fast member runs max_skew steps ahead of a slow one, then its next
    # waits (here: until its group timeout, naming the slow member); the ring
    # holds the skew window, it never refuses a step, and the fast member
    # goes on once the slow one moves.
    d = daemon_factory("--max-skew", "3", "--group-live-batches", "0")  # the skew alone
    fast_opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=2,
                              group_timeout=0.5)
    slow_opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=2)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=fast_opts) as fast, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=slow_opts) as slow:
        for step in range(4):  # steps 0..3: slowest at 0, max-skew 3
            np.testing.assert_array_equal(next(fast)["x"], big["want"][step])
        start = time.monotonic()
        with pytest.raises(GroupTimeoutError, match=r"for step 4.*at step 0"):
            next(fast)
        assert time.monotonic() - start >= 0.5
        assert fast.step == 4
        g = group_row(d.socket)
        assert (g["oldest_held"], g["newest_held"]) == (0, 3)
        [resident] = ring_resident_bytes(d.proc.pid)
        assert resident <= (4 + 1 + 2) * BATCH_BYTES + (1 << 20), resident
        for step in range(2):
            np.testing.assert_array_equal(next(slow)["x"], big["want"][step])
        for step in range(4, 6):  # slowest now at 2: steps up to 5 are open
            np.testing.assert_array_equal(next(fast)["x"], big["want"][step])
        assert group_row(d.socket)["oldest_held"] == 2


def live_row(socket: str) -> tuple[int, int]:
    g = group_row(socket)
    return g["live_slots"], g["max_live"]


def test_a_broadcast_ring_never_holds_more_than_its_live_bound_while_a_slow_member_holds_a_batch(
        daemon_factory, big) -> None:
    # K = 2 (the default): the slow member keeps step 0; the fast one gets
    # step 1 (gathered while 0 was live) and then waits for the slow one at
    # the bound, as at the skew limit (its group timeout, 1 s here, names
    # the slow member); once the slow member frees step 0 the fast one goes on. The
    # ring's live slots (status) and its allocated pages (the memfd) never
    # exceed 2 batches.
    d = daemon_factory("--max-skew", "8")
    fast_opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=2,
                              group_timeout=1.0)
    slow_opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=2)
    samples: list[tuple[int, int, int]] = []

    def sample() -> None:
        live, bound = live_row(d.socket)
        [resident] = ring_resident_bytes(d.proc.pid)
        samples.append((live, bound, resident))

    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=fast_opts) as fast, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=slow_opts) as slow:
        kept = next(slow)["x"]  # step 0, held
        np.testing.assert_array_equal(kept, big["want"][0])
        for step in range(2):
            np.testing.assert_array_equal(next(fast)["x"], big["want"][step])
            sample()
        start = time.monotonic()
        with pytest.raises(GroupTimeoutError, match=r"for step 2, which needs member session \d+ "
                                                    r"\(pid \d+, at step 1\) to move on from step 1 first "
                                                    r"\(the group keeps at most 2 batches live"):
            next(fast)
        assert time.monotonic() - start >= 1.0
        assert fast.step == 2
        sample()
        g = group_row(d.socket)
        assert (g["oldest_held"], g["newest_held"], g["next_gather"]) == (1, 1, 2)
        assert g["batches_gathered"] == 2
        np.testing.assert_array_equal(kept, big["want"][0])  # its slot was never reused
        del kept
        gc.collect()
        for step in range(2, 12):  # the slow member freed step 0: both go on, one step apart
            np.testing.assert_array_equal(next(fast)["x"], big["want"][step])
            sample()
            np.testing.assert_array_equal(next(slow)["x"], big["want"][step - 1])
            sample()
        # fast took 11, slow 10: once slow freed 10, step 12 is gathered for
        # fast's push (the ring: 11 and 12), and nothing more.
        d.settled(batches_gathered=13)
        sample()
    assert {bound for _, bound, _ in samples} == {2}
    assert max(live for live, _, _ in samples) <= 2, samples
    assert max(r for _, _, r in samples) <= 2 * BATCH_BYTES + (1 << 20), samples
    assert max(r for _, _, r in samples) >= 2 * BATCH_BYTES  # both slots were written


def test_a_member_holding_more_batches_than_the_live_bound_still_gets_every_step(
        daemon_factory, big) -> None:
    # The bound never stops the slowest member: a caller blocked in next()
    # for a step not gathered yet opens the gate, whatever it holds (then
    # the ring has more than K live, up to its slots, as without the bound).
    d = daemon_factory("--group-live-batches", "2")
    opts = DaemonOptions(d.socket, group="g", group_mode="broadcast", leases=6)
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=opts) as a, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=opts) as b:
        held_a, held_b = [], []
        for _ in range(5):  # in turns: the one ahead waits for the other at the bound
            held_a.append(next(a)["x"])
            held_b.append(next(b)["x"])
        for step in range(5):
            np.testing.assert_array_equal(held_a[step], big["want"][step])
            np.testing.assert_array_equal(held_b[step], big["want"][step])
        assert live_row(d.socket)[0] == 5  # the gate stays shut past them: nobody waits
        del held_a, held_b
        gc.collect()
        for step in range(5, 9):
            np.testing.assert_array_equal(next(a)["x"], big["want"][step])
            np.testing.assert_array_equal(next(b)["x"], big["want"][step])


def test_the_live_bound_is_a_daemon_flag_shown_in_status_and_off_for_shard_and_solo(
        daemon_factory, big) -> None:
    d = daemon_factory("--group-live-batches", "3")
    assert connect(d.socket).stats()["daemon"]["limits"]["group_live_batches"] == 3
    opts = DaemonOptions(d.socket, group="g", group_mode="broadcast")
    with DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=opts) as a, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, rank=0, world_size=2,
                       daemon=DaemonOptions(d.socket, group="s", group_mode="shard")) as r0, \
            DataLoader(big["streams"], batch_size=BATCH, seed=SEED, daemon=d.socket) as solo:
        next(a), next(r0), next(solo)
        rows = {g["name"]: g for g in connect(d.socket).stats()["named_groups"]}
        assert (rows["g"]["max_live"], rows["s"]["max_live"]) == (3, 0)
        assert connect(d.socket).stats()["solo_loaders"][0]["max_live"] == 0
    d0 = daemon_factory("--group-live-batches", "0", name="d0.sock")
    assert connect(d0.socket).stats()["daemon"]["limits"]["group_live_batches"] == 0
    assert connect(daemon_factory(name="dd.sock").socket).stats()["daemon"]["limits"][
        "group_live_batches"] == 2
