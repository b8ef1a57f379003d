"""loaderx.mix: weighted mixing as a pure function of (seed, step, position), exact values,
realised shares within sampling error, exact resume on any thread count and world size."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loaderx.dataloader import DataLoader
from loaderx.errors import InvalidArgumentError, SchemaError, StateError
from loaderx.mix import DEFAULT_MIN_POSITIONS, Mixture, mix, mix_counts
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

# Each dataset k: "x" int64 scalars 1000 * k + i, "r" ragged int32 rows (i % 4 values of i).
LENGTHS = {"web": 101, "books": 37, "code": 13}
BASE = {"web": 0, "books": 1000, "code": 2000}


def build(root: Path, name: str, n: int) -> dict[str, Any]:
    base = BASE[name]
    with Dense.create(root / name / "x", np.int64, (), codec="zstd") as w:
        w.append(np.arange(n, dtype=np.int64) + base)
    with Ragged.create(root / name / "r", np.int32, 1, codec="raw") as rs:
        rs.append([np.full(i % 4, base + i, np.int32) for i in range(n)])
    return {"x": Dense.open(root / name / "x"), "r": Ragged.open(root / name / "r")}


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("mix")
    p = {name: build(root, name, n) for name, n in LENGTHS.items()}
    yield p
    for streams in p.values():
        for s in streams.values():
            s.close()


WEIGHTS = {"web": 0.6, "books": 0.3, "code": 0.1}


def mixture(parts: dict[str, Any], **kw: Any) -> Mixture:
    return mix({name: (parts[name], WEIGHTS[name]) for name in LENGTHS}, **kw)


def expected(m: Mixture, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dataset number, record) of each position, computed here from the counts."""
    starts = np.cumsum([0, *m.counts])
    k = np.searchsorted(starts, positions, side="right") - 1
    lengths = np.array([LENGTHS[n] for n in m.names])
    return k, (positions - starts[k]) % lengths[k]


def test_counts_apportion_the_positions_by_weight() -> None:
    counts = mix_counts([101, 37, 13], [0.6, 0.3, 0.1])
    # The minimum exceeds every n_k * W / w_k here; V is its next multiple of 10, the
    # shares' denominator, so every count is its share of V exactly.
    v = sum(counts)
    assert v == 16777220 == -(-DEFAULT_MIN_POSITIONS // 10) * 10
    assert counts == [v * 6 // 10, v * 3 // 10, v // 10]
    # A scarce dataset sets V: every dataset owns at least its own length.
    counts = mix_counts([1000, 10], [1, 1000], min_positions=1)
    assert counts[0] >= 1000 and counts[1] >= 10
    assert sum(counts) == math.ceil(Fraction(1000) / (Fraction(1) / Fraction(1001)))
    assert mix_counts([5], [2.5], min_positions=1) == [5]
    with pytest.raises(InvalidArgumentError):
        mix_counts([5, 5], [1.0], min_positions=1)
    with pytest.raises(InvalidArgumentError, match="2\\*\\*63"):
        mix_counts([10**12, 1], [1e-9, 1.0], min_positions=1)


def test_shares_are_the_exact_fractions_of_the_weights(parts: dict[str, Any]) -> None:
    m = mix({"web": (parts["web"], 0.7), "books": (parts["books"], 0.3)})
    assert m.shares() == {"web": 0.7, "books": 0.3}
    assert [Fraction(c, m.positions) for c in m.counts] == [Fraction(7, 10), Fraction(3, 10)]
    assert m.positions == 16777220  # the first multiple of 10 from 2**24
    m = mixture(parts)
    assert m.shares() == {"web": 0.6, "books": 0.3, "code": 0.1}
    # Weights need not add up to 1; thirds are thirds, integers are integers.
    assert mix_counts([101, 37], [1 / 3, 2 / 3], min_positions=10) == [101, 202]
    assert mix_counts([101, 37, 13], [2, 5, 1], min_positions=1) == [102, 255, 51]
    assert mix_counts([3, 3], [0.25, 0.75], min_positions=1) == [3, 9]
    # A share whose denominator exceeds V: apportioned within 1/V, V not enlarged.
    w = [0.123456789, 1.0]
    counts = mix_counts([5, 5], w, min_positions=1000)
    assert sum(counts) == 1000
    assert abs(Fraction(counts[0], 1000) - Fraction(13566680, 123456789)) < Fraction(1, 1000)


def test_every_sample_is_the_record_its_position_names(parts: dict[str, Any]) -> None:
    m = mixture(parts)
    assert m.names == ("web", "books", "code") and m.positions == sum(m.counts)
    assert all(len(s) == m.positions for s in m.values())
    for mode in ("IID", "Cyclic", "Sequential"):
        with DataLoader(m, batch_size=64, mode=mode, seed=11, num_threads=2) as loader:
            sampler = Sampler(m.positions, 64, mode, 11)
            for step in (0, 1, 5):
                loader.seek(step)
                batch = next(loader)
                pos = np.array(sampler.peek(step), dtype=np.int64)
                k, rec = expected(m, pos)
                assert batch["dataset"].dtype == np.int64
                assert batch["dataset"].tolist() == k.tolist()
                base = np.array([BASE[n] for n in m.names])[k]
                assert batch["x"].tolist() == (base + rec).tolist()
                for row, b, i in zip(batch["r"], base, rec):
                    assert row.dtype == np.int32 and row.tolist() == [b + i] * (i % 4)


def test_readers_index_like_stores(parts: dict[str, Any]) -> None:
    m = mixture(parts, source=None)
    assert sorted(m) == ["r", "x"]
    web = m.counts[0]
    assert m["x"][0] == 0 and m["x"][web - 1] == (web - 1) % 101
    assert m["x"][web] == 1000 and m["x"][m.positions - 1] == 2000 + (m.counts[2] - 1) % 13
    assert m["r"][[web + 3]][0].tolist() == [1003] * 3
    m.close()
    with pytest.raises(StateError):
        m["x"][0]
    assert len(parts["web"]["x"]) == 101  # the datasets' own stores stay open


def test_realised_shares_are_within_sampling_error(parts: dict[str, Any]) -> None:
    m = mixture(parts)
    steps, batch = 400, 512
    counts = np.zeros(3, np.int64)
    with DataLoader(m, batch_size=batch, mode="IID", seed=5) as loader:
        for _ in range(steps):
            counts += np.bincount(next(loader)["dataset"], minlength=3)
    n = steps * batch
    for k, name in enumerate(m.names):
        p = m.counts[k] / m.positions
        assert abs(p - WEIGHTS[name]) < 2**-20
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(counts[k] / n - p) < 5 * sigma, (name, counts[k] / n, p)


def test_a_cyclic_cycle_holds_exact_shares_and_every_record(parts: dict[str, Any]) -> None:
    # V set by the scarcest for its weight, ceil(101 / 0.6) = 169, rounded up to a multiple
    # of 10 (the shares are 6/10, 3/10, 1/10).
    m = mixture(parts, min_positions=1)
    assert m.positions == 170 and m.counts == (102, 51, 17)
    batch = 17  # a cycle of 10 steps covers all 170 positions
    cycle = m.positions // batch
    seen: list[list[int]] = [[], [], []]
    with DataLoader(m, batch_size=batch, mode="Cyclic", seed=2) as loader:
        for _ in range(cycle):
            b = next(loader)
            for k, x in zip(b["dataset"], b["x"]):
                seen[k].append(int(x) - BASE[m.names[k]])
    dropped = m.positions - cycle * batch  # Cyclic leaves out the remainder, as for records
    assert sum(len(s) for s in seen) == m.positions - dropped
    for k, name in enumerate(m.names):
        assert m.counts[k] >= LENGTHS[name]
        assert m.counts[k] - dropped <= len(seen[k]) <= m.counts[k]
    assert dropped == 0
    for k, name in enumerate(m.names):
        assert len(seen[k]) == m.counts[k]
        assert set(seen[k]) == set(range(LENGTHS[name]))


def test_resume_is_exact_on_any_thread_count_and_world_size(parts: dict[str, Any]) -> None:
    m = mixture(parts)
    with DataLoader(m, batch_size=48, mode="Cyclic", seed=9, num_threads=1, prefetch=1) as a:
        want = [next(a) for _ in range(8)]
    with DataLoader(m, batch_size=48, mode="Cyclic", seed=9, num_threads=4, prefetch=6) as b:
        for _ in range(3):
            next(b)
        state = b.state_dict()
    with DataLoader(m, batch_size=48, mode="Cyclic", seed=9, num_threads=3) as c:
        c.load_state_dict(state)
        for k in range(3, 8):
            got = next(c)
            assert got["dataset"].tolist() == want[k]["dataset"].tolist()
            assert got["x"].tolist() == want[k]["x"].tolist()
    halves = [DataLoader(m, batch_size=24, mode="Cyclic", seed=9, rank=r, world_size=2)
              for r in range(2)]
    try:
        for h in halves:
            h.load_state_dict(state)
        for k in range(3, 6):
            got = [next(h) for h in halves]
            assert np.concatenate([g["x"] for g in got]).tolist() == want[k]["x"].tolist()
    finally:
        for h in halves:
            h.close()


def test_refusals(parts: dict[str, Any], tmp_path: Path) -> None:
    web, books = parts["web"], parts["books"]
    with pytest.raises(InvalidArgumentError):
        mix({})
    with pytest.raises(TypeError, match="'web'"):
        mix({"web": web})  # type: ignore[dict-item]
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="'books'.*weight"):
            mix({"web": (web, 1), "books": (books, bad)})
    with pytest.raises(TypeError, match="weight"):
        mix({"web": (web, True)})
    with pytest.raises(InvalidArgumentError, match="same stream names"):
        mix({"web": (web, 1), "books": ({"x": books["x"]}, 1)})
    with pytest.raises(InvalidArgumentError, match="different lengths"):
        mix({"odd": ({"x": web["x"], "y": books["x"]}, 1)})
    with pytest.raises(InvalidArgumentError, match="source"):
        mix({"web": (web, 1)}, source="x")
    with Dense.create(tmp_path / "f", np.float64, (), codec="raw") as w:
        w.append(np.zeros(5))
    with Ragged.create(tmp_path / "r", np.int32, 1, codec="raw") as rs:
        rs.append([np.zeros(1, np.int32)] * 5)
    with Dense.open(tmp_path / "f") as f, Ragged.open(tmp_path / "r") as r, \
            pytest.raises(SchemaError, match="does not match"):
        mix({"web": (web, 1), "floats": ({"x": f, "r": r}, 1)})
    closed = Dense.open(tmp_path / "f")
    closed.close()
    with pytest.raises(StateError):
        mix({"c": ({"x": closed}, 1)})
