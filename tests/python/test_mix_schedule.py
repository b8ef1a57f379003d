"""loaderx.mix schedules: per-step weights, exact dataset sequences against a reference of the
rule written here, shares per segment, appending, state_dict and resume across boundaries."""

from __future__ import annotations

import bisect
import json
import math
from typing import Any

import numpy as np
import pytest
from loaderx.dataloader import DataLoader
from loaderx.errors import ArgumentTypeError, InvalidArgumentError
from loaderx.mix import Mixture, mix, mix_counts
from loaderx.zsampler import Sampler
from test_mix import BASE, LENGTHS, build

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
SEGMENT_SALT = 0xBE5466CF34E90C6C  # the constant docs/guide.md gives for segment seeds
NAMES = ("web", "books", "code")
SCHEDULE = [(0, {"web": 0.6, "books": 0.3, "code": 0.1}),
            (7, {"web": 0.2, "books": 0.8}),
            (12, {"code": 1.0, "web": 1.0})]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("mixsched")
    p = {name: build(root, name, n) for name, n in LENGTHS.items()}
    yield p
    for streams in p.values():
        for s in streams.values():
            s.close()


def scheduled(parts: dict[str, Any], schedule: Any = SCHEDULE, **kw: Any) -> Mixture:
    return mix({name: parts[name] for name in NAMES}, schedule=schedule, **kw)


# -- the reference: the rule of docs/guide.md "Mixture schedules", from plain samplers ----------

def mix64(x: int) -> int:
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def segment_seed(seed: int, k: int) -> int:
    return seed if k == 0 else mix64(seed ^ mix64((k * GAMMA + SEGMENT_SALT) & M64))


def reference(schedule: Any, min_positions: int, mode: str, seed: int, global_batch: int,
              step: int) -> tuple[list[int], list[int]]:
    """(dataset, record) of each sample of `step`, from the rule alone: segment k's counts by
    mix_counts over its datasets of weight > 0, segments laid out one after the other, step s
    of segment k drawn by a plain sampler over V_k with the segment's seed at s - start_k."""
    starts = [s for s, _ in schedule]
    k = bisect.bisect_right(starts, step) - 1
    weights = schedule[k][1]
    used = [n for n in NAMES if weights.get(n, 0) > 0]
    some = mix_counts([LENGTHS[n] for n in used], [weights[n] for n in used],
                      min_positions=min_positions)
    counts = [some[used.index(n)] if n in used else 0 for n in NAMES]
    v = sum(counts)
    pos = Sampler(v, global_batch, mode, segment_seed(seed, k)).peek(step - starts[k])
    bounds = np.cumsum([0, *counts])
    ds = [int(bisect.bisect_right(bounds, int(p)) - 1) for p in pos]
    recs = [int((int(p) - bounds[d]) % LENGTHS[NAMES[d]]) for p, d in zip(pos, ds)]
    return ds, recs


@pytest.mark.parametrize("mode", ["IID", "Cyclic", "Sequential"])
def test_every_step_is_the_reference_rule(parts: dict[str, Any], mode: str) -> None:
    m = scheduled(parts, min_positions=64)
    assert m.segments[0][:2] == (0, 0) and [s for s, _, _ in m.segments] == [0, 7, 12]
    assert m.positions == sum(size for _, _, size in m.segments)
    with DataLoader(m, batch_size=16, mode=mode, seed=3) as loader:
        for step in range(20):
            b = next(loader)
            ds, recs = reference(SCHEDULE, 64, mode, 3, 16, step)
            assert b["dataset"].dtype == np.int64 and b["dataset"].tolist() == ds, step
            assert b["x"].tolist() == [BASE[NAMES[d]] + r for d, r in zip(ds, recs)], step
        for start in (13, 5, 11):  # seek back and forth across the boundaries at 7 and 12
            loader.seek(start)
            for step in range(start, start + 4):
                assert next(loader)["dataset"].tolist() == reference(
                    SCHEDULE, 64, mode, 3, 16, step)[0], (start, step)
    # segment 1 leaves "code" out, segment 2 leaves "books" out
    assert m.segment_counts[1][2] == 0 and m.segment_counts[2][1] == 0


def test_one_segment_schedule_is_the_plain_mixture(parts: dict[str, Any]) -> None:
    plain = mix({n: (parts[n], SCHEDULE[0][1][n]) for n in NAMES})
    one = scheduled(parts, SCHEDULE[:1])
    assert one.counts == plain.counts and one.positions == plain.positions
    assert plain.schedule == ((0, {"web": 0.6, "books": 0.3, "code": 0.1}),)
    with DataLoader(plain, batch_size=32, mode="IID", seed=8) as a, \
            DataLoader(one, batch_size=32, mode="IID", seed=8) as b:
        for _ in range(5):
            assert next(a)["x"].tolist() == next(b)["x"].tolist()


def test_realised_shares_per_segment_are_within_sampling_error(parts: dict[str, Any]) -> None:
    sched = [(0, {"web": 0.6, "books": 0.3, "code": 0.1}), (150, {"web": 0.25, "code": 0.75})]
    m = scheduled(parts, sched)
    batch, steps = 512, 300
    counts = np.zeros((2, 3), np.int64)
    with DataLoader(m, batch_size=batch, mode="IID", seed=5) as loader:
        for step in range(steps):
            counts[m.segment_of(step)] += np.bincount(next(loader)["dataset"], minlength=3)
    for k, (_, weights) in enumerate(sched):
        n = counts[k].sum()
        assert n == 150 * batch
        assert m.shares(sched[k][0]) == pytest.approx(
            {name: weights.get(name, 0.0) for name in NAMES}, abs=2**-20)
        for j, name in enumerate(NAMES):
            p = weights.get(name, 0.0)
            if p == 0:
                assert counts[k][j] == 0
                continue
            sigma = math.sqrt(p * (1 - p) / n)  # binomial
            assert abs(counts[k][j] / n - p) < 5 * sigma, (k, name, counts[k][j] / n, p)


def test_a_cyclic_segment_cycle_holds_its_exact_counts(parts: dict[str, Any]) -> None:
    sched = [(0, {"web": 0.6, "books": 0.3, "code": 0.1}), (10, {"books": 0.5, "code": 0.5})]
    m = scheduled(parts, sched, min_positions=1)
    # segment 1: V_1 = max(2 * 37, 2 * 13) = 74, counts (0, 37, 37); batch 37 -> 2 steps a cycle
    assert m.segment_counts[1] == (0, 37, 37) and m.segments[1] == (10, 170, 74)
    seen = np.zeros(3, np.int64)
    with DataLoader(m, batch_size=37, mode="Cyclic", seed=2, start_step=10) as loader:
        for _ in range(2):
            seen += np.bincount(next(loader)["dataset"], minlength=3)
    assert seen.tolist() == [0, 37, 37]


def test_appending_a_segment_leaves_earlier_steps_unchanged(parts: dict[str, Any]) -> None:
    m = scheduled(parts, SCHEDULE[:2], min_positions=64)
    with DataLoader(m, batch_size=16, mode="Cyclic", seed=4, prefetch=8) as loader:
        got = [next(loader) for _ in range(9)]  # steps 0..8, more prefetched
        with pytest.raises(InvalidArgumentError, match=r"after loader.step \(9\)"):
            loader.append_mix(9, {"web": 1.0})
        with pytest.raises(InvalidArgumentError, match=r"step 7, not after schedule\[1\]"):
            pass_schedule = loader.mixture
            assert pass_schedule is not None
            pass_schedule.appended(7, {"web": 1.0})
        loader.append_mix(12, {"code": 1.0, "web": 1.0})
        assert loader.mixture is not None and loader.mixture.schedule == tuple(
            (s, {n: w.get(n, 0.0) for n in NAMES}) for s, w in SCHEDULE)
        got += [next(loader) for _ in range(11)]  # steps 9..19
        assert loader.state_dict()["mix_schedule"] == [
            [s, {n: w.get(n, 0.0) for n in NAMES}] for s, w in SCHEDULE]
    with DataLoader(scheduled(parts, min_positions=64), batch_size=16, mode="Cyclic",
                    seed=4) as full:
        for step in range(20):
            assert next(full)["x"].tolist() == got[step]["x"].tolist(), step
    for step in range(20):
        ds, _ = reference(SCHEDULE, 64, "Cyclic", 4, 16, step)
        assert got[step]["dataset"].tolist() == ds


def test_state_round_trip_and_resume_on_another_world_size(parts: dict[str, Any]) -> None:
    m = scheduled(parts, min_positions=64)
    with DataLoader(m, batch_size=24, mode="Cyclic", seed=9) as a:
        want = [next(a)["x"].tolist() for _ in range(16)]
    short = scheduled(parts, SCHEDULE[:2], min_positions=64)
    with DataLoader(short, batch_size=24, mode="Cyclic", seed=9, num_threads=3) as b:
        for _ in range(5):
            next(b)
        b.append_mix(12, SCHEDULE[2][1])
        state = json.loads(json.dumps(b.state_dict()))
    assert state["version"] == 4 and state["step"] == 5 and state["n"] == m.positions
    # Resumed on 3 ranks of 8 from a loader built with the first segment only: the state's
    # schedule extends it, across both boundaries (steps 7 and 12).
    first = scheduled(parts, SCHEDULE[:1], min_positions=64)
    ranks = [DataLoader(first, batch_size=8, mode="Cyclic", seed=9, rank=r, world_size=3)
             for r in range(3)]
    try:
        for r in ranks:
            r.load_state_dict(state)
            assert r.mixture is not None and len(r.mixture.segments) == 3
        for step in range(5, 16):
            got = [x for r in ranks for x in next(r)["x"].tolist()]
            assert got == want[step], step
    finally:
        for r in ranks:
            r.close()


def test_old_states_load_as_a_one_segment_schedule(parts: dict[str, Any]) -> None:
    plain = mix({n: (parts[n], SCHEDULE[0][1][n]) for n in NAMES}, min_positions=64)
    with DataLoader(plain, batch_size=16, mode="IID", seed=1) as a:
        want = [next(a)["x"].tolist() for _ in range(9)]
        state = a.state_dict()
    for version in (1, 2):
        old = {k: v for k, v in state.items() if k != "mix_schedule"}
        old["version"] = version
        old["step"] = 3
        old["global_batch_size"] = old.pop("global_batch")  # its name before version 4
        if version == 1:
            del old["skip"]
        with DataLoader(plain, batch_size=16, mode="IID", seed=1) as b:
            b.load_state_dict(old)
            assert [next(b)["x"].tolist() for _ in range(6)] == want[3:]
        # A loader with a schedule whose later segments start after the state's step.
        with DataLoader(scheduled(parts, min_positions=64), batch_size=16, mode="IID",
                        seed=1) as c:
            c.load_state_dict(old)
            assert [next(c)["x"].tolist() for _ in range(4)] == want[3:7]
            old["step"] = 7
            with pytest.raises(InvalidArgumentError, match="segment 1 starts at step 7"):
                c.load_state_dict(old)


def test_state_schedule_differences_are_named(parts: dict[str, Any]) -> None:
    m = scheduled(parts, min_positions=64)
    with DataLoader(m, batch_size=16, mode="IID", seed=1) as a:
        state = a.state_dict()
        other = json.loads(json.dumps(state))
        other["mix_schedule"][1][1]["web"] = 0.3
        with pytest.raises(InvalidArgumentError, match="state mix_schedule segment 1 is"):
            a.load_state_dict(other)
        assert a.mixture is m  # refused: nothing changed
    with DataLoader(parts["web"], batch_size=16, mode="IID", seed=1) as plain_loader:
        assert plain_loader.state_dict()["mix_schedule"] is None
        with pytest.raises(InvalidArgumentError, match="not a mixture"):
            plain_loader.load_state_dict(state)
        with pytest.raises(InvalidArgumentError, match="not a Mixture"):
            plain_loader.append_mix(5, {"web": 1.0})


def test_schedule_refusals(parts: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match=r"schedule\[0\] starts at step 3"):
        scheduled(parts, [(3, {"web": 1.0})])
    with pytest.raises(InvalidArgumentError, match=r"schedule\[2\] starts at step 7, not after"):
        scheduled(parts, [(0, {"web": 1.0}), (7, {"web": 1.0}), (7, {"code": 1.0})])
    with pytest.raises(InvalidArgumentError,
                       match=r"schedule\[2\] starts at step 2, not after schedule\[1\] \(step 5\)"):
        scheduled(parts, [(0, {"web": 1.0}), (5, {"web": 1.0}), (2, {"code": 1.0})])
    with pytest.raises(InvalidArgumentError, match="'books'.*weight must be finite and >= 0"):
        scheduled(parts, [(0, {"web": 1.0, "books": -0.5})])
    with pytest.raises(InvalidArgumentError, match=r"schedule\[1\]: unknown dataset 'wiki'"):
        scheduled(parts, [(0, {"web": 1.0}), (4, {"wiki": 1.0})])
    with pytest.raises(InvalidArgumentError, match=r"schedule\[1\]: every weight is 0"):
        scheduled(parts, [(0, {"web": 1.0}), (4, {"web": 0})])
    with pytest.raises(InvalidArgumentError, match="dataset 2 has 0 positions"):
        scheduled(parts, [(0, {"web": 1.0, "books": 1.0})])  # "code" never drawn
    with pytest.raises(ArgumentTypeError, match="start_step must be an int"):
        scheduled(parts, [(0.0, {"web": 1.0})])
    with pytest.raises(ArgumentTypeError, match="schedule must be a list"):
        scheduled(parts, {0: {"web": 1.0}})
    with pytest.raises(TypeError, match="with schedule=, expected its streams dict"):
        mix({"web": (parts["web"], 1.0)}, schedule=[(0, {"web": 1.0})])
    m = scheduled(parts, min_positions=64)
    with pytest.raises(InvalidArgumentError, match="pass the Mixture"):
        DataLoader(dict(m), batch_size=4)
    with DataLoader(m, batch_size=4, mode="IID") as loader:
        for _ in range(3):
            next(loader)
        with pytest.raises(InvalidArgumentError, match=r"after loader.step \(3\)"):
            loader.append_mix(3, {"web": 1.0})
        with pytest.raises(InvalidArgumentError, match=r"schedule\[3\]: unknown dataset 'x'"):
            loader.append_mix(20, {"x": 1.0})
        with pytest.raises(InvalidArgumentError, match="weight must be finite and >= 0"):
            loader.append_mix(20, {"web": -1.0})
        with pytest.raises(InvalidArgumentError, match=r"schedule\[3\] starts at step 12"):
            loader.append_mix(12, {"web": 1.0})
        assert loader.mixture is m and loader.step == 3  # refused: nothing changed
