"""loaderxd end to end: a real daemon process, real sockets, real stores."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import msgpack
import numpy as np
import pytest
import wire_frames
from conftest import assert_same_batch, loaderxd_binary
from loaderx import client as lxclient
from loaderx.dataloader import DataLoader
from loaderx.errors import DaemonError, LoaderClosedError, ResourceExhausted
from loaderx.zsampler import Sampler

Mode = Sampler.Mode


@pytest.mark.parametrize("mode", [Mode.IID, Mode.Cyclic, Mode.Sequential])
def test_batch_sequence_is_byte_identical_to_embedded(daemon, stores, mode) -> None:
    s = stores["streams"]
    with DataLoader(s, batch_size=16, mode=mode, seed=3, daemon=daemon.socket) as remote, \
            DataLoader(s, batch_size=16, mode=mode, seed=3) as local:
        for _ in range(40):
            assert remote.step == local.step
            assert_same_batch(next(remote), next(local))


def test_values_are_the_gathered_records(daemon, stores) -> None:
    s = stores["streams"]
    with DataLoader(s, batch_size=8, mode=Mode.Sequential, daemon=daemon.socket) as loader:
        loader.seek(3)  # records 24..31
        batch = next(loader)
    np.testing.assert_array_equal(batch["image"], stores["images"][24:32])
    np.testing.assert_array_equal(batch["label"], np.arange(24, 32) * 3)
    assert batch["image"].dtype == np.uint8 and batch["label"].dtype == np.int64
    assert [t.tolist() for t in batch["tokens"]] == [stores["tokens"][i].tolist() for i in range(24, 32)]


def test_arrays_are_writable_private_zero_copy_views_owning_the_lease(daemon, stores) -> None:
    with DataLoader(stores["streams"], batch_size=8, mode=Mode.Sequential,
                    daemon=daemon.socket) as loader:
        batch = next(loader)
        image, tokens = batch["image"], batch["tokens"]
        assert image.flags.writeable and tokens[0].flags.writeable
        # A write lands in this process's copy of the page only.
        image[0] = 7
        tokens[0][:] = -1
        assert (image[0] == 7).all() and (tokens[0] == -1).all()
        np.testing.assert_array_equal(image[1:], stores["images"][1:8])
        # One lease object owns every view of the batch.
        assert image.base is tokens[0].base is batch["label"].base
        assert np.shares_memory(image, image[3])
        # The batch and the one pushed ahead of it (the push window of one;
        # the credit of 16 is what it may hold, not what is pushed).
        daemon.settled(slots_held=2, batches_served=1, releases=0)
        del batch, image
        time.sleep(0.05)
        assert daemon.stats()["releases"] == 0  # tokens still views the slot
        del tokens
        gc.collect()
        assert daemon.wait_stat("releases", 1)["releases"] == 1
        # The daemon's slot was never written: the same step again is intact.
        loader.seek(0)
        again = next(loader)
        np.testing.assert_array_equal(again["image"], stores["images"][0:8])
        assert again["tokens"][0].tolist() == stores["tokens"][0].tolist()


def test_shared_view_gives_read_only_views_of_the_ring(daemon, stores) -> None:
    opts = lxclient.DaemonOptions(daemon.socket, shared_view=True)
    with DataLoader(stores["streams"], batch_size=8, mode=Mode.Sequential, daemon=opts) as loader:
        batch = next(loader)
        image, tokens = batch["image"], batch["tokens"]
        assert not image.flags.writeable and not tokens[0].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            image[0, 0, 0, 0] = 1
        np.testing.assert_array_equal(image, stores["images"][0:8])


@pytest.mark.parametrize("timeout", [-1.0, -1e-9, float("nan")])
def test_negative_timeout_is_refused_on_both_hosts(daemon, stores, timeout: float) -> None:
    from loaderx.errors import InvalidArgumentError
    from loaderx.sources import SourceSpec, open_source

    spec = SourceSpec(names=tuple(stores["streams"]), n=200, batch_size=4, mode=1, seed=1,
                      rank=0, world_size=1, start_step=0, prefetch=2, num_threads=1)
    for daemon_arg in (None, daemon.socket):
        source = open_source(stores["streams"], spec, daemon_arg)
        try:
            with pytest.raises(InvalidArgumentError, match="timeout must be None or >= 0"):
                source.next_raw(timeout)
            assert source.step == 0  # nothing consumed
        finally:
            source.close()


def test_a_corrupt_records_step_fails_alone_and_alike_on_both_hosts(daemon, tmp_path: Path) -> None:
    # A step whose gather fails reaches the client as a pushed step error
    # (through the push queue from a 1.4 daemon): raised for that step only,
    # with the embedded loader's class and message, and the loader goes on.
    from loaderx.errors import CorruptStoreError
    from loaderx.zrecord import Dense

    path = tmp_path / "c"
    x = np.repeat(np.arange(64, dtype=np.uint8)[:, None], 1024, axis=1)
    with Dense.create(str(path), x.dtype, x.shape[1:], codec="zstd", data_shards=1) as s:
        s.append(x)
    data = path / "data-000"
    b = bytearray(data.read_bytes())
    b[len(b) // 2:] = b"\xff" * (len(b) - len(b) // 2)  # the frames of records 32.. and on
    data.write_bytes(bytes(b))

    def outcomes(**kw: object) -> list[object]:
        out: list[object] = []
        with Dense.open(str(path)) as s, DataLoader({"x": s}, batch_size=8, mode=Mode.Sequential, **kw) as dl:
            for step in range(8):
                try:
                    got = next(dl)["x"]
                    assert np.array_equal(got, x[step * 8:(step + 1) * 8])
                    out.append(step)
                except CorruptStoreError as e:
                    assert dl.step == step + 1  # the failed step is consumed
                    out.append(str(e))
        return out

    local = outcomes()
    assert local[:4] == [0, 1, 2, 3]
    for step in range(4, 8):
        assert isinstance(local[step], str) and local[step].startswith(f"step {step}: "), local[step]
        assert f"record {step * 8}" in local[step]
    assert outcomes(daemon=daemon.socket) == local


def test_seek_state_dict_and_start_step_resume_identically(daemon, stores) -> None:
    s = stores["streams"]
    with DataLoader(s, batch_size=4, seed=9, daemon=daemon.socket) as remote, \
            DataLoader(s, batch_size=4, seed=9) as local:
        for _ in range(5):
            next(remote)
        state = remote.state_dict()
        assert state["step"] == 5
        remote.seek(100)
        local.seek(100)
        assert_same_batch(next(remote), next(local))
    with DataLoader(s, batch_size=4, seed=9, start_step=5, daemon=daemon.socket) as resumed, \
            DataLoader(s, batch_size=4, seed=9, start_step=5) as local:
        assert resumed.step == 5
        assert_same_batch(next(resumed), next(local))
    with DataLoader(s, batch_size=4, seed=9, daemon=daemon.socket) as loaded:
        loaded.load_state_dict(state)
        with DataLoader(s, batch_size=4, seed=9, start_step=5) as local:
            assert_same_batch(next(loaded), next(local))


def test_transform_runs_on_daemon_batches_and_its_errors_propagate(daemon, stores) -> None:
    def transform(batch):
        if int(batch["label"][0]) == -1:
            raise RuntimeError("never")
        return batch["label"].sum()

    s = stores["streams"]
    with DataLoader(s, batch_size=8, transform=transform, daemon=daemon.socket) as remote, \
            DataLoader(s, batch_size=8, transform=transform) as local:
        assert [next(remote) for _ in range(10)] == [next(local) for _ in range(10)]

    def boom(batch):
        raise KeyError("boom")

    with DataLoader(s, batch_size=8, transform=boom, daemon=daemon.socket) as loader:
        with pytest.raises(KeyError, match="boom"):
            next(loader)
        assert loader.step == 1


def test_holding_any_number_of_batches_works_and_each_keeps_its_bytes(daemon_factory, stores) -> None:
    d = daemon_factory("--max-leases", "4")
    s = stores["streams"]
    with DataLoader(s, batch_size=8, mode=Mode.Sequential) as ref:
        expected = [next(ref) for _ in range(200)]
    with DataLoader(s, batch_size=8, mode=Mode.Sequential, daemon=d.socket) as loader:
        held = []
        for i in range(200):
            held.append(next(loader))
            if i == 1:  # written while still in the ring: the write moves out with it
                held[1]["image"][0] = 7
                held[1]["tokens"][0][:] = -1
            assert loader._source.leases_held <= 4
        moved = loader._source.batches_moved_out
        assert 196 - 4 <= moved <= 200 - 1, moved  # the pushed-ahead window may hold a few
        held[0]["label"][:] = -5  # written after it moved out: private, as before
        assert loader.step == 200
    expected[1]["image"][0] = 7
    expected[1]["tokens"][0][:] = -1
    expected[0]["label"][:] = -5
    for i, (got, want) in enumerate(zip(held, expected)):
        for name in ("image", "label"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"step {i} {name}")
        assert [t.tolist() for t in got["tokens"]] == [t.tolist() for t in want["tokens"]], i
    # The daemon's slots were never written through the moved batches.
    with DataLoader(s, batch_size=8, mode=Mode.Sequential, daemon=d.socket) as again:
        first = next(again)
        np.testing.assert_array_equal(first["label"], np.arange(8) * 3)
        np.testing.assert_array_equal(first["image"], stores["images"][0:8])


def test_holding_past_the_lease_cap_of_shared_views_raises_instead_of_hanging(
    daemon_factory, stores
) -> None:
    d = daemon_factory("--max-leases", "3")
    opts = lxclient.DaemonOptions(path=d.socket, shared_view=True)
    with DataLoader(stores["streams"], batch_size=4, daemon=opts) as loader:
        held = [next(loader) for _ in range(3)]
        start = time.monotonic()
        with pytest.raises(ResourceExhausted, match="lease cap 3"):
            next(loader)
        assert time.monotonic() - start < 1.0
        assert loader.step == 3
        held.pop(0)
        gc.collect()
        assert next(loader) is not None
        assert loader.step == 4


CLIENT_THAT_HOLDS = textwrap.dedent(
    """
    import sys, time
    from loaderx.zrecord import Dense
    from loaderx.dataloader import DataLoader
    s = {"image": Dense.open(sys.argv[2])}
    loader = DataLoader(s, batch_size=4, daemon=sys.argv[1])
    held = [next(loader) for _ in range(3)]
    if len(sys.argv) > 3:
        import os
        if os.fork() == 0:  # a child that outlives its parent
            time.sleep(30)
            os._exit(0)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def spawn_holder(daemon, stores, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT_THAT_HOLDS, daemon.socket, str(stores["dir"] / "images"), *extra],
        stdout=subprocess.PIPE, env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def test_sigkilled_client_has_its_slots_reclaimed_and_others_go_on(daemon, stores) -> None:
    with DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket) as other:
        mine = next(other)
        proc = spawn_holder(daemon, stores)
        # Each holds what it took plus the one batch pushed ahead: 1 + 1 here,
        # 3 + 1 in the holder.
        before = daemon.settled(loaders=2, slots_held=6, batches_served=4)
        proc.kill()
        proc.wait()
        assert daemon.wait_stat("loaders", 1)["loaders"] == 1
        after = daemon.settled(slots_held=2)  # leases go after the loader
        assert after["ring_bytes"] < before["ring_bytes"]
        np.testing.assert_array_equal(mine["label"], mine["label"])  # still mapped
        assert next(other)["image"].shape == (4, 3, 8, 8)


def test_forked_child_does_not_keep_the_session_alive(daemon, stores) -> None:
    proc = spawn_holder(daemon, stores, "fork")
    assert daemon.stats()["loaders"] == 1
    proc.kill()
    proc.wait()
    # The child sleeps on, holding copies of every fd; the session still ends
    # (the loader first, then its leases: the daemon stops the group before
    # it frees the slots).
    assert daemon.wait_stat("loaders", 0)["loaders"] == 0
    assert daemon.wait_stat("slots_held", 0)["slots_held"] == 0


def test_forked_child_cannot_use_or_corrupt_the_session(daemon, stores) -> None:
    with DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket) as loader:
        first = next(loader)
        copy = first["image"].copy()
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                try:
                    next(loader)
                except DaemonError:
                    code = 0 if np.array_equal(first["image"], copy) else 2
                del first
                gc.collect()  # must not release the parent's slot
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        # The child released nothing: the parent's batch and the one
        # pushed ahead are still leased.
        daemon.settled(stale_releases=0, releases=0, slots_held=2, batches_served=1)
        np.testing.assert_array_equal(first["image"], copy)
        assert loader.step == 1
        with DataLoader(stores["streams"], batch_size=4, start_step=1) as local:
            assert_same_batch(next(loader), next(local))


def stop_with_nothing_queued(daemon, loader: DataLoader) -> None:
    """SIGSTOPs the daemon once the loader (credit 2, holding one batch) has
    taken the one batch pushed ahead: its next next() has to wait."""
    assert daemon.wait_stat("slots_held", 2)["slots_held"] == 2
    daemon.proc.send_signal(signal.SIGSTOP)
    next(loader)  # the one pushed ahead, dropped: its release waits in the socket


def test_daemon_sigkill_unblocks_next_within_a_second_and_restart_resumes(daemon, stores) -> None:
    from loaderx.client import DaemonOptions

    s = stores["streams"]
    loader = DataLoader(s, batch_size=4, daemon=DaemonOptions(daemon.socket, leases=2))
    held = next(loader)
    copy = held["image"].copy()
    stop_with_nothing_queued(daemon, loader)  # next() now blocks: nothing comes
    result: dict = {}

    def consume() -> None:
        try:
            next(loader)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            result["exc"] = exc
            result["at"] = time.monotonic()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    killed_at = time.monotonic()
    daemon.kill(signal.SIGKILL)
    t.join(5)
    assert not t.is_alive()
    assert isinstance(result["exc"], DaemonError)
    assert result["at"] - killed_at < 1.0
    np.testing.assert_array_equal(held["image"], copy)  # still readable
    step = loader.step
    assert step == 2
    loader.close()

    daemon.start()  # same socket, fresh process
    with DataLoader(s, batch_size=4, daemon=daemon.socket) as again, \
            DataLoader(s, batch_size=4, start_step=step) as local:
        again.seek(step)
        for _ in range(5):
            assert_same_batch(next(again), next(local))


def test_close_from_another_thread_wakes_a_blocked_next(daemon, stores) -> None:
    from loaderx.client import DaemonOptions

    loader = DataLoader(stores["streams"], batch_size=4,
                        daemon=DaemonOptions(daemon.socket, leases=2))
    held = next(loader)
    stop_with_nothing_queued(daemon, loader)
    errors: list = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(LoaderClosedError, next, loader)))
    t.start()
    time.sleep(0.2)
    loader.close()
    t.join(5)
    assert not t.is_alive() and errors
    daemon.proc.send_signal(signal.SIGCONT)
    del held


def _raw_hello(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    sock.send(msgpack.packb({"t": "hello", "major": 1, "minor": 3, "client_version": "fuzz"}))
    reply = msgpack.unpackb(sock.recv(65536))
    assert reply["t"] == "hello_ok"
    return sock


def test_loaderxd_reports_the_package_version(daemon) -> None:
    """`loaderxd --version`, the hello reply and the status all carry
    loaderx.__version__ (python/loaderx/_version.py, read by CMakeLists.txt)."""
    from loaderx import __version__

    r = subprocess.run([loaderxd_binary(), "--version"], capture_output=True, text=True, timeout=30, check=False)
    assert (r.returncode, r.stdout) == (0, f"loaderxd {__version__}\n")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(daemon.socket)
    sock.send(msgpack.packb({"t": "hello", "major": 1, "minor": 3, "client_version": "x"}))
    reply = msgpack.unpackb(sock.recv(65536))
    sock.close()
    assert reply["t"] == "hello_ok" and reply["daemon_version"] == __version__
    assert lxclient.connect(daemon.socket).stats()["daemon"]["version"] == __version__


def test_protocol_major_mismatch_is_refused_naming_both_versions(daemon) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(daemon.socket)
    sock.send(msgpack.packb({"t": "hello", "major": 99, "minor": 3, "client_version": "x"}))
    reply = msgpack.unpackb(sock.recv(65536))
    assert reply["t"] == "error"
    assert "99.3" in reply["message"] and "1.0" in reply["message"]
    sock.settimeout(2)
    assert sock.recv(10) == b""  # and the connection is closed


PROBE_IDS = 1 << 40  # request ids no mutated frame carries


def _probe_answered(sock: socket.socket, probe: int) -> bool:
    """Reads until the reply to stats request ``probe`` (True) or a hang-up (False)."""
    sock.settimeout(10)  # a daemon that neither answers nor hangs up fails the test
    while True:
        data = sock.recv(1 << 18)
        if data == b"":
            return False
        if data[:1] == b"\xc1":  # a binary frame: nothing is pushed without a loader
            raise AssertionError(f"binary frame {data[:2].hex()} on a connection with no loader")
        reply = msgpack.unpackb(data)
        if reply.get("id") == probe:
            assert reply["t"] == "stats_reply", reply
            return True


def test_ten_thousand_malformed_frames_leave_the_daemon_serving(daemon, stores) -> None:
    rng = np.random.default_rng(5)
    open_without_fds = msgpack.packb(
        {"t": "open", "streams": [{"label": "x", "has_shapes": False, "has_dict": False,
                                   "data_files": 1}],
         "batch_size": 1, "mode": 1, "seed": 0, "rank": 0, "world_size": 1, "start_step": 0,
         "prefetch": 1, "leases": 1, "ring_bytes": 0, "id": 1})
    valid = [
        msgpack.packb({"t": "seek", "id": 1, "step": 1}),
        wire_frames.pack({"t": "consumed", "gen": 0, "step": 1}),
        wire_frames.pack({"t": "release", "slot": 0, "seq": 1}),
        msgpack.packb({"t": "release", "slot": 0, "seq": 1}),  # protocol 1.2's form: refused
        open_without_fds,
    ]
    devnull = os.open(os.devnull, os.O_RDONLY)
    with DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket) as good, \
            DataLoader(stores["streams"], batch_size=4) as local:
        sock = _raw_hello(daemon.socket)
        sent, drops, start = 0, 0, time.monotonic()
        while sent < 10_000 and time.monotonic() - start < 120:
            kind = sent % 6
            if kind == 0:
                frame = rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
            elif kind == 1:  # mutated valid message
                b = bytearray(valid[int(rng.integers(len(valid)))])
                for _ in range(int(rng.integers(1, 4))):
                    b[int(rng.integers(len(b)))] = int(rng.integers(256))
                frame = bytes(b)
            elif kind == 2:  # wrong types / unknown keys
                frame = msgpack.packb({"t": "next", "bogus": [1, 2, {"x": b"y"}]})
            elif kind == 3:  # huge length claims
                frame = bytes([0xdd, 0xff, 0xff, 0xff, 0xff]) + b"\x00" * 8
            elif kind == 4:  # open announcing fds it does not carry
                frame = open_without_fds
            else:
                frame = msgpack.packb({"t": "stats", "id": sent + 1})
            try:
                if kind == 5 and sent % 12 == 5:  # fds where none are expected
                    sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            np.array([devnull], dtype=np.int32).tobytes())])
                else:
                    sock.send(frame)
                sent += 1
                # Then a probe: its reply means the frame was survived (answered or
                # ignored), a hang-up that it was dropped; never a silence to time.
                probe = PROBE_IDS + sent
                sock.send(msgpack.packb({"t": "stats", "id": probe}))
                dropped = not _probe_answered(sock, probe)
            except TimeoutError as e:  # an OSError, but no hang-up: the daemon stopped answering
                raise AssertionError(f"frame {sent} ({frame[:16].hex()}): no reply and no hang-up") from e
            except OSError:
                dropped = True
            if dropped:
                drops += 1
                sock.close()
                sock = _raw_hello(daemon.socket)
            if sent % 50 == 0:  # the good client is served throughout
                assert_same_batch(next(good), next(local))
        sock.close()
        assert sent == 10_000
        assert_same_batch(next(good), next(local))
    os.close(devnull)
    assert daemon.proc.poll() is None
    daemon.wait_stat("loaders", 0)
    stats = daemon.wait_stat("slots_held", 0)
    assert drops > 8000  # every malformed frame cost its sender the connection...
    assert stats["protocol_errors"] >= drops
    assert stats["loaders"] == 0 and stats["slots_held"] == 0  # ...and nothing else
    assert daemon.wait_stat("sessions", 0)["sessions"] == 0  # (this stats query is not counted)


def test_per_uid_session_cap_refuses_clearly(daemon_factory, stores) -> None:
    d = daemon_factory("--sessions-per-uid", "2")

    def open_when_room() -> DataLoader:
        # Arrange only: the fixture's readiness probe ends asynchronously.
        for _ in range(100):
            try:
                return DataLoader(stores["streams"], batch_size=4, daemon=d.socket)
            except ResourceExhausted:
                time.sleep(0.01)
        raise AssertionError("no room for a second session")

    a = open_when_room()
    b = open_when_room()
    # Two loaders hold both sessions of this uid: a third is refused, clearly.
    with pytest.raises(ResourceExhausted, match="sessions-per-uid"):
        DataLoader(stores["streams"], batch_size=4, daemon=d.socket)
    a.close()
    b.close()


def test_per_uid_ring_memory_cap_refuses_clearly(daemon_factory, stores) -> None:
    d = daemon_factory("--memory-limit", "64M", "--memory-per-uid", "1M")
    with pytest.raises(ResourceExhausted, match="memory-per-uid"):
        DataLoader(stores["streams"], batch_size=190, prefetch=8, daemon=d.socket)
    assert d.stats()["ring_bytes"] == 0
    with DataLoader(stores["streams"], batch_size=2, daemon=d.socket) as small:
        assert next(small)["label"].shape == (2,)


def test_no_daemon_is_daemon_error_and_auto_falls_back_with_warning(tmp_path, stores, monkeypatch) -> None:
    missing = str(tmp_path / "nobody.sock")
    with pytest.raises(DaemonError, match="nobody.sock"):
        DataLoader(stores["streams"], batch_size=4, daemon=missing)
    monkeypatch.setenv("LOADERXD_SOCKET", missing)
    with pytest.warns(RuntimeWarning, match="no loaderxd answered"):
        loader = DataLoader(stores["streams"], batch_size=4, seed=1, daemon="auto")
    with loader, DataLoader(stores["streams"], batch_size=4, seed=1) as local:
        assert_same_batch(next(loader), next(local))
    with pytest.raises(DaemonError):
        lxclient.connect(missing)


def test_a_build_without_the_client_refuses_daemon_and_auto_falls_back(daemon, stores,
                                                                       monkeypatch) -> None:
    # loaderxd and its client are Linux-only; elsewhere the extension is
    # built without them (HAVE_DAEMON_CLIENT false): daemon= says so by name
    # even with a daemon answering, "auto" and fallback=True load in process.
    from loaderx import _loaderx

    monkeypatch.setattr(_loaderx, "HAVE_DAEMON_CLIENT", False)
    options = lxclient.DaemonOptions(daemon.socket, leases=2)  # nothing to check it with
    for choice in (daemon.socket, True, options):
        with pytest.raises(DaemonError, match="no loaderxd client .* load in this process"):
            DataLoader(stores["streams"], batch_size=4, daemon=choice)
    for choice in ("auto", lxclient.DaemonOptions(daemon.socket, fallback=True)):
        with pytest.warns(RuntimeWarning, match="no loaderxd client"):
            loader = DataLoader(stores["streams"], batch_size=4, seed=1, daemon=choice)
        with loader, DataLoader(stores["streams"], batch_size=4, seed=1) as local:
            assert_same_batch(next(loader), next(local))
    assert daemon.stats()["loaders"] == 0


def test_daemon_true_and_auto_use_the_default_socket(daemon, stores, monkeypatch) -> None:
    monkeypatch.setenv("LOADERXD_SOCKET", daemon.socket)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for choice in (True, "auto"):
            with DataLoader(stores["streams"], batch_size=4, daemon=choice) as loader:
                next(loader)
                # (the previous iteration's session may still be closing)
                assert daemon.wait_stat("loaders", 1)["loaders"] == 1
    c = lxclient.connect()
    assert c.path == daemon.socket
    assert daemon.wait_stat("sessions", 0)["sessions"] == 0  # both loaders gone; polls not counted
    with c.loader(stores["streams"], batch_size=4) as loader:
        assert next(loader)["label"].shape == (4,)


def test_missing_store_is_reported_not_fallen_back(daemon, stores, tmp_path) -> None:
    from loaderx.zrecord import Dense

    x = np.zeros((10, 2), np.float32)
    path = str(tmp_path / "gone")
    with Dense.create(path, x.dtype, (2,), codec="raw") as w:
        w.append(x)
    s = Dense.open(path)
    import shutil

    shutil.rmtree(path)
    from loaderx.errors import StoreNotFoundError

    with pytest.raises(StoreNotFoundError):
        DataLoader({"x": s}, batch_size=2, daemon=daemon.socket)
    s.close()


def test_socket_mode_and_clean_sigterm_shutdown(daemon) -> None:
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o660
    assert daemon.stop() == 0
    assert not os.path.exists(daemon.socket)


def test_stale_socket_is_replaced_and_live_one_is_refused(daemon_factory, tmp_path) -> None:
    from conftest import loaderxd_binary

    d = daemon_factory()
    second = subprocess.run([loaderxd_binary(), "--foreground", "--socket", d.socket],
                            check=False, capture_output=True, timeout=10)
    assert second.returncode == 1 and b"another loaderxd" in second.stderr
    d.kill(signal.SIGKILL)
    assert os.path.exists(d.socket)  # left behind by the crash
    d.start()  # takes the stale socket over
    assert d.stats()["sessions"] >= 0


def test_check_config_validates_and_exits(tmp_path) -> None:
    from conftest import loaderxd_binary

    conf = tmp_path / "d.conf"
    conf.write_text("memory-limit = 2G\nmax-leases = 9\n")
    ok = subprocess.run([loaderxd_binary(), "--check-config", "--config", str(conf),
                         "--socket", str(tmp_path / "s")], check=False, capture_output=True, timeout=10)
    assert ok.returncode == 0 and b"configuration OK" in ok.stdout
    conf.write_text("max-leases = lots\n")
    bad = subprocess.run([loaderxd_binary(), "--check-config", "--config", str(conf),
                          "--socket", str(tmp_path / "s")], check=False, capture_output=True, timeout=10)
    assert bad.returncode == 2 and b"d.conf:1" in bad.stderr


def test_detached_start_returns_once_listening(tmp_path) -> None:
    from conftest import loaderxd_binary
    from loaderx import _loaderx

    sock = str(tmp_path / "bg.sock")
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    r = subprocess.run([loaderxd_binary(), "--socket", sock], env=env, check=False, timeout=10)
    assert r.returncode == 0
    stats = _loaderx.daemon_stats(sock)  # answers at once: no race with startup
    assert stats["sessions"] == 0  # the asking connection is not counted
    # The detached daemon is no child of ours: find it by its command line.
    pid = None
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if sock.encode() in cmd and b"--socket" in cmd:
                pid = int(entry)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    for _ in range(200):
        if not os.path.exists(sock):
            break
        time.sleep(0.02)
    assert not os.path.exists(sock)


def test_ctrl_c_in_a_blocked_next_consumes_no_step(daemon, stores) -> None:
    import _thread

    from loaderx.client import DaemonOptions

    s = stores["streams"]
    with DataLoader(s, batch_size=4, seed=2, daemon=DaemonOptions(daemon.socket, leases=2)) \
            as loader, DataLoader(s, batch_size=4, seed=2) as local:
        held = next(loader)
        assert_same_batch(held, next(local))
        stop_with_nothing_queued(daemon, loader)  # takes step 1; the next push is late
        next(local)
        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            next(loader)
        assert time.monotonic() - start < 1.0
        daemon.proc.send_signal(signal.SIGCONT)
        assert loader.step == 2
        # The batch pushed late is the next batch: nothing skipped or repeated.
        del held
        for _ in range(3):
            assert_same_batch(next(loader), next(local))
        assert loader.step == 5


def test_ctrl_c_in_a_seek_then_next_returns_the_sought_step(daemon, stores) -> None:
    # The seek left before Ctrl-C, so the daemon performs it: the next next()
    # must be the sought step's batch, not one collected before the seek.
    import _thread

    from loaderx.client import DaemonOptions

    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, leases=3)
    with DataLoader(s, batch_size=4, seed=2, daemon=opts) as loader, \
            DataLoader(s, batch_size=4, seed=2, start_step=7) as local:
        first = next(loader)
        # Step 1 is pushed unread (the push window): the seek must release
        # it, not return it.
        daemon.settled(slots_held=2, batches_served=1, releases=0)
        del first
        daemon.proc.send_signal(signal.SIGSTOP)  # the seek's reply is late
        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            loader.seek(7)
        assert time.monotonic() - start < 1.0
        daemon.proc.send_signal(signal.SIGCONT)
        assert_same_batch(next(loader), next(local))
        assert loader.step == 8
        assert_same_batch(next(loader), next(local))
        # first freed, step 1 released unread, steps 7 and 8 freed; 9 pushed.
        daemon.settled(slots_held=1, batches_served=3, releases=4, stale_releases=0)


def test_daemon_options_set_the_lease_cap_and_ring_size(daemon, stores) -> None:
    from loaderx.client import DaemonOptions

    s = {"tokens": stores["streams"]["tokens"]}
    # A ring too small for one batch: the step fails naming the knob...
    with DataLoader(s, batch_size=150, daemon=DaemonOptions(daemon.socket, ring_bytes=4096)) as tight:
        with pytest.raises(ResourceExhausted, match="ring_bytes"):
            next(tight)
        assert tight.step == 1  # a failed step is consumed, as embedded
    # ...and a bigger one serves it, with the requested lease cap.
    c = lxclient.connect(daemon.socket)
    with c.loader(s, 64, leases=2, ring_bytes=1 << 20, seed=4) as roomy, \
            DataLoader(s, batch_size=64, seed=4) as local:
        held = [next(roomy), next(roomy)]
        assert_same_batch(held[0], next(local))
        assert roomy._source.lease_cap == 2
        held.append(next(roomy))  # past the cap: the oldest held batch moves out of the ring
        assert roomy._source.batches_moved_out == 1
        for batch in held[1:]:
            assert_same_batch(batch, next(local))
    with pytest.raises(TypeError, match="DaemonOptions"):
        DataLoader(s, batch_size=4, daemon=3.5)


def test_a_stopped_daemon_raises_daemon_error_after_the_liveness_timeout(
    daemon_factory, stores
) -> None:
    d = daemon_factory()
    opts = lxclient.DaemonOptions(d.socket, liveness_timeout=1.5, leases=2)
    with DataLoader(stores["streams"], batch_size=4, mode=Mode.Sequential, daemon=opts) as loader, \
            DataLoader(stores["streams"], batch_size=4, mode=Mode.Sequential) as local:
        held = next(loader)
        assert_same_batch(held, next(local))
        assert d.proc is not None
        stop_with_nothing_queued(d, loader)  # takes step 1: nothing more can come
        next(local)
        try:
            t0 = time.monotonic()
            with pytest.raises(DaemonError, match="liveness timeout 1500 ms"):
                next(loader)
            took = time.monotonic() - t0
            assert 1.4 < took < 10, took  # not before the timeout, and not forever
            assert loader.step == 2  # nothing consumed
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        # The daemon is back: the push that was due arrives, and it is step 2.
        del held
        for _ in range(5):
            assert_same_batch(next(loader), next(local))


def test_a_stall_within_the_liveness_timeout_goes_on_with_correct_batches(
    daemon_factory, stores
) -> None:
    d = daemon_factory()
    opts = lxclient.DaemonOptions(d.socket, liveness_timeout=5.0)
    with DataLoader(stores["streams"], batch_size=4, seed=3, daemon=opts) as loader, \
            DataLoader(stores["streams"], batch_size=4, seed=3) as local:
        assert d.proc is not None
        for k in range(12):
            if k in (3, 8):  # stall 1 s, with the client blocked in next()
                os.kill(d.proc.pid, signal.SIGSTOP)
                threading.Timer(1.0, os.kill, (d.proc.pid, signal.SIGCONT)).start()
            assert_same_batch(next(loader), next(local))
        assert loader.step == 12


@pytest.mark.parametrize("bad", [0, 0.5, -1.0, float("nan"), 1e9])
def test_liveness_timeout_out_of_range_is_refused(bad: float) -> None:
    from loaderx.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="liveness_timeout"):
        lxclient.DaemonOptions(liveness_timeout=bad)
    with pytest.raises(TypeError, match="liveness_timeout"):
        lxclient.DaemonOptions(liveness_timeout="10")  # type: ignore[arg-type]
