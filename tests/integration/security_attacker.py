"""A second user attacking a store of the first through loaderxd.

Run as root by tests/integration/test_security.py: it imports everything it
needs, then drops to ``uid``/``gid`` for good (so every file it opens and the
credentials loaderxd reads with SO_PEERCRED are the second user's) and runs
one attack. It prints one JSON object: ``{"served": [...bytes as ints...]}``
for the first batch it was served (``{"served": reply}`` for a raw protocol
attack: the daemon's reply to its ``open``, with the first pushed batch's
values when opened), or ``{"error": class, "mro": [...], "message": str}``.
The raw attacks speak protocol 1.3 (request ids, batches pushed under the
credit, no ``next``, binary ``batch``/``release``/``consumed`` frames:
wire_frames.py): an older hello would be refused before any ``open``.

Usage: security_attacker.py UID GID SOCKET OWNER_STORE WORKDIR ATTACK
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import sys
import traceback
from collections.abc import Callable

import loaderx.client  # noqa: F401 - imported before the uid drop
import msgpack
import numpy as np
import wire_frames
from loaderx._loaderx import PROTOCOL_VERSION
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense
from loaderx.zsampler import Sampler

BATCH = 8


def forge(owner: str, work: str, data: str) -> str:
    """A store directory of our own: links to the owner's meta and index, and
    data files that are zero-filled files of ours (``data="own"``) or links
    to the owner's (``data="link"``)."""
    forged = os.path.join(work, "forged")
    os.mkdir(forged)
    for name in os.listdir(owner):
        src, dst = os.path.join(owner, name), os.path.join(forged, name)
        if not name.startswith("data-") or data == "link":
            os.symlink(src, dst)
        else:
            with open(dst, "wb") as f:
                f.truncate(os.stat(src).st_size)
    return forged


def through_daemon(path: str, sock: str, **group: str) -> list[int]:
    with Dense.open(path) as ds, DataLoader({"x": ds}, batch_size=BATCH, mode=Sampler.Mode.Sequential,
                                            daemon=DaemonOptions(sock, **group)) as loader:
        return np.asarray(next(loader)["x"]).reshape(-1).tolist()


OPEN_ID = 1  # the raw client's id of its one `open`


def recv_frame(s: socket.socket) -> tuple[dict, list[int]]:
    """The next frame that is not a ``heartbeat`` (protocol 1.2 and later send them
    while a request is outstanding), with its fds; {"t": "hangup"} at EOF."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(s, 1 << 18, 4)
        except ConnectionResetError:  # dropped with our frames unread
            return {"t": "hangup"}, []
        if not data:
            return {"t": "hangup"}, fds
        msg = wire_frames.unpack(data)
        if msg.get("t") != "heartbeat":
            return msg, fds
        for fd in fds:
            os.close(fd)


def pushed_values(s: socket.socket, ring_fd: int, ring_bytes: int) -> object:
    """Protocol 1.2 and later: once ``opened``, the daemon pushes batches unasked (no
    ``next``). The first pushed frame: for a ``batch`` of generation 0, its
    values read from the ring the ``opened`` carried (as ints), else the frame."""
    msg, fds = recv_frame(s)
    for fd in fds:
        os.close(fd)
    if msg["t"] != "batch" or msg["gen"] != 0:
        return msg
    layout = msg["streams"][0]
    with mmap.mmap(ring_fd, ring_bytes, prot=mmap.PROT_READ) as ring:
        start = msg["offset"] + layout["values_offset"]
        return list(ring[start:start + layout["values_bytes"]])


def raw_open(sock: str, fds: list[int], data_files: int,
             then: Callable[[socket.socket], dict] | None = None) -> dict:
    """A hand-written protocol 1.3 client: hello, then one ``open`` (id
    OPEN_ID) of one dense stream announcing ``data_files`` shards and
    carrying exactly ``fds``. Returns the daemon's reply to the open (or
    {"t": "hangup"}); an ``opened`` gains "pushed": what pushed_values read,
    and "then": what ``then(socket)`` returned afterwards."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sock)
    s.send(wire_frames.pack({"t": "hello", "major": 1, "minor": 3, "client_version": "attacker"}))
    hello, _ = recv_frame(s)
    assert hello["t"] == "hello_ok" and f"1.{hello['minor']}" == PROTOCOL_VERSION, hello
    msg = {"t": "open", "id": OPEN_ID,
           "streams": [{"label": "x", "has_shapes": False, "has_dict": False, "data_files": data_files}],
           "batch_size": BATCH, "mode": 0, "seed": 0, "rank": 0, "world_size": 1, "start_step": 0,
           "prefetch": 1, "leases": 1, "ring_bytes": 0}
    socket.send_fds(s, [wire_frames.pack(msg)], fds)
    reply, got = recv_frame(s)
    try:
        if reply["t"] == "opened" and len(got) == 1:
            reply["pushed"] = pushed_values(s, got[0], reply["ring_bytes"])
            if then is not None:
                reply["then"] = then(s)
    finally:
        for fd in got:
            os.close(fd)
        s.close()
    return reply


def reply_to(s: socket.socket, request: dict) -> dict:
    """Sends ``request`` and returns the next frame that is not pushed (a
    batch or a pushed error) or a heartbeat: its reply, or {"t": "hangup"}
    if the daemon dropped the connection first."""
    try:
        s.send(wire_frames.pack(request))
    except (BrokenPipeError, ConnectionResetError):  # already dropped
        return {"t": "hangup"}
    while True:
        msg, fds = recv_frame(s)
        for fd in fds:
            os.close(fd)
        if msg["t"] != "batch" and not (msg["t"] == "error" and "gen" in msg):
            return msg


def forged_consumed(*frames: dict | bytes) -> Callable[[socket.socket], dict]:
    """Sends ``frames`` (forged ``consumed`` positions: messages, or raw
    bytes), then ``stats``: returns its reply, or the hang-up of a daemon
    that dropped us."""
    def run(s: socket.socket) -> dict:
        try:
            for f in frames:
                s.send(f if isinstance(f, bytes) else wire_frames.pack(f))
        except (BrokenPipeError, ConnectionResetError):  # dropped at an earlier frame
            return {"t": "hangup"}
        return reply_to(s, {"t": "stats", "id": OPEN_ID + 1})
    return run


def stale_consumed_flood(s: socket.socket) -> dict:
    """An accepted seek starts generation 1; then 1000 ``consumed`` of
    generation 0 (each ignored by the daemon), then ``stats``."""
    ok = reply_to(s, {"t": "seek", "id": OPEN_ID + 1, "step": 0})
    if ok["t"] != "ok":
        return ok
    try:
        for _ in range(1000):
            s.send(wire_frames.pack({"t": "consumed", "gen": 0, "step": 1}))
    except (BrokenPipeError, ConnectionResetError):  # dropped: not ignored
        return {"seek": ok, "stats": {"t": "hangup"}}
    return {"seek": ok, "stats": reply_to(s, {"t": "stats", "id": OPEN_ID + 2})}


def attack(kind: str, sock: str, owner: str, work: str) -> object:
    shards = sorted(n for n in os.listdir(owner) if n.startswith("data-"))
    if kind == "forged-own-data":
        return through_daemon(forge(owner, work, "own"), sock)
    if kind == "forged-own-data-group":
        return through_daemon(forge(owner, work, "own"), sock, group="shared", group_mode="broadcast")
    if kind == "forged-linked-data":
        return through_daemon(forge(owner, work, "link"), sock)
    if kind == "owner-path":
        return through_daemon(owner, sock)
    meta = os.open(os.path.join(owner, "meta"), os.O_RDONLY)
    index = os.open(os.path.join(owner, "index"), os.O_RDONLY)
    if kind == "raw-fewer-fds":  # announces every shard, passes none
        return raw_open(sock, [meta, index], len(shards))
    if kind == "raw-o-path":  # a handle that needs no read permission
        paths = [os.open(os.path.join(owner, n), os.O_PATH) for n in shards]
        return raw_open(sock, [meta, index, *paths], len(shards))
    own = []
    for n in shards:  # other files of exactly the right size
        p = os.path.join(work, "other-" + n)
        with open(p, "wb") as f:
            f.truncate(os.stat(os.path.join(owner, n)).st_size)
        own.append(os.open(p, os.O_RDONLY))
    if kind == "raw-other-files":
        return raw_open(sock, [meta, index, *own], len(shards))
    if kind == "raw-fewer-shards":  # announces and passes one shard of several
        return raw_open(sock, [meta, index, own[0]], 1)
    # Forged consumed positions on a loader of its own: only step 0 was
    # pushed (credit 1, the batch is never released).
    if kind == "raw-consumed-beyond-pushed":
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed({"t": "consumed", "gen": 0, "step": 1000}))
    if kind == "raw-consumed-backwards":
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed({"t": "consumed", "gen": 0, "step": 1},
                                        {"t": "consumed", "gen": 0, "step": 0}))
    if kind == "raw-consumed-future-gen":
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed({"t": "consumed", "gen": 2**64 - 1, "step": 1}))
    if kind == "raw-consumed-long-frame":  # a valid frame and one byte more
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed(wire_frames.pack({"t": "consumed", "gen": 0, "step": 1}) + b"\0"))
    if kind == "raw-consumed-waiting-2":
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed({"t": "consumed", "gen": 0, "step": 0, "waiting": 2}))
    if kind == "raw-consumed-msgpack":  # protocol 1.2's map: one encoding per type
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed(msgpack.packb({"t": "consumed", "gen": 0, "step": 1})))
    if kind == "raw-consumed-waiting":  # valid: true, then an explicit false
        return raw_open(sock, [meta, index, *own], len(shards),
                        forged_consumed({"t": "consumed", "gen": 0, "step": 0, "waiting": True},
                                        {"t": "consumed", "gen": 0, "step": 0, "waiting": False}))
    if kind == "raw-consumed-stale-flood":
        return raw_open(sock, [meta, index, *own], len(shards), stale_consumed_flood)
    raise SystemExit(f"unknown attack {kind}")


def main() -> None:
    uid, gid, sock, owner, work, kind = sys.argv[1:]
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    assert os.geteuid() == int(uid) and os.getuid() == int(uid)
    try:
        out: object = {"served": attack(kind, sock, owner, work)}
    except Exception as e:  # noqa: BLE001 - reported to the test
        out = {"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
               "message": str(e), "trace": traceback.format_exc()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
