"""On-disk integer narrowing (format 1.2, docs/format.md sections 3 and 5): compressed
integer stores keep each record's values in the fewest bytes that hold them and read
back exactly; ``narrow=False``, raw and float stores stay format 1.1; hostile width
codes and newer minors are refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import xxhash
from loaderx import _loaderx
from loaderx.dataloader import DataLoader
from loaderx.errors import CorruptStoreError
from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

sys.path.insert(0, os.path.dirname(__file__))
from store_fixtures import FIXTURES_1_1, dense_records, ragged_records, write_all

V11 = Path(__file__).resolve().parent.parent / "data" / "zrecord-1.1"
V12 = V11.parent / "zrecord-1.2"
INT_DTYPES = [np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
BOUNDARIES = [
    0,
    1,
    -1,
    127,
    128,
    -128,
    -129,
    255,
    256,
    32767,
    32768,
    -32768,
    -32769,
    65535,
    65536,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
]


def expected_plan(values: np.ndarray) -> tuple[int, bool]:
    """(bytes per stored value, zero-extended) as docs/format.md states the rule:
    unsigned values below 2**(8w) when none is negative (zero-extended for a signed
    dtype), else signed ones in [-2**(8w-1), 2**(8w-1)); (0, False) = full width."""
    if values.size == 0:
        return 0, False
    lo, hi = int(values.min()), int(values.max())
    for w in (1, 2, 4):
        if w >= values.dtype.itemsize:
            break
        if (lo >= 0 and hi < 2 ** (8 * w)) or (
            lo < 0 and -(2 ** (8 * w - 1)) <= lo and hi < 2 ** (8 * w - 1)
        ):
            return w, values.dtype.kind == "i" and lo >= 0
    return 0, False


def expected_width(values: np.ndarray) -> int:
    return expected_plan(values)[0]


GROUP = 64  # records per group of the 1.3 "groups" index
GROUP_ROW = 8 + 4 * GROUP


def read_meta(path: Path) -> dict:
    return msgpack.unpackb((path / "meta").read_bytes()[:-8])


def word_offset(k: int) -> int:
    """Byte offset of record k's u32 word in a "groups" index (docs/format.md, section 3)."""
    return (k // GROUP) * GROUP_ROW + 8 + (k % GROUP) * 4


def groups_body(n: int) -> int:
    return -(-n // GROUP) * 8 + 4 * n


def index_codes(path: Path, n: int) -> list[tuple[int, bool]]:
    """(width code, zero-extension bit) of every entry: bits 61..62 and 60 of an 8-byte
    "ends" entry, bits 28..29 and 30 of a "groups" word."""
    idx = (path / "index").read_bytes()
    if read_meta(path).get("layout") == "groups":
        words = [
            int.from_bytes(idx[word_offset(k) : word_offset(k) + 4], "little") for k in range(n)
        ]
        return [((w >> 28) & 3, bool((w >> 30) & 1)) for w in words]
    ends = np.frombuffer(idx, dtype="<u8", count=n)
    return [((int(e) >> 61) & 3, bool((int(e) >> 60) & 1)) for e in ends]


def index_widths(path: Path, n: int) -> list[int]:
    """The stored width of every record, in bytes (0: the itemsize)."""
    return [0 if c == 0 else 1 << (c - 1) for c, _ in index_codes(path, n)]


def index_plans(path: Path, n: int) -> list[tuple[int, bool]]:
    """(width, zero-extended) of every entry."""
    return [(0 if c == 0 else 1 << (c - 1), z) for c, z in index_codes(path, n)]


def boundary_records(dt: type) -> list[np.ndarray]:
    """16-value records at every width boundary that fits ``dt``, its extremes, and an
    incompressible record of random values fitting 16 bits."""
    info = np.iinfo(dt)
    recs = []
    for b in BOUNDARIES:
        if info.min <= b <= info.max:
            r = np.arange(16, dtype=np.int64) % 7
            r[::3] = b
            recs.append(r.astype(dt))
    recs.append(np.full(16, info.max, dt))
    recs.append(np.full(16, info.min, dt))
    rng = np.random.default_rng(1)
    noise_dt = np.int16 if info.min < 0 else np.uint16
    recs.append(
        rng.integers(np.iinfo(noise_dt).min, np.iinfo(noise_dt).max, 600, endpoint=True)
        .astype(noise_dt)
        .astype(dt)
    )
    return recs


def make_dict(recs: list[np.ndarray]) -> bytes:
    return train_dict([r for r in recs if r.size] * 20, size=1024)


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_ragged_integer_store_round_trips_at_every_width(
    tmp_path: Path, dt: type, codec: str
) -> None:
    recs = boundary_records(dt)
    recs.insert(2, np.zeros(0, dt))
    d = make_dict(recs) if codec == "zstd_dict" else None
    with Ragged.create(tmp_path / "s", dt, 1, codec=codec, data_shards=3, dict_bytes=d) as rs:
        rs.append(recs[:5])
        rs.append(recs[5:])
    widths = [expected_width(r) for r in recs]
    assert index_plans(tmp_path / "s", len(recs)) == [expected_plan(r) for r in recs]
    assert {w for w in widths if w} == {w for w in (1, 2, 4) if w < np.dtype(dt).itemsize}
    # Small records: the 1.3 "groups" index, which carries the same width bits.
    assert tuple(_loaderx.Store.open(str(tmp_path / "s")).format_version) == (1, 3)
    with Ragged.open(tmp_path / "s") as rs:
        assert rs.codec == codec and rs.dtype == np.dtype(dt)
        order = [int(k) for k in np.random.default_rng(2).permutation(len(recs))]
        for k, got in zip(order, rs[order], strict=True):
            assert got.dtype == np.dtype(dt) and got.shape == recs[k].shape
            np.testing.assert_array_equal(got, recs[k])
        np.testing.assert_array_equal(rs[len(recs) - 1], recs[-1])
        rs.verify()
    with (
        Ragged.open(tmp_path / "s") as rs,
        DataLoader({"t": rs}, batch_size=len(recs), mode=Sampler.Mode.Sequential) as loader,
    ):
        batch = next(loader)["t"]
    assert len(batch) == len(recs)
    for got, want in zip(batch, recs, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dense_integer_store_round_trips_at_every_width(
    tmp_path: Path, dt: type, codec: str
) -> None:
    recs = [r[:16] for r in boundary_records(dt)]
    recs.append(boundary_records(dt)[-1][100:116])  # 16 random values fitting 16 bits
    want = np.stack(recs).reshape(len(recs), 4, 4)
    d = make_dict(recs) if codec == "zstd_dict" else None
    with Dense.create(tmp_path / "s", dt, (4, 4), codec=codec, data_shards=2, dict_bytes=d) as ds:
        ds.append(want[:4])
        ds.append(want[4:])
    assert index_plans(tmp_path / "s", len(want)) == [expected_plan(r) for r in want]
    assert tuple(_loaderx.Store.open(str(tmp_path / "s")).format_version) == (1, 3)
    with Dense.open(tmp_path / "s") as ds:
        got = ds[0 : len(ds)]
        assert got.dtype == np.dtype(dt) and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        order = np.random.default_rng(3).permutation(len(want))
        np.testing.assert_array_equal(ds[order], want[order])
        ds.verify()
    with (
        Dense.open(tmp_path / "s") as ds,
        DataLoader({"x": ds}, batch_size=len(want), mode=Sampler.Mode.Sequential) as loader,
    ):
        batch = next(loader)["x"]
    assert batch.dtype == np.dtype(dt)
    np.testing.assert_array_equal(batch, want)


def test_format_1_1_integer_stores_of_the_previous_writer_read_exactly() -> None:
    for name, (kind, codec, shards) in FIXTURES_1_1.items():
        path = V11 / name
        assert tuple(_loaderx.Store.open(str(path)).format_version) == (1, 1), name
        if kind == "dense":
            want = dense_records(name)
            with Dense.open(path) as ds:
                assert (ds.codec, ds.data_shards) == (codec, shards)
                got = ds[0 : len(ds)]
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)
                ds.verify()
        else:
            want_r = ragged_records(name)
            with Ragged.open(path) as rs:
                assert (rs.codec, rs.data_shards, len(rs)) == (codec, shards, len(want_r))
                for got_r, w in zip(rs[list(range(len(rs)))], want_r, strict=True):
                    assert got_r.dtype == w.dtype and got_r.shape == w.shape
                    np.testing.assert_array_equal(got_r, w)
                rs.verify()


def test_narrow_false_writes_the_format_1_1_store_of_the_previous_writer(tmp_path: Path) -> None:
    # The same content with narrow=False: byte for byte the files the 1.1 writer wrote.
    write_all(str(tmp_path / "off"), FIXTURES_1_1, narrow=False)
    write_all(str(tmp_path / "on"), FIXTURES_1_1, narrow=True)
    for name in FIXTURES_1_1:
        files = sorted(os.listdir(V11 / name))
        assert sorted(os.listdir(tmp_path / "off" / name)) == files
        for f in files:
            assert (tmp_path / "off" / name / f).read_bytes() == (V11 / name / f).read_bytes(), (
                name,
                f,
            )
        assert tuple(_loaderx.Store.open(str(tmp_path / "off" / name)).format_version) == (1, 1)
        assert set(index_widths(tmp_path / "off" / name, 200)) == {0}
        # Narrowed, the same store (small records: the "groups" index) is 1.3 and smaller.
        assert tuple(_loaderx.Store.open(str(tmp_path / "on" / name)).format_version) == (1, 3)
        size = {
            v: sum(p.stat().st_size for p in (tmp_path / v / name).iterdir()) for v in ("on", "off")
        }
        assert size["on"] < size["off"], name


def read_fixture(path: Path, kind: str) -> list[np.ndarray]:
    cls = Dense if kind == "dense" else Ragged
    with cls.open(path) as s:
        s.verify()
        return list(s[list(range(len(s)))])


def test_format_1_2_stores_of_the_previous_writer_read_as_the_format_1_3_ones(
    tmp_path: Path,
) -> None:
    # The 1.2 writer's narrowed stores ("ends" index) and the current writer's
    # ("groups" index, bare blocks) of the same content read the same values.
    write_all(str(tmp_path / "on"), FIXTURES_1_1, narrow=True)
    for name, (kind, _codec, _shards) in FIXTURES_1_1.items():
        assert tuple(_loaderx.Store.open(str(V12 / name)).format_version) == (1, 2), name
        assert read_meta(V12 / name)["layout"] == "ends"
        assert read_meta(tmp_path / "on" / name)["layout"] == "groups"
        want = dense_records(name) if kind == "dense" else ragged_records(name)
        old, new = read_fixture(V12 / name, kind), read_fixture(tmp_path / "on" / name, kind)
        assert len(old) == len(new) == len(want), name
        for o, n, w in zip(old, new, want, strict=True):
            assert o.dtype == n.dtype == w.dtype and o.shape == n.shape == w.shape, name
            np.testing.assert_array_equal(o, w)
            np.testing.assert_array_equal(n, w)
        # Same data files but for the bare blocks (4 bytes shorter each), a smaller index.
        size = {
            d: sum(p.stat().st_size for p in d.iterdir())
            for d in (V12 / name, tmp_path / "on" / name)
        }
        assert size[tmp_path / "on" / name] < size[V12 / name], name


@pytest.mark.parametrize(
    "dt,codec", [(np.int32, "raw"), (np.float32, "zstd"), (np.uint8, "zstd"), (">i4", "zstd")]
)
def test_raw_float_byte_and_big_endian_stores_stay_format_1_1(
    tmp_path: Path, dt: object, codec: str
) -> None:
    recs = [np.arange(40, dtype=np.int64).astype(dt) for _ in range(10)]
    with Ragged.create(tmp_path / "s", dt, 1, codec=codec) as rs:
        rs.append(recs)
    assert tuple(_loaderx.Store.open(str(tmp_path / "s")).format_version) == (1, 1)
    assert index_widths(tmp_path / "s", 10) == [0] * 10
    with Dense.create(tmp_path / "d", dt, (40,), codec=codec) as ds:
        ds.append(np.stack(recs).astype(dt))
    assert tuple(_loaderx.Store.open(str(tmp_path / "d")).format_version) == (1, 1)


def rewrite_meta(path: Path, **changes: object) -> None:
    """Rewrites ``meta`` with keys changed, its checksum rebuilt (docs/format.md, section 2)."""
    raw = (path / "meta").read_bytes()
    m = msgpack.unpackb(raw[:-8])
    m.update(changes)
    body = msgpack.packb(m)
    (path / "meta").write_bytes(body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little"))


def set_width_code(path: Path, n: int, k: int, code: int) -> None:
    """Sets entry k's width code (bits 61..62 of an "ends" entry, 28..29 of a "groups"
    word), with the index's block checksums and ``meta`` rebuilt: a consistent but
    hostile store."""
    idx = bytearray((path / "index").read_bytes())
    if read_meta(path).get("layout") == "groups":
        at, size, shift, body = word_offset(k), 4, 28, groups_body(n)
    else:
        at, size, shift, body = 8 * k, 8, 61, 8 * n
    e = int.from_bytes(idx[at : at + size], "little")
    e = (e & ~(3 << shift)) | (code << shift)
    idx[at : at + size] = e.to_bytes(size, "little")
    assert n <= 4096  # one entry block
    idx[body : body + 8] = xxhash.xxh3_64_intdigest(bytes(idx[:body])).to_bytes(8, "little")
    (path / "index").write_bytes(bytes(idx))
    raw = (path / "meta").read_bytes()
    files = msgpack.unpackb(raw[:-8])["files"]
    files["index"] = [len(idx), xxhash.xxh3_64_intdigest(bytes(idx))]
    rewrite_meta(
        path, index_table_xxh3=xxhash.xxh3_64_intdigest(bytes(idx[body : body + 8])), files=files
    )


def write_tokens(path: Path, dt: object, narrow: bool = True) -> None:
    with Ragged.create(path, dt, 1, codec="zstd", narrow=narrow) as rs:
        rs.append([np.arange(40, dtype=np.int64).astype(dt) + k for k in range(30)])


def expect_corrupt_record(path: Path, k: int, why: str) -> None:
    with Ragged.open(path) as rs:
        with pytest.raises(CorruptStoreError, match=f"record {k}: {why}"):
            rs[k]
        with pytest.raises(CorruptStoreError, match=f"record {k}: {why}"):
            rs.verify()
        rs[k + 1]  # the others still read


def test_width_code_in_a_format_1_1_store_is_corruption_naming_the_record(tmp_path: Path) -> None:
    write_tokens(tmp_path / "s", np.int32, narrow=False)
    set_width_code(tmp_path / "s", 30, 7, 1)
    expect_corrupt_record(tmp_path / "s", 7, "width code 1 in a format 1.1 store")


def test_width_not_below_the_itemsize_is_corruption_naming_the_record(tmp_path: Path) -> None:
    write_tokens(tmp_path / "s", np.int16)
    assert index_widths(tmp_path / "s", 30)[3] == 1
    set_width_code(tmp_path / "s", 30, 3, 2)
    expect_corrupt_record(tmp_path / "s", 3, "stored width 2 bytes is not below the itemsize 2")


def test_width_code_on_a_float_store_is_corruption_naming_the_record(tmp_path: Path) -> None:
    write_tokens(tmp_path / "s", np.float32)
    set_width_code(tmp_path / "s", 30, 4, 1)
    expect_corrupt_record(tmp_path / "s", 4, "width code 1 in a format 1.1 store")
    rewrite_meta(tmp_path / "s", minor=2)  # claiming 1.2 does not make floats narrowable
    expect_corrupt_record(tmp_path / "s", 4, "width code 1 in a store of dtype '<f4'")


def test_signed_tokens_below_65536_take_two_bytes_and_read_back(tmp_path: Path) -> None:
    # GPT-2 token ids (0..50256) in int32: a sign-extended 2-byte value stops at 32767.
    recs = [
        np.array([50256, 32768, 0, 7], np.int32),
        np.array([32767, 1], np.int32),
        np.array([40000, -1], np.int32),
    ]
    with Ragged.create(tmp_path / "s", np.int32, 1, codec="zstd") as rs:
        rs.append(recs)
    assert index_plans(tmp_path / "s", 3) == [(2, True), (2, True), (0, False)]
    with Ragged.open(tmp_path / "s") as rs:
        for got, want in zip(rs[[0, 1, 2]], recs, strict=True):
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, want)


def test_a_newer_minor_is_refused_at_open(tmp_path: Path) -> None:
    write_tokens(tmp_path / "s", np.int32)
    rewrite_meta(tmp_path / "s", minor=4)
    with pytest.raises(
        CorruptStoreError,
        match=r"unsupported format version 1\.4 \(this reader supports 1\.0 to 1\.3\)",
    ):
        Ragged.open(tmp_path / "s")


def test_narrow_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        Ragged.create(tmp_path / "s", np.int32, 1, codec="zstd", narrow=1)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists()


def test_train_dict_learns_the_narrowed_bytes_of_integer_records() -> None:
    # int32 records of 0..50000 (each above 255) are stored as 2-byte unsigned values:
    # the dictionary trained on them is the one trained on those 2-byte values (all
    # records are sampled either way: 240 KB, below the 100 * size sampling budget).
    rng = np.random.default_rng(6)
    recs = [
        np.append(rng.integers(0, 50_000, int(n)), 40_000).astype(np.int32)
        for n in rng.integers(20, 200, 500)
    ]
    assert sum(r.nbytes for r in recs) < 100 * 4096
    narrowed = [r.astype(np.uint16) for r in recs]
    d = train_dict(recs, size=4096)
    assert d == train_dict(narrowed, size=4096, narrow=False)
    assert d != train_dict(recs, size=4096, narrow=False)
