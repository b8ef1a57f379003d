"""The batch hand-off from a real loaderxd: publish stamps and request-ahead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
from conftest import ROOT, assert_same_batch
from loaderx import _loaderx
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from test_embedded_suite_via_daemon import FAKE_SOURCE_TESTS, SUITE


def test_last_publish_ns_stamps_each_batch_on_the_monotonic_clock(daemon, stores) -> None:
    opened = time.monotonic_ns()
    src = _loaderx.DaemonLoader(daemon.socket, [str(stores["dir"] / "labels")], 4, 0, 1, 0, 1,
                                0, 2, 4, 0)
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


def test_request_ahead_gives_the_embedded_batches(daemon, stores) -> None:
    options = DaemonOptions(daemon.socket, request_ahead=True)
    with DataLoader(stores["streams"], batch_size=8, seed=4, daemon=options) as remote, \
            DataLoader(stores["streams"], batch_size=8, seed=4) as local:
        assert remote._source.request_ahead is True
        for _ in range(25):
            assert_same_batch(next(remote), next(local))
        assert remote.step == 25


def test_request_ahead_holds_one_more_slot_and_seek_returns_it(daemon, stores) -> None:
    options = DaemonOptions(daemon.socket, leases=4, request_ahead=True)
    with DataLoader(stores["streams"], batch_size=8, seed=4, daemon=options) as remote, \
            DataLoader(stores["streams"], batch_size=8, seed=4, start_step=9) as local:
        held = next(remote)
        # The batch of step 1 was requested ahead and is leased to us unseen.
        assert daemon.wait_stat("slots_held", 2)["slots_held"] == 2
        remote.seek(9)
        assert remote.step == 9
        assert daemon.wait_stat("slots_held", 1)["slots_held"] == 1  # only `held`
        assert_same_batch(next(remote), next(local))
        assert held["label"].shape == (8,)


def test_batches_held_past_close_keep_their_values_with_request_ahead(daemon, stores) -> None:
    # close() with a request ahead outstanding: the daemon must stop the
    # pipeline before it could reuse the slots the client still views.
    options = DaemonOptions(daemon.socket, request_ahead=True)
    for start in range(30):
        with DataLoader(stores["streams"], batch_size=8, seed=4, start_step=start,
                        daemon=options) as remote:
            kept = [next(remote) for _ in range(2)]
        time.sleep(0.02)  # time for anything still running in the daemon to land
        with DataLoader(stores["streams"], batch_size=8, seed=4, start_step=start) as local:
            for got in kept:
                assert_same_batch(got, next(local))
    del kept, got
    assert daemon.wait_stat("slots_held", 0)["slots_held"] == 0
    assert daemon.wait_stat("loaders", 0)["loaders"] == 0


def test_request_ahead_off_by_default(daemon, stores) -> None:
    with DataLoader(stores["streams"], batch_size=8, daemon=daemon.socket) as remote:
        assert remote._source.request_ahead is False
        batch = next(remote)
        time.sleep(0.1)  # nothing is asked for behind our back
        assert daemon.stats()["slots_held"] == 1
        del batch


def test_request_ahead_with_a_transform_pool_keeps_order_and_values(daemon, stores) -> None:
    def shift(batch: dict) -> np.ndarray:
        return batch["label"] + 1

    options = DaemonOptions(daemon.socket, request_ahead=True)
    with DataLoader(stores["streams"], batch_size=8, seed=2, transform=shift,
                    transform_threads=2, daemon=options) as remote, \
            DataLoader(stores["streams"], batch_size=8, seed=2) as local:
        for _ in range(15):
            np.testing.assert_array_equal(next(remote), next(local)["label"] + 1)
        assert remote.step == 15


def test_embedded_loader_suite_passes_with_request_ahead(daemon) -> None:
    here = os.path.dirname(__file__)
    env = dict(os.environ, LOADERX_FORCE_DAEMON=daemon.socket,
               PYTHONPATH=os.pathsep.join([*sys.path, here]))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "daemon_ahead_everywhere", "-k", FAKE_SOURCE_TESTS, *SUITE],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    match = re.search(r"(\d+) passed", r.stdout)
    assert match is not None and int(match.group(1)) >= 40
    assert daemon.stats()["batches_served"] > 100  # really served by the daemon
