"""DataLoader skipped step ranges: exact delivered steps, validation, state and resume."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import numpy as np
import pytest
from loader_util import (
    assert_batch_equal,
    expected_batch,
    paths_fixture,  # noqa: F401  (pytest fixture)
    stores_fixture,  # noqa: F401  (pytest fixture)
)
from loaderx.dataloader import DataLoader
from loaderx.errors import ArgumentTypeError, InvalidArgumentError

SEED = 5
B = 4


def take(loader: DataLoader, stores: dict[str, Any], k: int, **spec: Any) -> list[int]:
    """The steps of the next `k` batches, each checked against the hand-gathered batch of its step."""
    steps = []
    for _ in range(k):
        step = loader.step
        batch = next(loader)
        assert_batch_equal(batch, expected_batch(stores, step, spec.get("batch_size", B), seed=SEED,
                                                 rank=spec.get("rank", 0),
                                                 world_size=spec.get("world_size", 1)))
        steps.append(step)
    return steps


@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_skipped_ranges_are_never_delivered(stores: dict[str, Any], transform: Any) -> None:
    # Adjacent ranges, given out of order, merge; the batch after 2 is step 7.
    with DataLoader(stores, batch_size=B, seed=SEED, transform=transform, prefetch=4,
                    skip=[(10, 12), (5, 7), (3, 5)]) as loader:
        assert loader.skip_ranges == ((3, 7), (10, 12))
        assert take(loader, stores, 9) == [0, 1, 2, 7, 8, 9, 12, 13, 14]
        assert loader.step == 15


def test_a_range_at_the_first_step_or_covering_start_step(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(0, 3)]) as loader:
        assert loader.step == 3 == loader.state_dict()["step"]
        assert take(loader, stores, 2) == [3, 4]
    with DataLoader(stores, batch_size=B, seed=SEED, start_step=5, skip=[(2, 8)]) as loader:
        assert loader.step == 8
        assert take(loader, stores, 2) == [8, 9]


def test_overlapping_ranges_merge_into_their_union(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(2, 6), (4, 9), [3, 5]]) as loader:
        assert loader.skip_ranges == ((2, 9),)
        assert take(loader, stores, 4) == [0, 1, 9, 10]


@pytest.mark.parametrize(
    ("skip", "error", "match"),
    [
        ([(-1, 4)], InvalidArgumentError, r"skip: range \(-1, 4\): start must be >= 0"),
        ([(4, 4)], InvalidArgumentError, r"skip: range \(4, 4\) is empty"),
        ([(9, 4)], InvalidArgumentError, r"skip: range \(9, 4\) is empty"),
        ([(1, 2), (3,)], ArgumentTypeError, r"skip: each range must be a \(start, stop\) pair.*\(3,\)"),
        ([(1.5, 4)], ArgumentTypeError, r"skip: range \(1.5, 4\): start must be an int"),
        ([(True, 4)], ArgumentTypeError, r"start must be an int, got bool"),
        ([(0, 2**64)], InvalidArgumentError, r"stop must be < 2\*\*64"),
        ("3-5", ArgumentTypeError, r"skip must be a list of \(start, stop\) pairs"),
        (7, ArgumentTypeError, r"skip must be a list of \(start, stop\) pairs"),
    ],
)
def test_bad_ranges_are_refused_naming_them(
    stores: dict[str, Any], skip: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        DataLoader(stores, batch_size=B, skip=skip)


class FirstCallSlow:
    """A transform whose first call takes 0.3 s: the loader fills its window meanwhile."""

    def __init__(self) -> None:
        self.calls = itertools.count()

    def __call__(self, batch: Any) -> Any:
        if next(self.calls) == 0:
            time.sleep(0.3)
        return batch


@pytest.mark.parametrize("transformed", [False, True])
def test_runtime_skip_drops_prefetched_and_pending_steps_of_the_range(
    stores: dict[str, Any], transformed: bool
) -> None:
    # Deep prefetch and a transform window of 4: steps 1..3 are already
    # transformed when the range is added, and the source stands at 4.
    transform = FirstCallSlow() if transformed else None
    with DataLoader(stores, batch_size=B, seed=SEED, prefetch=8, transform=transform,
                    transform_threads=4) as loader:
        assert take(loader, stores, 1) == [0]
        if transformed:
            assert [s for s, _ in loader._pending] == [1, 2, 3]  # the case tested
        loader.skip(2, 3)  # the source goes back to 3
        assert take(loader, stores, 3) == [1, 3, 4]
        assert loader.step == 5
        loader.skip(6, 7)  # after the next step: 5 still comes
        loader.skip(6, 7)  # again: nothing changes
        loader.skip(7, 9)  # adjacent: merges
        assert loader.skip_ranges == ((2, 3), (6, 9))
        assert loader.step == 5
        assert take(loader, stores, 2) == [5, 9]


def test_runtime_skip_at_the_next_step_moves_the_step(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED) as loader:
        assert take(loader, stores, 2) == [0, 1]
        loader.skip(2, 5)
        assert loader.step == 5 == loader.state_dict()["step"]
        assert take(loader, stores, 2) == [5, 6]


def test_runtime_skip_of_a_past_step_is_refused_and_changes_nothing(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(8, 9)]) as loader:
        take(loader, stores, 4)
        with pytest.raises(InvalidArgumentError, match=r"skip\(2, 3\): step 2 is before loader.step \(4\)"):
            loader.skip(2, 3)
        with pytest.raises(InvalidArgumentError, match=r"skip\(3, 10\): step 3 is before loader.step \(4\)"):
            loader.skip(3, 10)  # partly past
        with pytest.raises(InvalidArgumentError, match=r"skip: range \(6, 5\) is empty"):
            loader.skip(6, 5)
        assert loader.skip_ranges == ((8, 9),)
        assert take(loader, stores, 5) == [4, 5, 6, 7, 9]


def test_seek_into_a_range_lands_at_its_end(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(10, 20)]) as loader:
        loader.seek(12)
        assert loader.step == 20
        assert take(loader, stores, 1) == [20]
        loader.seek(9)  # back before the range: it is skipped again
        assert take(loader, stores, 2) == [9, 20]


def test_state_records_the_ranges_and_a_new_loader_resumes_skipping_them(
    stores: dict[str, Any],
) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(3, 5)]) as a:
        take(loader=a, stores=stores, k=2)
        a.skip(6, 8)
        state = a.state_dict()
        rest = take(a, stores, 5)
    assert rest == [2, 5, 8, 9, 10]
    assert state == {"version": 4, "step": 2, "seed": SEED, "mode": "Cyclic", "n": 103,
                     "global_batch": B, "skip": [[3, 5], [6, 8]],
                     "mix_schedule": None}
    assert json.loads(json.dumps(state)) == state
    # A restarted job (no skip= of its own) skips the state's ranges.
    with DataLoader(stores, batch_size=B, seed=SEED) as b:
        take(b, stores, 4)
        b.load_state_dict(json.loads(json.dumps(state)))
        assert b.skip_ranges == ((3, 5), (6, 8))
        assert take(b, stores, 5) == rest


def test_loading_a_state_merges_its_ranges_with_the_loaders(stores: dict[str, Any]) -> None:
    # The usual restart after a loss spike: the checkpoint is from before
    # the spike, the new run names the range to skip.
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(0, 1)]) as a:
        take(a, stores, 3)
        state = a.state_dict()
    assert state["step"] == 4 and state["skip"] == [[0, 1]]
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(5, 7)]) as b:
        b.load_state_dict(state)
        assert b.skip_ranges == ((0, 1), (5, 7))
        assert take(b, stores, 3) == [4, 7, 8]
        assert b.state_dict()["skip"] == [[0, 1], [5, 7]]


def test_a_state_step_inside_a_range_continues_at_its_end(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED) as a:
        take(a, stores, 6)
        state = a.state_dict()
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(4, 9)]) as b:
        b.load_state_dict(state)
        assert b.step == 9
        assert take(b, stores, 1) == [9]


def test_a_version_1_state_loads_as_one_without_skips(stores: dict[str, Any]) -> None:
    v1 = {"version": 1, "step": 3, "seed": SEED, "mode": "Cyclic", "n": 103, "global_batch_size": B}
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(4, 6)]) as loader:
        loader.load_state_dict(v1)
        assert loader.skip_ranges == ((4, 6),)
        assert take(loader, stores, 2) == [3, 6]


def test_a_state_with_bad_ranges_is_refused_and_changes_nothing(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=B, seed=SEED, skip=[(9, 10)]) as loader:
        take(loader, stores, 2)
        state = loader.state_dict()
        for bad, match in [([[5, 2]], r"state skip: range \(5, 2\) is empty"),
                           ([[-3, 2]], r"state skip: range \(-3, 2\): start must be >= 0"),
                           ("x", r"state skip must be a list of \(start, stop\) pairs")]:
            with pytest.raises(ValueError, match=match):
                loader.load_state_dict({**state, "step": 0, "skip": bad})
        with pytest.raises(ValueError, match="state version 5 is not supported"):
            loader.load_state_dict({**state, "version": 5})
        assert loader.step == 2 and loader.skip_ranges == ((9, 10),)


def test_resume_on_another_world_size_skips_the_same_global_steps(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=12, seed=SEED, skip=[(2, 4)]) as one:
        take(one, stores, 1, batch_size=12)
        state = one.state_dict()
        steps = []
        globals_ = []
        for _ in range(3):
            steps.append(one.step)
            globals_.append(next(one)["label"].copy())
    assert steps == [1, 4, 5]
    parts = []
    for rank in range(3):
        with DataLoader(stores, batch_size=4, seed=SEED, rank=rank, world_size=3) as part:
            part.load_state_dict(state)
            assert part.skip_ranges == ((2, 4),)
            assert take(part, stores, 3, batch_size=4, rank=rank, world_size=3) == steps
            part.seek(1)
            parts.append([next(part)["label"].copy() for _ in range(3)])
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), globals_[k])


def test_repr_and_state_keep_data_steps_after_many_ranges(stores: dict[str, Any]) -> None:
    # 50 ranges of one step each: every other step is delivered.
    skip = [(s, s + 1) for s in range(1, 100, 2)]
    with DataLoader(stores, batch_size=B, seed=SEED, skip=skip, prefetch=3) as loader:
        assert len(loader.skip_ranges) == 50
        assert take(loader, stores, 10) == list(range(0, 20, 2))
        assert loader.step == 20 and "step=20" in repr(loader)
