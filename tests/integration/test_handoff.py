"""The batch hand-off from a real loaderxd: publish stamps and push under credit."""

from __future__ import annotations

import time

import numpy as np
from conftest import assert_same_batch
from loaderx import _loaderx
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader


def test_last_publish_ns_stamps_each_batch_on_the_monotonic_clock(daemon, stores) -> None:
    opened = time.monotonic_ns()
    spec = _loaderx.LoaderSpec(stores=[str(stores["dir"] / "labels")], batch_size=4, mode=0,
                               seed=1, prefetch=2, leases=4)
    src = _loaderx.DaemonLoader(daemon.socket, spec)
    try:
        assert src.last_publish_ns == 0  # nothing returned yet
        last = opened
        for step in range(10):
            got = src.next(None)
            holding = time.monotonic_ns()
            assert got is not None and got[0] == step
            stamp = src.last_publish_ns
            assert isinstance(stamp, int)
            assert last <= stamp <= holding  # published in order, before we held it
            last = stamp
            np.testing.assert_array_equal(got[1][0], stores["labels"][4 * step:4 * step + 4])
    finally:
        src.close()


def test_pushed_batches_are_the_embedded_batches(daemon, stores) -> None:
    with DataLoader(stores["streams"], batch_size=8, seed=4, daemon=daemon.socket) as remote, \
            DataLoader(stores["streams"], batch_size=8, seed=4) as local:
        for _ in range(25):
            assert_same_batch(next(remote), next(local))
        assert remote.step == 25
    # Served counts what the caller took, not what was pushed ahead of it.
    assert daemon.wait_stat("loaders", 0)["batches_served"] == 25


def test_push_keeps_one_batch_ahead_and_a_seek_releases_the_unread(daemon, stores) -> None:
    options = DaemonOptions(daemon.socket, leases=4)
    with DataLoader(stores["streams"], batch_size=8, seed=4, daemon=options) as remote, \
            DataLoader(stores["streams"], batch_size=8, seed=4, start_step=9) as local:
        held = next(remote)
        # Step 1 is pushed unread (the push window of one), and no more, though
        # the credit of 4 would allow it.
        assert daemon.wait_stat("slots_held", 2)["slots_held"] == 2
        time.sleep(0.1)
        s = daemon.stats()
        assert (s["slots_held"], s["batches_gathered"], s["batches_served"]) == (2, 2, 1)
        remote.seek(9)
        assert remote.step == 9
        # The unread one is released; the new generation pushes step 9 beside `held`.
        s = daemon.wait_stat("batches_gathered", 3)
        assert daemon.wait_stat("slots_held", 2)["slots_held"] == 2
        assert s["batches_gathered"] == 3
        assert daemon.stats()["releases"] == 1
        assert_same_batch(next(remote), next(local))
        assert held["label"].shape == (8,)
    assert daemon.wait_stat("loaders", 0)["batches_served"] == 2


def test_batches_held_past_close_keep_their_values_with_pushed_unread(daemon, stores) -> None:
    # close() with pushed batches unread: the daemon must stop the pipeline
    # before it could reuse the slots the client still views.
    for start in range(30):
        with DataLoader(stores["streams"], batch_size=8, seed=4, start_step=start,
                        daemon=daemon.socket) as remote:
            kept = [next(remote) for _ in range(2)]
        time.sleep(0.02)  # time for anything still running in the daemon to land
        with DataLoader(stores["streams"], batch_size=8, seed=4, start_step=start) as local:
            for got in kept:
                assert_same_batch(got, next(local))
    del kept, got
    assert daemon.wait_stat("slots_held", 0)["slots_held"] == 0
    assert daemon.wait_stat("loaders", 0)["loaders"] == 0


def test_push_stops_at_the_credit(daemon, stores) -> None:
    options = DaemonOptions(daemon.socket, leases=2)
    with DataLoader(stores["streams"], batch_size=8, daemon=options) as remote:
        first, second = next(remote), next(remote)
        # Holding both, the client is at its credit: the window's next batch waits.
        assert daemon.wait_stat("slots_held", 2)["slots_held"] == 2
        time.sleep(0.1)
        s = daemon.stats()
        assert (s["slots_held"], s["batches_gathered"]) == (2, 2)
        del first  # credit comes back: step 2 is pushed
        assert daemon.wait_stat("batches_gathered", 3)["batches_gathered"] == 3
        assert daemon.wait_stat("slots_held", 2)["slots_held"] == 2
        assert second["label"].shape == (8,)


def test_pushed_batches_with_a_transform_pool_keep_order_and_values(daemon, stores) -> None:
    def shift(batch: dict) -> np.ndarray:
        return batch["label"] + 1

    with DataLoader(stores["streams"], batch_size=8, seed=2, transform=shift,
                    transform_threads=2, daemon=daemon.socket) as remote, \
            DataLoader(stores["streams"], batch_size=8, seed=2) as local:
        for _ in range(15):
            np.testing.assert_array_equal(next(remote), next(local)["label"] + 1)
        assert remote.step == 15
