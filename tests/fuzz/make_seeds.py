"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

fuzz_store: small real stores (every kind and codec, 1-3 data shards, a
dictionary) packed in fuzz_store.cc's input format; fuzz_wire: one frame of
every message type, as msgpack maps like the ones the peers send (the
decoder's strictness makes the fuzzer reach deep only from such seeds);
fuzz_ring needs none (it builds valid rings from its input). Re-run after a
format or protocol change: ``make fuzz-seeds``.
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

import msgpack
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))

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
    # Seeds are named by the format version that wrote them; older versions'
    # seeds stay in the corpus (every version is still read).
    major, minor = _loaderx.Store.open(str(tmp / "labels-raw")).format_version
    version = f"v{major}.{minor}"
    return {f"{name}-{version}": b for name, b in seeds.items()}


def wire_seeds() -> dict[str, bytes]:
    stream = {"label": "x", "has_shapes": False, "has_dict": False, "data_files": 1}
    msgs = {
        "hello": {"t": "hello", "major": 1, "minor": 1, "client_version": "0.1.0"},
        "hello_ok": {"t": "hello_ok", "major": 1, "minor": 1, "daemon_version": "0.1.0",
                     "incarnation": 5, "session": 2},
        "open": {"t": "open", "streams": [stream], "batch_size": 4, "mode": 2, "seed": 1, "rank": 0,
                 "world_size": 1, "start_step": 0, "prefetch": 2, "leases": 2, "ring_bytes": 0},
        "open_group": {"t": "open", "streams": [stream], "batch_size": 4, "mode": 1, "seed": 1,
                       "rank": 1, "world_size": 2, "start_step": 3, "prefetch": 2, "leases": 2,
                       "ring_bytes": 0, "group": "g", "group_mode": "shard", "join": "start_step"},
        "next": {"t": "next"},
        "seek": {"t": "seek", "step": 7},
        "release": {"t": "release", "slot": 1, "seq": 3},
        "stats": {"t": "stats"},
        "close": {"t": "close"},
        "ok": {"t": "ok"},
    }
    return {k: msgpack.packb(v) for k, v in msgs.items()}


def main() -> None:
    for target, seeds in (("fuzz_wire", wire_seeds()),):
        out = HERE / "corpus" / target
        out.mkdir(parents=True, exist_ok=True)
        for name, b in seeds.items():
            (out / name).write_bytes(b)
    with tempfile.TemporaryDirectory() as t:
        out = HERE / "corpus" / "fuzz_store"
        out.mkdir(parents=True, exist_ok=True)
        for name, b in store_seeds(Path(t)).items():
            (out / name).write_bytes(b)


if __name__ == "__main__":
    main()
