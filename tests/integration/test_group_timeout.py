"""Group timeout on a real loaderxd: a member never waits forever for its peers.

docs/daemon.md, "Group timeout": a member whose ``next`` waits longer than its
group timeout for the other members raises ``GroupTimeoutError`` naming the
ranks it waits for and the step; a peer that shows up in time means no error.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest
from conftest import assert_same_batch, loaderxd_binary
from loaderx import connect
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.errors import GroupTimeoutError, LoaderxError

SKEW = 2


def shard(socket: str, timeout: float | None = None) -> DaemonOptions:
    return DaemonOptions(socket, group="ddp", group_mode="shard", group_timeout=timeout)


def test_a_rank_whose_peers_never_join_raises_naming_them_and_the_step(daemon_factory, stores) -> None:
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    with DataLoader(s, batch_size=4, seed=3, rank=0, world_size=3, daemon=shard(daemon.socket, 1.0)) as r0, \
            DataLoader(s, batch_size=4, seed=3, rank=0, world_size=3) as local0:
        for _ in range(SKEW + 1):  # as far as ranks 1 and 2 (never joined) let it run
            assert_same_batch(next(r0), next(local0))
        start = time.monotonic()
        with pytest.raises(GroupTimeoutError) as err:
            next(r0)
        waited = time.monotonic() - start
        assert 1.0 <= waited < 3.0
        assert isinstance(err.value, TimeoutError) and isinstance(err.value, LoaderxError)
        assert str(err.value) == (
            "group 'ddp': rank 0 waited its group_timeout of 1.0 s for step 3, which needs rank 1 "
            "(not joined) and rank 2 (not joined) to reach step 1 first (max-skew 2)"
        )
        # The failed next consumed nothing: once the peers come, rank 0 goes on exactly.
        assert r0.step == SKEW + 1
        opts = shard(daemon.socket)
        with DataLoader(s, batch_size=4, seed=3, rank=1, world_size=3, daemon=opts) as r1, \
                DataLoader(s, batch_size=4, seed=3, rank=2, world_size=3, daemon=opts) as r2:
            next(r1)
            next(r2)
            assert_same_batch(next(r0), next(local0))
            assert r0.step == SKEW + 2


def test_a_rank_that_left_is_named_with_the_step_it_left_at(daemon_factory, stores) -> None:
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    opts = shard(daemon.socket, 0.5)
    with DataLoader(s, batch_size=4, rank=0, world_size=2, daemon=opts) as r0:
        with DataLoader(s, batch_size=4, rank=1, world_size=2, daemon=opts) as r1:
            next(r1)
        for _ in range(SKEW + 2):  # rank 1 stopped at step 1: rank 0 may take 0..3
            next(r0)
        with pytest.raises(GroupTimeoutError, match=re.escape(
                "rank 0 waited its group_timeout of 0.5 s for step 4, which needs rank 1 (left at step 1) "
                "to reach step 2 first")):
            next(r0)


def test_a_peer_that_joins_in_time_means_no_error(daemon_factory, stores) -> None:
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    opts = shard(daemon.socket, 3.0)
    got: list = []
    with DataLoader(s, batch_size=4, seed=5, rank=0, world_size=2, daemon=opts) as r0, \
            DataLoader(s, batch_size=4, seed=5, rank=0, world_size=2) as local0:
        for _ in range(SKEW + 1):
            next(r0)
            next(local0)

        def late_rank1() -> None:
            time.sleep(1.0)
            with DataLoader(s, batch_size=4, seed=5, rank=1, world_size=2, daemon=opts) as r1:
                got.extend(next(r1)["label"].copy() for _ in range(3))

        t = threading.Thread(target=late_rank1)
        t.start()
        start = time.monotonic()
        batch = next(r0)  # waits about 1 s for rank 1, well inside 3 s
        assert time.monotonic() - start >= 0.5
        assert_same_batch(batch, next(local0))
        t.join(timeout=30)
    with DataLoader(s, batch_size=4, seed=5, rank=1, world_size=2) as local1:
        for labels in got:
            assert (labels == next(local1)["label"]).all()
    assert len(got) == 3


def test_a_member_pausing_between_next_calls_never_times_out(daemon_factory, stores) -> None:
    """Only a caller blocked in next() waits for its peers (protocol 1.1's
    meaning, kept under push by the client's ``consumed {waiting: true}``): a
    rank that takes all it may and then pauses (an eval) three times its
    group_timeout while its peer is behind gets no error, and the group never
    reports it waiting; blocked in next(), it times out as before."""
    daemon = daemon_factory("--max-skew", str(SKEW))
    s = stores["streams"]
    opts = shard(daemon.socket, 0.5)
    with DataLoader(s, batch_size=4, seed=7, rank=0, world_size=2, daemon=opts) as r0, \
            DataLoader(s, batch_size=4, seed=7, rank=1, world_size=2, daemon=opts) as r1, \
            DataLoader(s, batch_size=4, seed=7, rank=0, world_size=2) as local0:
        for _ in range(SKEW + 1):  # rank 1 is at step 0: rank 0 may take steps 0..SKEW
            assert_same_batch(next(r0), next(local0))
        c = connect(daemon.socket)
        end = time.monotonic() + 1.5  # the pause: three group timeouts
        while time.monotonic() < end:
            [ddp] = c.stats()["named_groups"]
            assert ddp["waiting"] is None and ddp["rank_cursors"] == [SKEW + 1, 0], ddp
            time.sleep(0.1)
        next(r1)  # rank 1 takes step 0: rank 0 may take step SKEW + 1
        assert_same_batch(next(r0), next(local0))  # no GroupTimeoutError queued by the pause
        assert r0.step == SKEW + 2
        # Blocked in next() for step SKEW + 2 (rank 1 is at 1): the timeout.
        with pytest.raises(GroupTimeoutError, match=re.escape(
                f"rank 0 waited its group_timeout of 0.5 s for step {SKEW + 2}, which needs rank 1 (pid ")):
            next(r0)
        assert r0.step == SKEW + 2
        next(r1)
        assert_same_batch(next(r0), next(local0))


def test_the_daemon_flag_is_the_default_and_a_member_may_ask_for_its_own(daemon_factory, stores) -> None:
    daemon = daemon_factory("--max-skew", "0", "--group-timeout", "0.5")
    s = stores["streams"]
    with DataLoader(s, batch_size=4, rank=1, world_size=2, daemon=shard(daemon.socket)) as r1:
        next(r1)
        with pytest.raises(GroupTimeoutError, match=r"rank 1 waited its group_timeout of 0\.5 s for step 1, "
                           r"which needs rank 0 \(not joined\) to reach step 1 first \(max-skew 0\)"):
            next(r1)
    with DataLoader(s, batch_size=4, rank=1, world_size=2, daemon=shard(daemon.socket, 1.5)) as r1:
        next(r1)
        start = time.monotonic()
        with pytest.raises(GroupTimeoutError, match=r"group_timeout of 1\.5 s"):
            next(r1)
        assert time.monotonic() - start >= 1.5


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"group": "g", "group_timeout": 0}, ValueError, r"group_timeout must be in 0\.1\.\.86400 seconds, got 0"),
        ({"group": "g", "group_timeout": 86401}, ValueError, "got 86401"),
        ({"group": "g", "group_timeout": "5"}, TypeError, "group_timeout must be a number of seconds or None"),
        ({"group": "g", "group_timeout": True}, TypeError, "got bool"),
        ({"group_timeout": 5.0}, ValueError, "group_timeout needs a group"),
    ],
)
def test_group_timeout_validation_names_the_argument(kwargs, error, needle) -> None:
    with pytest.raises(error, match=needle):
        DaemonOptions("/nonexistent.sock", **kwargs)


def test_the_timeout_bounds_python_names_are_the_ones_the_engine_enforces() -> None:
    from loaderx.sources import DEFAULT_LIVENESS_TIMEOUT, MIN_GROUP_TIMEOUT, MIN_LIVENESS_TIMEOUT

    assert (MIN_LIVENESS_TIMEOUT, MIN_GROUP_TIMEOUT, DEFAULT_LIVENESS_TIMEOUT) == (1.0, 0.1, 10.0)
    assert DaemonOptions("/x.sock").liveness_timeout == DEFAULT_LIVENESS_TIMEOUT
    DaemonOptions("/x.sock", liveness_timeout=MIN_LIVENESS_TIMEOUT)
    DaemonOptions("/x.sock", group="g", group_timeout=MIN_GROUP_TIMEOUT)
    with pytest.raises(ValueError, match=r"liveness_timeout must be in 1\.\.86400 seconds, got 0\.999"):
        DaemonOptions("/x.sock", liveness_timeout=MIN_LIVENESS_TIMEOUT - 0.001)
    with pytest.raises(ValueError, match=r"group_timeout must be in 0\.1\.\.86400 seconds, got 0\.099"):
        DaemonOptions("/x.sock", group="g", group_timeout=MIN_GROUP_TIMEOUT - 0.001)


@pytest.mark.parametrize(
    ("value", "needle"),
    [("0", "group-timeout: '0' is not a number of seconds in 0.1..86400"),
     ("5m", "group-timeout: '5m' is not a number of seconds"),
     ("86401", "86401")],
)
def test_bad_group_timeout_flag_is_refused_naming_it(value: str, needle: str) -> None:
    r = subprocess.run(check=False, args=[loaderxd_binary(), "--group-timeout", value, "--check-config", "--socket", "/tmp/x.sock"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert needle in r.stderr
