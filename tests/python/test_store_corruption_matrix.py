"""Store corruption matrix (docs/reliability.md).

For stores of every layout (dense raw, dense zstd, dense zstd_dict, ragged
zstd 1-D, ragged raw 2-D, two data shards each; the int32 ones narrow, so they
take format 1.3's "groups" index and bare zstd blocks) and every file: single-byte
flips at many offsets, truncations, appended garbage, empty files, and files
swapped between two stores of the same schema. Every case must end in
``CorruptStoreError`` at open or read, or in ``verify()`` raising
``CorruptStoreError``; when neither raises the values read must be exactly
the originals (a flip in bytes nothing reads, for example padding). Never a
crash, a hang, another exception class, or silently wrong values.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pytest
from loaderx.errors import CorruptStoreError
from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged

N = 300
OFFSETS_PER_FILE = 24


def build(kind: str, path: Path, seed: int) -> list[np.ndarray] | np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "dense-zstd-i4":  # token-like values: narrowed to 2 bytes, "groups" index
        data = rng.integers(0, 4, (N, 6, 6)) * 12_000 + rng.integers(0, 2, (N, 6, 6))
        data = data.astype(np.int32)
        with Dense.create(str(path), np.int32, (6, 6), codec="zstd", data_shards=2) as w:
            w.append(data)
        return data
    if kind.startswith("dense"):
        data = (rng.integers(0, 4, (N, 6, 6)) * 17).astype(np.uint8)
        codec = kind.split("-")[1]
        kw = {"dict_bytes": train_dict(data, size=1024)} if codec == "zstd_dict" else {}
        with Dense.create(str(path), np.uint8, (6, 6), codec=codec, data_shards=2, **kw) as w:
            w.append(data)
        return data
    if kind == "ragged-zstd-1d":
        recs = [(rng.integers(0, 3, int(rng.integers(1, 40))) * 5).astype(np.int32) for _ in range(N)]
        with Ragged.create(str(path), np.int32, ndim=1, codec="zstd", data_shards=2) as w:
            w.append(recs)
        return recs
    recs = [rng.integers(0, 9, (int(rng.integers(1, 5)), int(rng.integers(1, 5)))).astype(np.int16)
            for _ in range(N)]
    with Ragged.create(str(path), np.int16, ndim=2, codec="raw", data_shards=2) as w:
        w.append(recs)
    return recs


KINDS = [
    "dense-raw",
    "dense-zstd",
    "dense-zstd_dict",
    "dense-zstd-i4",
    "ragged-zstd-1d",
    "ragged-raw-2d",
]
GROUPS = {"dense-zstd-i4", "ragged-zstd-1d"}


def outcome(path: Path, kind: str, want) -> str:
    """'refused' (CorruptStoreError at open, read or verify) or 'exact'; anything else fails."""
    cls = Dense if kind.startswith("dense") else Ragged
    try:
        with cls.open(str(path)) as ds:
            got = ds[0:N]
            ds.verify()
    except CorruptStoreError as e:
        assert path.name in str(e) or "/" in str(e), e  # names the store or a file of it
        return "refused"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), "silently wrong values"
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), "silently wrong values"
    return "exact"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("pristine")
    return {k: (base / k, build(k, base / k, 1), base / (k + "-b"), build(k, base / (k + "-b"), 2))
            for k in KINDS}


def cases(path: Path) -> list[tuple[str, str, Callable[[Path], None]]]:
    rng = random.Random(path.name)
    out: list[tuple[str, str, Callable[[Path], None]]] = []
    for f in sorted(p.name for p in path.iterdir()):
        size = (path / f).stat().st_size
        offsets = sorted({0, size - 1, *(rng.randrange(size) for _ in range(OFFSETS_PER_FILE))}) if size else []
        for off in offsets:
            bit = rng.randrange(8)

            def flip(p: Path, f=f, off=off, bit=bit) -> None:
                b = bytearray((p / f).read_bytes())
                b[off] ^= 1 << bit
                (p / f).write_bytes(bytes(b))
            out.append((f, f"flip@{off}", flip))
        for cut in sorted({0, 1, size // 2, max(size - 1, 0)}):
            def trunc(p: Path, f=f, cut=cut) -> None:
                with open(p / f, "r+b") as fh:
                    fh.truncate(cut)
            out.append((f, f"truncate@{cut}", trunc))
        def append(p: Path, f=f) -> None:
            with open(p / f, "ab") as fh:
                fh.write(b"\x00garbage\xff" * 3)
        out.append((f, "append", append))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_region_flip_truncation_and_garbage(pristine, tmp_path: Path, kind: str) -> None:
    src, want, _, _ = pristine[kind]
    tally = {"refused": 0, "exact": 0}
    for i, (f, what, damage) in enumerate(cases(src)):
        work = tmp_path / f"c{i}"
        shutil.copytree(src, work)
        damage(work)
        try:
            tally[outcome(work, kind, want)] += 1
        except AssertionError as e:
            raise AssertionError(f"{kind}: {f} {what}: {e}") from None
        shutil.rmtree(work)
    assert tally["refused"] > 0, tally


@pytest.mark.parametrize("kind", KINDS)
def test_files_swapped_between_two_stores_of_one_schema_are_refused(pristine, tmp_path: Path, kind: str) -> None:
    src, want, other, _ = pristine[kind]
    for f in sorted(p.name for p in src.iterdir()):
        work = tmp_path / f"swap-{f}"
        shutil.copytree(src, work)
        shutil.copyfile(other / f, work / f)
        # The other store's file differs (other values), so the store must be refused.
        if (other / f).read_bytes() == (src / f).read_bytes():
            continue
        assert outcome(work, kind, want) == "refused", f"{kind}: {f} from another store was accepted"


@pytest.mark.parametrize("kind", KINDS)
def test_empty_files_are_refused(pristine, tmp_path: Path, kind: str) -> None:
    src, want, _, _ = pristine[kind]
    for f in sorted(p.name for p in src.iterdir()):
        if (src / f).stat().st_size == 0:
            continue  # already empty (a data shard no record reached): nothing changes
        work = tmp_path / f"empty-{f}"
        shutil.copytree(src, work)
        (work / f).write_bytes(b"")
        assert outcome(work, kind, want) == "refused", f"{kind}: empty {f} was accepted"


@pytest.mark.parametrize("kind", KINDS)
def test_the_matrix_covers_the_groups_layout(pristine, kind: str) -> None:
    meta = msgpack.unpackb((pristine[kind][0] / "meta").read_bytes()[:-8])
    assert (meta["layout"] == "groups") == (kind in GROUPS)
    assert meta["minor"] == (3 if kind in GROUPS else 1)
