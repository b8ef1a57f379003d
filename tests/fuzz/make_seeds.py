"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

fuzz_store: small real stores (every kind and codec, 1-3 data shards, a
dictionary) packed in fuzz_store.cc's input format; fuzz_wire: one frame of
every protocol 1.3 message type and optional key, as the peers send them --
binary frames for batch, release and consumed, msgpack maps for the others
(tests/integration/wire_frames.py writes both; the decoder's strictness makes
the fuzzer reach deep only from such seeds);
fuzz_ring needs none (it builds valid rings from its input). Re-run after a
format or protocol change: ``make fuzz-seeds``.
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
sys.path.insert(0, str(HERE.parent / "integration"))

import wire_frames
from loaderx import _loaderx
from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged


def pack(path: Path) -> bytes:
    files = sorted(p.name for p in path.iterdir())
    data = sorted(f for f in files if f.startswith("data-"))
    shapes, dictionary = "shapes" in files, "dict" in files
    assert 1 <= len(data) <= 4, files
    flags = (len(data) - 1) | (4 if shapes else 0) | (8 if dictionary else 0)
    out = bytearray([flags])
    names = ["meta", "index", *(["shapes"] if shapes else []), *(["dict"] if dictionary else []), *data]
    for name in names:
        b = (path / name).read_bytes()
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def store_seeds(tmp: Path) -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    img = rng.integers(0, 8, (12, 4, 4), dtype=np.uint8)
    tok = [np.arange(i % 5 + 1, dtype=np.int32) * i for i in range(12)]
    seeds = {}
    for codec in ("raw", "zstd"):
        for shards in (1, 3):
            p = tmp / f"dense-{codec}-{shards}"
            with Dense.create(str(p), np.uint8, (4, 4), codec=codec, data_shards=shards) as w:
                w.append(img)
            seeds[p.name] = pack(p)
            p = tmp / f"ragged-{codec}-{shards}"
            with Ragged.create(str(p), np.int32, ndim=1, codec=codec, data_shards=shards) as w:
                w.append(tok)
            seeds[p.name] = pack(p)
    p = tmp / "labels-raw"
    with Dense.create(str(p), np.int64, (), codec="raw") as w:
        w.append(np.arange(20, dtype=np.int64))
    seeds[p.name] = pack(p)
    samples = np.tile(np.arange(64, dtype=np.uint8), (400, 1)) ^ rng.integers(0, 2, (400, 64), dtype=np.uint8)
    d = train_dict(samples, size=1024)
    p = tmp / "dense-zstd_dict"
    with Dense.create(str(p), np.uint8, (64,), codec="zstd_dict", dict_bytes=d) as w:
        w.append(samples[:10])
    seeds[p.name] = pack(p)
    p = tmp / "ragged-zstd-metadata"  # format 1.1: user metadata in meta
    with Ragged.create(str(p), np.uint16, ndim=2, codec="zstd", data_shards=2,
                       metadata={"names": ["a", "b"], "layout": "HW"}) as w:
        w.append([np.full((i % 3 + 1, 2), i, dtype=np.uint16) for i in range(9)])
    seeds[p.name] = pack(p)
    # Format 1.2: narrowed records of every width, zero- and sign-extended.
    p = tmp / "ragged-zstd-narrow"
    with Ragged.create(str(p), np.int64, ndim=1, codec="zstd", data_shards=2) as w:
        w.append([np.array([v, 1, 2, 3, 4, 5, 6, 7], dtype=np.int64)
                  for v in (0, 200, -100, 40000, -30000, 2**31, -(2**31) - 1, 2**40)])
    seeds[p.name] = pack(p)
    p = tmp / "dense-zstd_dict-narrow"
    blocks = (np.arange(40 * 32, dtype=np.int32).reshape(40, 32) * 37) % 50257
    with Dense.create(str(p), np.int32, (32,), codec="zstd_dict",
                      dict_bytes=train_dict(blocks, size=1024)) as w:
        w.append(blocks[:10])
    seeds[p.name] = pack(p)
    # Format 1.3: the "groups" index (three groups, the last short; bare
    # blocks with 1- and 2-byte content sizes, raw and full-width records).
    p = tmp / "ragged-zstd-groups"
    with Ragged.create(str(p), np.int32, ndim=1, codec="zstd", data_shards=2) as w:
        w.append([(np.arange(i % 150 + 1, dtype=np.int32) % 9) * 5000 + (2**31 - 1 if i % 40 == 7 else 0)
                  for i in range(150)])
    seeds[p.name] = pack(p)
    p = tmp / "ragged-zstd-2d-groups"
    with Ragged.create(str(p), np.uint32, ndim=2, codec="zstd") as w:
        w.append([np.full((i % 4 + 1, 3), i * 300, dtype=np.uint32) for i in range(70)])
    seeds[p.name] = pack(p)
    # Seeds are named by the format version that wrote them; older versions'
    # seeds stay in the corpus (every version is still read).
    named = {}
    for name, b in seeds.items():
        major, minor = _loaderx.Store.open(str(tmp / name)).format_version
        named[f"{name}-v{major}.{minor}"] = b
    return named


def wire_seeds() -> dict[str, bytes]:
    """One frame of every protocol 1.3 message (and of its optional keys),
    as the peers send them. Only the current protocol's frames: a 1.3 peer
    refuses an older hello, 1.1's ``next`` is an unknown type and 1.2's
    msgpack batch/release/consumed maps are refused, which a fuzzer reaches
    from any seed."""
    def layout(kind: int, values_offset: int, values_bytes: int, shapes_offset: int,
               offsets_offset: int) -> dict[str, int]:
        return {"kind": kind, "values_offset": values_offset, "values_bytes": values_bytes,
                "shapes_offset": shapes_offset, "offsets_offset": offsets_offset}

    stream = {"label": "x", "has_shapes": False, "has_dict": False, "data_files": 1}
    open_ = {"t": "open", "id": 1, "streams": [stream], "batch_size": 4, "mode": 2, "seed": 1, "rank": 0,
             "world_size": 1, "start_step": 0, "prefetch": 2, "leases": 2, "ring_bytes": 0}
    schema = {"kind": 0, "dtype": "|u1", "item_shape": [28, 28], "ndim": 2, "size": 70000}
    opened = {"t": "opened", "id": 1, "n": 70000, "slot_count": 5, "ring_bytes": 1 << 20, "leases": 2,
              "streams": [schema]}
    msgs = {
        "hello": {"t": "hello", "major": 1, "minor": 3, "client_version": "0.1.0"},
        "hello_ok": {"t": "hello_ok", "major": 1, "minor": 3, "daemon_version": "0.1.0",
                     "incarnation": 5, "session": 2, "heartbeat_ms": 250},
        "heartbeat": {"t": "heartbeat"},
        "open": open_,
        "open_group": {**open_, "id": 2, "mode": 1, "rank": 1, "world_size": 2, "start_step": 3,
                       "group": "g", "group_mode": "shard", "join": "start_step",
                       "group_timeout_ms": 5000},
        "open_ragged": {**open_, "id": 3, "streams": [
            {"label": "tok", "has_shapes": True, "has_dict": True, "data_files": 3}, stream]},
        "opened": opened,
        "opened_group": {**opened, "id": 2, "step": 3},
        "batch": {"t": "batch", "gen": 0, "step": 0, "slot": 1, "seq": 3, "offset": 4096,
                  "batch_size": 4, "total_bytes": 3136, "streams": [layout(0, 0, 3136, 0, 0)]},
        "batch_ragged": {"t": "batch", "gen": 2, "step": 9, "slot": 0, "seq": 11, "offset": 8192,
                         "batch_size": 4, "total_bytes": 640,
                         "streams": [layout(1, 128, 40, 0, 64), layout(0, 192, 448, 0, 0)]},
        "batch_64_streams": {"t": "batch", "gen": 1, "step": 5, "slot": 2**32 - 1, "seq": 2**64 - 1,
                             "offset": 1 << 40, "batch_size": 1, "total_bytes": 64 * 8,
                             "streams": [layout(i % 2, 8 * i, 8, 0, 0) for i in range(64)]},
        "seek": {"t": "seek", "id": 4, "step": 7},
        "ok": {"t": "ok", "id": 4, "step": 7, "gen": 1},
        "release": {"t": "release", "slot": 1, "seq": 3},
        "consumed": {"t": "consumed", "gen": 1, "step": 8},
        "consumed_waiting": {"t": "consumed", "gen": 1, "step": 8, "waiting": True},
        "stats": {"t": "stats", "id": 5},
        "stats_detail": {"t": "stats", "id": 6, "detail": True},
        "stats_reply": {"t": "stats_reply", "id": 5, "counters": {"sessions": 1, "slots_held": 2}},
        "stats_reply_status": {"t": "stats_reply", "id": 6, "counters": {"sessions": 1},
                               "status": '{"daemon": {"protocol": "1.3"}}'},
        "close": {"t": "close"},
        "error_reply": {"t": "error", "code": 2, "message": "out of range", "step": 0, "id": 4},
        "error_pushed": {"t": "error", "code": 4, "message": "corrupt", "step": 6, "gen": 1},
        "error_hello": {"t": "error", "code": 10, "message": "protocol version mismatch", "step": 0},
    }
    return {k: wire_frames.pack(v) for k, v in msgs.items()}


def main() -> None:
    out = HERE / "corpus" / "fuzz_wire"
    out.mkdir(parents=True, exist_ok=True)
    seeds = wire_seeds()
    for stale in out.iterdir():  # frames of an older protocol (see wire_seeds)
        if stale.name not in seeds:
            stale.unlink()
    for name, b in seeds.items():
        (out / name).write_bytes(b)
    with tempfile.TemporaryDirectory() as t:
        out = HERE / "corpus" / "fuzz_store"
        out.mkdir(parents=True, exist_ok=True)
        for name, b in store_seeds(Path(t)).items():
            (out / name).write_bytes(b)


if __name__ == "__main__":
    main()
