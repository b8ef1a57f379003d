"""Behaviour of loaderx.zsampler.Sampler: the reference README's "Zsampler"
section sentence by sentence, argument errors, resume and the borrowed view."""

from __future__ import annotations

import itertools
import pickle
import resource
import threading

import numpy as np
import pytest
from loaderx.errors import InvalidArgumentError, LoaderxError, StateError
from loaderx.zsampler import Mode, Sampler

MODES = [Sampler.Mode.Sequential, Sampler.Mode.IID, Sampler.Mode.Cyclic]


# ------------------------------------------------------------ README example


def test_readme_example_returns_borrowed_uint64_view() -> None:
    sampler = Sampler(1_000_000, 256, Sampler.Mode.IID, seed=42)
    indices = sampler.next()
    saved = indices.copy()
    assert indices.dtype == np.uint64
    assert indices.shape == (256,)
    assert not indices.flags.writeable
    assert int(indices.max()) < 1_000_000
    np.testing.assert_array_equal(saved, indices)
    # The next draw overwrites the same buffer; the copy keeps the plan.
    again = sampler.next()
    assert again is indices
    assert not np.array_equal(saved, indices)
    np.testing.assert_array_equal(saved, sampler.peek(0))
    np.testing.assert_array_equal(indices, sampler.peek(1))


@pytest.mark.parametrize("mode", MODES)
def test_iteration_returns_the_same_reusable_buffer(mode: Mode) -> None:
    sampler = Sampler(1000, 10, mode, seed=1)
    it = iter(sampler)
    first = next(it)
    plan0 = first.copy()
    address = first.__array_interface__["data"][0]
    second = next(it)
    assert second is first
    assert second.__array_interface__["data"][0] == address  # no new buffer per draw
    np.testing.assert_array_equal(plan0, sampler.peek(0))
    np.testing.assert_array_equal(second, sampler.peek(1))
    assert sampler.step == 2


def test_iteration_never_ends() -> None:
    sampler = Sampler(3, 2, Sampler.Mode.Cyclic)
    for count, _ in enumerate(sampler, start=1):
        if count == 1000:
            break
    assert sampler.step == 1000


def test_view_is_unchanged_by_calls_that_do_not_draw() -> None:
    sampler = Sampler(10_000, 64, Sampler.Mode.IID, seed=3)
    view = sampler.next()
    plan = view.copy()
    sampler.peek(17)
    sampler.seek(99)
    sampler.state_dict()
    np.testing.assert_array_equal(view, plan)


def test_view_cannot_be_written() -> None:
    view = Sampler(100, 4, Sampler.Mode.IID).next()
    with pytest.raises(ValueError):
        view[0] = 1


def test_view_outlives_the_sampler() -> None:
    sampler = Sampler(100, 8, Sampler.Mode.Sequential, start_step=2)
    view = sampler.next()
    del sampler
    np.testing.assert_array_equal(view, np.arange(16, 24, dtype=np.uint64))


def test_peek_returns_a_fresh_writable_array() -> None:
    sampler = Sampler(100, 5, Sampler.Mode.Cyclic, seed=9)
    a = sampler.peek(3)
    b = sampler.peek(3)
    assert a is not b
    assert a.flags.writeable
    assert a.dtype == np.uint64 and a.shape == (5,)
    np.testing.assert_array_equal(a, b)
    assert sampler.step == 0


# ------------------------------------------------------------ modes


def test_sequential_traverses_in_order_and_wraps() -> None:
    sampler = Sampler(5, 3, Sampler.Mode.Sequential)
    assert sampler.next().tolist() == [0, 1, 2]
    assert sampler.next().tolist() == [3, 4, 0]
    assert sampler.next().tolist() == [1, 2, 3]


def test_sequential_batch_larger_than_n_wraps_inside_the_batch() -> None:
    assert Sampler(2, 5, Sampler.Mode.Sequential).next().tolist() == [0, 1, 0, 1, 0]


def test_iid_is_uniform_with_replacement() -> None:
    n = 50
    sampler = Sampler(n, 1000, Sampler.Mode.IID, seed=5)
    counts = np.zeros(n)
    repeats_seen = False
    for _ in range(100):
        batch = sampler.next()
        repeats_seen |= len(np.unique(batch)) < len(batch)
        counts += np.bincount(batch.astype(np.int64), minlength=n)
    expected = counts.sum() / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # df = 49: p(chi2 > 100) < 1e-5.
    assert chi2 < 100
    assert repeats_seen


def test_iid_has_no_modulo_bias_where_modulo_would_show_it() -> None:
    n = 3 << 62
    sampler = Sampler(n, 10_000, Sampler.Mode.IID, seed=8)
    values = np.concatenate([sampler.next().copy() for _ in range(10)])
    assert int(values.max()) < n
    lower_third = float(np.mean(values < np.uint64(1 << 62)))
    residue0 = float(np.mean(values % np.uint64(3) == 0))
    # x % n gives 1/2 below 2^62; multiply-shift without rejection gives 1/2
    # for residue 0. Unbiased: 1/3 (sd ~0.005 with 1e5 draws).
    assert abs(lower_third - 1 / 3) < 0.02
    assert abs(residue0 - 1 / 3) < 0.02


def test_cyclic_traverses_a_fresh_permutation_per_cycle() -> None:
    n = 1000
    sampler = Sampler(n, 100, Sampler.Mode.Cyclic, seed=2)
    assert sampler.cycle_steps == 10
    cycles = [np.concatenate([sampler.next().copy() for _ in range(10)]) for _ in range(3)]
    for order in cycles:
        np.testing.assert_array_equal(np.sort(order), np.arange(n, dtype=np.uint64))
    assert not np.array_equal(cycles[0], cycles[1])
    assert not np.array_equal(cycles[1], cycles[2])


def test_cyclic_omits_a_different_remainder_per_cycle() -> None:
    # n = 10, batch 4: two full batches per cycle, two indices left out.
    sampler = Sampler(10, 4, Sampler.Mode.Cyclic, seed=6)
    omitted: set[frozenset[int]] = set()
    for _ in range(30):
        seen = np.concatenate([sampler.next().copy() for _ in range(2)])
        assert len(np.unique(seen)) == 8
        omitted.add(frozenset(set(range(10)) - set(seen.tolist())))
    assert len(omitted) > 10


def test_cyclic_position_of_each_index_is_uniform_across_seeds() -> None:
    n, seeds = 6, 3000
    at = np.zeros((n, n))  # at[index, position]
    for seed in range(seeds):
        perm = Sampler(n, n, Sampler.Mode.Cyclic, seed=seed).next()
        at[perm.astype(np.int64), np.arange(n)] += 1
    expected = seeds / n
    chi2 = ((at - expected) ** 2 / expected).sum(axis=1)
    # df = 5 per index: p(chi2 > 30) < 1e-5.
    assert chi2.max() < 30


def test_cyclic_cycles_and_seeds_give_unrelated_orders() -> None:
    n = 20_000
    a = Sampler(n, n, Sampler.Mode.Cyclic, seed=1)
    first, second = a.peek(0).astype(np.float64), a.peek(1).astype(np.float64)
    other_seed = Sampler(n, n, Sampler.Mode.Cyclic, seed=2).peek(0).astype(np.float64)
    neighbours = np.corrcoef(first[:-1], first[1:])[0, 1]
    # sd of r is ~0.007 at this size.
    assert abs(neighbours) < 0.04
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.04
    assert abs(np.corrcoef(first, other_seed)[0, 1]) < 0.04
    assert int((first == second).sum()) < 10  # a random pair agrees at ~1 position


def test_cyclic_does_not_allocate_a_dataset_sized_permutation() -> None:
    n = 10**12  # a permutation of this would need 8 TB
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sampler = Sampler(n, 8192, Sampler.Mode.Cyclic, seed=1)
    sampler.seek(n // 8192 - 1)  # last step of cycle 0
    last = sampler.next().copy()
    first_of_next_cycle = sampler.next().copy()
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert int(last.max()) < n and int(first_of_next_cycle.max()) < n
    assert len(np.unique(last)) == 8192
    assert rss_growth_kib < 64 * 1024


def test_cyclic_batch_equal_to_n_is_one_permutation_per_step() -> None:
    sampler = Sampler(7, 7, Sampler.Mode.Cyclic, seed=0)
    for _ in range(5):
        assert sorted(sampler.next().tolist()) == list(range(7))


def test_cyclic_batch_larger_than_n_draws_whole_cycles() -> None:
    # One rank: each draw is one permutation of 0..n-1 (the 2.5.4 wheel's rule).
    s = Sampler(7, 8, Sampler.Mode.Cyclic, seed=5)
    assert s.batch_size == 7
    draws = [s.next().copy() for _ in range(4)]
    assert all(sorted(d.tolist()) == list(range(7)) for d in draws)
    assert any((a != b).any() for a, b in itertools.pairwise(draws))  # a fresh permutation per cycle
    assert Sampler(7, 256, Sampler.Mode.CYCLIC).next().shape == (7,)
    # Several ranks: a global batch above n has no whole-cycle meaning.
    with pytest.raises(InvalidArgumentError, match="must be <= n"):
        Sampler(7, 4, Sampler.Mode.Cyclic, world_size=2)


def test_keyword_names_of_the_2_5_4_wheel() -> None:
    s = Sampler(length=10, batch_size=3, mode=Sampler.Mode.SEQUENTIAL, seed=1)
    assert (s.n, s.batch_size, s.mode, s.seed) == (10, 3, Sampler.Mode.Sequential, 1)
    assert [int(m) for m in (Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC)] == [0, 1, 2]
    assert Sampler(10, 3, 2).mode is Sampler.Mode.Cyclic


def test_same_arguments_agree_whatever_the_order_of_steps() -> None:
    for mode in MODES:
        a = Sampler(12345, 17, mode, seed=77)
        b = Sampler(12345, 17, mode, seed=77)
        forward = [a.next().copy() for _ in range(50)]
        backward = [b.peek(s) for s in reversed(range(50))][::-1]
        for x, y in zip(forward, backward):
            np.testing.assert_array_equal(x, y)


def test_iid_output_is_pinned_for_seed_42() -> None:
    # Same pin as the C++ IIDTest.OutputIsPinnedForSeed42: checkpoints store a
    # step, so the stream of (seed, step) must never change.
    assert Sampler(1_000_000, 4, Sampler.Mode.IID, seed=42).next().tolist() == [
        879284,
        568461,
        29877,
        889763,
    ]


# ------------------------------------------------------------ sharding and resume


@pytest.mark.parametrize("mode", MODES)
def test_ranks_concatenate_to_the_global_batch(mode: Mode) -> None:
    world, batch = 4, 8
    ranks = [Sampler(1000, batch, mode, seed=3, rank=r, world_size=world) for r in range(world)]
    single = Sampler(1000, batch * world, mode, seed=3)
    for _ in range(40):
        cat = np.concatenate([r.next() for r in ranks])
        np.testing.assert_array_equal(cat, single.next())


@pytest.mark.parametrize("mode", MODES)
def test_resume_on_a_different_world_size_keeping_the_global_batch(mode: Mode) -> None:
    # Trained on 4 ranks x 8 up to step 37; resumed on 2 ranks x 16.
    old = [Sampler(5000, 8, mode, seed=11, rank=r, world_size=4) for r in range(4)]
    for s in old:
        s.seek(37)
    state = old[0].state_dict()
    assert state["global_batch"] == 32 and state["step"] == 37
    new = [Sampler(5000, 16, mode, seed=11, rank=r, world_size=2) for r in range(2)]
    for s in new:
        s.load_state_dict(state)
    for _ in range(5):
        np.testing.assert_array_equal(
            np.concatenate([s.next() for s in old]), np.concatenate([s.next() for s in new])
        )


def test_state_dict_round_trip_resumes_exactly() -> None:
    a = Sampler(999, 10, Sampler.Mode.Cyclic, seed=4)
    for _ in range(123):
        a.next()
    state = a.state_dict()
    assert state == {
        "version": 4,
        "n": 999,
        "mode": "Cyclic",
        "seed": 4,
        "global_batch": 10,
        "step": 123,
    }
    b = Sampler(999, 10, Sampler.Mode.Cyclic, seed=4)
    b.load_state_dict(state)
    assert b.step == 123
    np.testing.assert_array_equal(a.next(), b.next())


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("n", 1000, "state n is 1000 but this sampler's is 999"),
        ("seed", 5, "state seed is 5 but this sampler's is 4"),
        ("mode", "IID", "state mode is 'IID' but this sampler's is 'Cyclic'"),
        ("global_batch", 20, "state global_batch is 20 but this sampler's is 10.*batch_size \\* world_size"),
        ("version", 9, "state version 9 is not supported"),
        ("step", -1, "step must be in 0..2\\*\\*64-1"),
    ],
)
def test_load_state_dict_rejects_a_mismatch_naming_the_key(key: str, value: object, match: str) -> None:
    sampler = Sampler(999, 10, Sampler.Mode.Cyclic, seed=4)
    state = sampler.state_dict()
    state[key] = value
    with pytest.raises(InvalidArgumentError, match=match):
        sampler.load_state_dict(state)
    assert sampler.step == 0


def test_load_state_dict_rejects_missing_keys_and_non_mappings() -> None:
    sampler = Sampler(10, 2, Sampler.Mode.IID)
    state = sampler.state_dict()
    del state["seed"]
    with pytest.raises(InvalidArgumentError, match="state is missing seed"):
        sampler.load_state_dict(state)
    with pytest.raises(TypeError, match=r"state must be a dict from state_dict\(\), got list"):
        sampler.load_state_dict([("step", 1)])  # type: ignore[arg-type]


def test_seek_positions_the_next_draw() -> None:
    sampler = Sampler(100, 7, Sampler.Mode.IID, seed=1)
    expected = sampler.peek(1_000_000_000_000)
    sampler.seek(1_000_000_000_000)
    assert sampler.step == 1_000_000_000_000
    np.testing.assert_array_equal(sampler.next(), expected)
    assert sampler.step == 1_000_000_000_001


def test_start_step_equals_seek() -> None:
    a = Sampler(100, 7, Sampler.Mode.Cyclic, seed=1, start_step=55)
    b = Sampler(100, 7, Sampler.Mode.Cyclic, seed=1)
    b.seek(55)
    assert a.step == 55
    np.testing.assert_array_equal(a.next(), b.next())


def test_pickle_keeps_arguments_and_step() -> None:
    a = Sampler(1000, 16, Sampler.Mode.Cyclic, seed=7, rank=1, world_size=2, start_step=9)
    b = pickle.loads(pickle.dumps(a))
    assert repr(b) == repr(a)
    np.testing.assert_array_equal(a.next(), b.next())


def test_attributes_and_repr() -> None:
    s = Sampler(1000, 16, "cyclic", seed=7, rank=1, world_size=2)
    assert (s.n, s.batch_size, s.seed, s.rank, s.world_size) == (1000, 16, 7, 1, 2)
    assert s.mode is Sampler.Mode.Cyclic
    assert s.global_batch == 32
    assert s.cycle_steps == 31
    assert Sampler(10, 2, Sampler.Mode.IID).cycle_steps == 0
    assert repr(s) == (
        "Sampler(n=1000, batch_size=16, mode=Sampler.Mode.Cyclic, seed=7, rank=1, "
        "world_size=2, step=0)"
    )


def test_reference_mode_names_are_aliases() -> None:
    assert Sampler.Mode.SEQUENTIAL is Sampler.Mode.Sequential
    assert Sampler.Mode.CYCLIC is Sampler.Mode.Cyclic
    assert Sampler(10, 2, 2).mode is Sampler.Mode.Cyclic
    assert Sampler(10, 2, np.int64(0)).mode is Sampler.Mode.Sequential


def test_context_manager_returns_the_sampler_and_close_keeps_it_usable() -> None:
    with Sampler(100, 4, Sampler.Mode.Sequential) as s:
        assert isinstance(s, Sampler)
        assert s.next().tolist() == [0, 1, 2, 3]
    s.close()
    assert s.next().tolist() == [4, 5, 6, 7]


# ------------------------------------------------------------ argument errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"length": 0}, "n must be > 0"),
        ({"length": -1}, "n must be in 0..2\\*\\*64-1"),
        ({"length": 1 << 64}, "n must be in 0..2\\*\\*64-1"),
        ({"batch_size": 0}, "batch_size must be > 0"),
        ({"batch_size": -5}, "batch_size must be in"),
        ({"batch_size": (1 << 31) + 1}, "batch_size must be <="),
        ({"seed": -1}, "seed must be in 0..2\\*\\*64-1"),
        ({"rank": 2, "world_size": 2}, "rank must be < world_size"),
        ({"rank": -1}, "rank must be in"),
        ({"world_size": 0}, "world_size must be > 0"),
        ({"start_step": -3}, "start_step must be in"),
        ({"mode": 3}, "mode: unknown sampler mode 3"),
        ({"mode": -1}, "mode: unknown sampler mode -1"),
        ({"mode": "shuffle"}, "mode: unknown sampler mode 'shuffle'"),
    ],
)
def test_invalid_arguments_raise_value_error_naming_the_argument(
    kwargs: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {"length": 100, "batch_size": 10, "mode": Sampler.Mode.IID}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=match) as info:
        Sampler(**args)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, LoaderxError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"length": 10.0}, "n must be an int, got float"),
        ({"batch_size": "10"}, "batch_size must be an int, got str"),
        ({"seed": None}, "seed must be an int, got NoneType"),
        ({"length": True}, "n must be an int, got bool"),
        ({"mode": 1.0}, "mode must be a Sampler.Mode, got float"),
        ({"world_size": [2]}, "world_size must be an int, got list"),
    ],
)
def test_wrong_types_raise_type_error_naming_the_argument(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"length": 100, "batch_size": 10, "mode": Sampler.Mode.IID}
    args.update(kwargs)
    with pytest.raises(TypeError, match=match):
        Sampler(**args)  # type: ignore[arg-type]


def test_numpy_integers_are_accepted() -> None:
    s = Sampler(np.uint64(100), np.int32(10), Sampler.Mode.IID, seed=np.int64(3))
    assert (s.n, s.batch_size, s.seed) == (100, 10, 3)


def test_rank_and_world_size_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Sampler(100, 10, Sampler.Mode.IID, 42, 0)  # type: ignore[misc]


def test_seek_rejects_bad_steps() -> None:
    s = Sampler(100, 10, Sampler.Mode.IID)
    with pytest.raises(InvalidArgumentError, match="step must be in 0..2"):
        s.seek(-1)
    with pytest.raises(TypeError, match="step must be an int, got str"):
        s.seek("3")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="step must be in"):
        s.peek(1 << 64)
    assert s.step == 0


def test_uninitialised_or_reinitialised_sampler_raises_state_error() -> None:
    bare = Sampler.__new__(Sampler)
    with pytest.raises(StateError, match="not initialised"):
        bare.next()
    with pytest.raises(StateError, match="not initialised"):
        _ = bare.step
    s = Sampler(100, 10, Sampler.Mode.IID)
    with pytest.raises(StateError, match="already initialised"):
        s.__init__(100, 10)  # type: ignore[misc]


# ------------------------------------------------------------ large batches, threads


def test_large_batch_fills_without_the_gil_and_matches_peek() -> None:
    # 2^17 indices: above the GIL-release threshold of the native fill.
    s = Sampler(10**9, 1 << 17, Sampler.Mode.Cyclic, seed=5)
    view = s.next()
    np.testing.assert_array_equal(view, s.peek(0))
    assert len(np.unique(view)) == 1 << 17


def test_a_sampler_shared_by_threads_draws_each_step_once() -> None:
    s = Sampler(10**6, 1 << 16, Sampler.Mode.IID, seed=5)
    calls_per_thread = 20

    def work() -> None:
        for _ in range(calls_per_thread):
            s.next()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert s.step == 4 * calls_per_thread
