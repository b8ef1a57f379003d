"""A client cannot read through loaderxd what it cannot read itself.

The owner (root here) keeps a store whose data files only it may read
(0600) open through a real loaderxd, so the daemon has it mapped; a second
uid (``nobody``) then attacks it: a directory linking the owner's ``meta``
and ``index`` beside zero-filled data files of its own (the leak this file
was written for: the daemon used to recognise a store by its metadata file
alone and served the owner's records), the same joined into a group of the
same name, links to the owner's data, the owner's path itself, and a
hand-written protocol 1.3 client passing fewer fds, ``O_PATH`` handles, or
other files of the right size (it reads the batch the daemon pushes into
the ring it was given). Every attack gets an error or its own
zeros, never one byte of the owner's records. Forged ``consumed``
positions drop only the forger's connection.
docs/daemon.md, "Security".
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import Daemon
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense
from loaderx.zsampler import Sampler

ROOT = Path(__file__).resolve().parents[2]
ATTACKER = Path(__file__).with_name("security_attacker.py")
BATCH = 8  # security_attacker.BATCH
OPEN_ID = 1  # security_attacker.OPEN_ID: the id its raw `open` carries, echoed by the reply
N = 64

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second uid")


class World:
    def __init__(self, base: Path) -> None:
        self.base = base
        nobody = pwd.getpwnam("nobody")
        self.uid, self.gid = nobody.pw_uid, nobody.pw_gid
        self.daemon = Daemon(base / "d.sock", ["--socket-mode", "0666"])
        self.records = (np.arange(N * 16, dtype=np.uint32).reshape(N, 16) * 2654435761 % 251 + 1
                        ).astype(np.uint8)
        assert self.records.min() >= 1  # no owner record byte is 0, so zeros are never the owner's

    def owner_store(self, name: str, shards: int) -> str:
        path = str(self.base / name)
        with Dense.create(path, np.uint8, (16,), codec="raw", data_shards=shards) as w:
            w.append(self.records)
        os.chmod(path, 0o755)
        for f in os.listdir(path):
            os.chmod(os.path.join(path, f), 0o600 if f.startswith("data-") else 0o644)
        return path

    def attack(self, kind: str, owner: str) -> dict:
        work = tempfile.mkdtemp(dir=self.base)
        os.chown(work, self.uid, self.gid)
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        r = subprocess.run([sys.executable, str(ATTACKER), str(self.uid), str(self.gid),
                            self.daemon.socket, owner, work, kind],
                           check=False, capture_output=True, text=True, timeout=60, env=env,
                           cwd="/")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="lxsec-"))
    os.chmod(base, 0o755)
    w = World(base)
    yield w
    w.daemon.kill()
    shutil.rmtree(base, ignore_errors=True)


def owner_batch(w: World, owner: str, **group: str) -> tuple[DataLoader, Dense, np.ndarray]:
    ds = Dense.open(owner)
    loader = DataLoader({"x": ds}, batch_size=BATCH, mode=Sampler.Mode.Sequential,
                        daemon=DaemonOptions(w.daemon.socket, **group))
    first = np.array(next(loader)["x"])
    np.testing.assert_array_equal(first, w.records[:BATCH])
    return loader, ds, first


@pytest.mark.parametrize("shards", [1, 3])
def test_linked_meta_with_own_data_files_is_served_its_own_zeros(world: World, shards: int) -> None:
    owner = world.owner_store("s", shards)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        out = world.attack("forged-own-data", owner)
        assert "served" in out, out
        assert out["served"] == [0] * (BATCH * 16)
        # The owner's mapping is untouched and still serves the owner.
        np.testing.assert_array_equal(np.array(next(loader)["x"]), world.records[BATCH:2 * BATCH])


def test_same_group_name_from_another_uid_is_another_group(world: World) -> None:
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner, group="shared", group_mode="broadcast")
    with loader, ds:
        out = world.attack("forged-own-data-group", owner)
        assert out.get("served") == [0] * (BATCH * 16), out


@pytest.mark.parametrize("kind", ["forged-linked-data", "owner-path"])
def test_unreadable_data_files_fail_in_the_client(world: World, kind: str) -> None:
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        out = world.attack(kind, owner)
        assert "served" not in out, out
        assert "OSError" in out["mro"], out
        assert "Permission denied" in out["message"] and "data-" in out["message"], out


def test_raw_client_announcing_more_fds_than_it_passes_is_dropped(world: World) -> None:
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        out = world.attack("raw-fewer-fds", owner)
        reply = out["served"]
        assert reply["t"] in ("error", "hangup"), reply
        assert reply["t"] != "opened"
        np.testing.assert_array_equal(np.array(next(loader)["x"]), world.records[BATCH:2 * BATCH])


def test_raw_client_passing_o_path_handles_is_refused(world: World) -> None:
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        reply = world.attack("raw-o-path", owner)["served"]
        assert reply["t"] == "error" and reply["id"] == OPEN_ID, reply
        assert "not open for reading" in reply["message"], reply
        assert "data 0" in reply["message"], reply


def test_raw_client_passing_other_files_of_the_right_size_gets_a_store_of_its_own(world: World) -> None:
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        assert world.daemon.stats()["stores"] == 1
        reply = world.attack("raw-other-files", owner)["served"]
        # Opened, but from the attacker's own files: the batch the daemon
        # pushed (protocol 1.2, unasked) is the attacker's zeros, read from
        # the ring it was given; the owner's loader goes on untouched.
        assert reply["t"] == "opened" and reply["id"] == OPEN_ID, reply
        assert reply["pushed"] == [0] * (BATCH * 16), reply
        np.testing.assert_array_equal(np.array(next(loader)["x"]), world.records[BATCH:2 * BATCH])


def test_raw_client_passing_fewer_shards_than_the_metadata_lists_is_refused(world: World) -> None:
    owner = world.owner_store("s", 3)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        reply = world.attack("raw-fewer-shards", owner)["served"]
        assert reply["t"] == "error" and reply["id"] == OPEN_ID, reply
        assert "1 data files, metadata says 3" in reply["message"], reply


@pytest.mark.parametrize("kind", ["raw-consumed-beyond-pushed", "raw-consumed-backwards",
                                  "raw-consumed-future-gen", "raw-consumed-long-frame",
                                  "raw-consumed-waiting-2", "raw-consumed-msgpack"])
def test_forged_consumed_positions_drop_only_that_connection(world: World, kind: str) -> None:
    # `consumed {gen, step, waiting}` moves group positions, so a position
    # the daemon never pushed, one going backwards, a generation it never
    # started, a frame longer than its 19 bytes, a `waiting` byte other than
    # 0/1 or protocol 1.2's msgpack map of it is a protocol error: that
    # connection is dropped (its stats request goes unanswered) and counted;
    # the owner's loader goes on with its next batch.
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        errors = world.daemon.stats()["protocol_errors"]
        out = world.attack(kind, owner)
        assert "served" in out, out
        reply = out["served"]
        assert reply["t"] == "opened" and reply["pushed"] == [0] * (BATCH * 16), reply
        assert reply["then"] == {"t": "hangup"}, reply
        assert world.daemon.stats()["protocol_errors"] == errors + 1
        np.testing.assert_array_equal(np.array(next(loader)["x"]), world.records[BATCH:2 * BATCH])


def test_consumed_with_the_waiting_byte_one_or_zero_is_accepted(world: World) -> None:
    # `waiting` 1 at the attacker's own position (0: step 0 was pushed, not
    # taken), then `waiting` 0 at the same position: both valid, nothing
    # moves, the connection stays and its stats request is answered.
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        errors = world.daemon.stats()["protocol_errors"]
        reply = world.attack("raw-consumed-waiting", owner)["served"]
        assert reply["t"] == "opened" and reply["pushed"] == [0] * (BATCH * 16), reply
        assert reply["then"]["t"] == "stats_reply" and reply["then"]["id"] == OPEN_ID + 1, reply
        assert world.daemon.stats()["protocol_errors"] == errors
        np.testing.assert_array_equal(np.array(next(loader)["x"]), world.records[BATCH:2 * BATCH])


def test_consumed_of_an_older_generation_is_ignored(world: World) -> None:
    # After an accepted seek (generation 1), 1000 `consumed` frames of
    # generation 0 (sent before the seek, as far as the daemon can tell) are
    # no-ops: the connection stays and its next request is answered.
    owner = world.owner_store("s", 2)
    loader, ds, _ = owner_batch(world, owner)
    with loader, ds:
        errors = world.daemon.stats()["protocol_errors"]
        reply = world.attack("raw-consumed-stale-flood", owner)["served"]
        assert reply["t"] == "opened", reply
        assert reply["then"]["seek"] == {"t": "ok", "id": OPEN_ID + 1, "step": 0, "gen": 1}, reply
        assert reply["then"]["stats"]["t"] == "stats_reply", reply
        assert reply["then"]["stats"]["id"] == OPEN_ID + 2, reply
        assert world.daemon.stats()["protocol_errors"] == errors
        np.testing.assert_array_equal(np.array(next(loader)["x"]), world.records[BATCH:2 * BATCH])
