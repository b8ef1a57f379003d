"""Hypothesis properties of loaderx.zsampler.Sampler: resume equality, sharding,
Cyclic permutations, Sequential arithmetic and the IID range."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from loaderx.zsampler import Mode, Sampler

modes = st.sampled_from([Mode.Sequential, Mode.IID, Mode.Cyclic])
seeds = st.integers(min_value=0, max_value=(1 << 64) - 1)
# Special sizes: 1, 2, primes, powers of two and their neighbours.
special_ns = st.sampled_from(
    [1, 2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 4093]
    + [1 << k for k in range(1, 13)]
    + [(1 << k) - 1 for k in range(2, 13)]
    + [(1 << k) + 1 for k in range(1, 13)]
)
ns = st.one_of(special_ns, st.integers(min_value=1, max_value=5000))


@st.composite
def configs(draw: st.DrawFn, max_world: int = 4) -> tuple[int, int, Mode, int, int]:
    """(n, batch_size, mode, seed, world_size) valid for the mode."""
    mode = draw(modes)
    n = draw(ns)
    world = draw(st.integers(min_value=1, max_value=max_world))
    if mode is Mode.Cyclic:
        world = min(world, n)
        batch = draw(st.integers(min_value=1, max_value=n // world))
    else:
        batch = draw(st.integers(min_value=1, max_value=3 * n + 3))
    return n, batch, mode, draw(seeds), world


@settings(max_examples=150, deadline=None)
@given(cfg=configs(), step=st.integers(min_value=0, max_value=60))
def test_seek_then_next_equals_the_step_th_draw_of_a_fresh_sampler(
    cfg: tuple[int, int, Mode, int, int], step: int
) -> None:
    n, batch, mode, seed, world = cfg
    fresh = Sampler(n, batch, mode, seed, world_size=world, rank=world - 1)
    for _ in range(step):
        fresh.next()
    expected = fresh.next().copy()
    sought = Sampler(n, batch, mode, seed, world_size=world, rank=world - 1)
    sought.next()
    sought.seek(step)
    np.testing.assert_array_equal(sought.next(), expected)
    started = Sampler(n, batch, mode, seed, world_size=world, rank=world - 1, start_step=step)
    np.testing.assert_array_equal(started.next(), expected)


@settings(max_examples=150, deadline=None)
@given(cfg=configs(max_world=6), step=st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_shards_concatenate_to_the_global_batch(
    cfg: tuple[int, int, Mode, int, int], step: int
) -> None:
    n, batch, mode, seed, world = cfg
    shards = [
        Sampler(n, batch, mode, seed, rank=r, world_size=world).peek(step) for r in range(world)
    ]
    whole = Sampler(n, batch * world, mode, seed).peek(step)
    np.testing.assert_array_equal(np.concatenate(shards), whole)


@settings(max_examples=200, deadline=None)
@given(
    n=ns,
    data=st.data(),
    seed=seeds,
    cycle=st.integers(min_value=0, max_value=1 << 40),
)
def test_cyclic_is_a_permutation_within_each_cycle(
    n: int, data: st.DataObject, seed: int, cycle: int
) -> None:
    world = data.draw(st.integers(min_value=1, max_value=min(n, 4)), label="world")
    batch = data.draw(st.integers(min_value=1, max_value=n // world), label="batch")
    ranks = [Sampler(n, batch, Mode.Cyclic, seed, rank=r, world_size=world) for r in range(world)]
    steps = n // (batch * world)
    assert ranks[0].cycle_steps == steps
    drawn = np.concatenate(
        [r.peek(cycle * steps + k) for k in range(steps) for r in ranks]
    ).astype(np.int64)
    assert drawn.size == steps * batch * world
    assert drawn.min() >= 0 and drawn.max() < n
    assert np.unique(drawn).size == drawn.size  # no repeat within a cycle
    if n % (batch * world) == 0:
        np.testing.assert_array_equal(np.sort(drawn), np.arange(n))


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=(1 << 64) - 1),
    batch=st.integers(min_value=1, max_value=300),
    world=st.integers(min_value=1, max_value=8),
    data=st.data(),
    step=st.integers(min_value=0, max_value=(1 << 64) - 1),
)
def test_sequential_is_global_position_modulo_n(
    n: int, batch: int, world: int, data: st.DataObject, step: int
) -> None:
    rank = data.draw(st.integers(min_value=0, max_value=world - 1), label="rank")
    got = Sampler(n, batch, Mode.Sequential, rank=rank, world_size=world).peek(step)
    start = step * batch * world + rank * batch
    assert got.tolist() == [(start + i) % n for i in range(batch)]


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=(1 << 64) - 1),
    seed=seeds,
    step=st.integers(min_value=0, max_value=(1 << 64) - 1),
)
def test_iid_indices_are_in_range_and_deterministic(n: int, seed: int, step: int) -> None:
    a = Sampler(n, 257, Mode.IID, seed).peek(step)
    b = Sampler(n, 257, Mode.IID, seed).peek(step)
    np.testing.assert_array_equal(a, b)
    assert all(int(v) < n for v in a)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(min_value=64, max_value=1 << 62), seed=seeds)
def test_cyclic_with_huge_n_stays_in_range_without_repeats(n: int, seed: int) -> None:
    s = Sampler(n, 64, Mode.Cyclic, seed)
    batch = np.concatenate([s.peek(0), s.peek(1)]) if s.cycle_steps > 1 else s.peek(0)
    assert int(batch.max()) < n
    assert np.unique(batch).size == batch.size
