"""DataLoader: batch contents, order, determinism, resume and argument errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_util import (
    N,
    assert_batch_equal,
    expected_batch,
    fingerprint,
    paths_fixture,  # noqa: F401  (pytest fixture)
    ragged_record,
    stores_fixture,  # noqa: F401  (pytest fixture)
)
from loaderx.dataloader import DataLoader
from loaderx.errors import InvalidArgumentError, LoaderClosedError, StateError
from loaderx.zrecord import Dense
from loaderx.zsampler import Sampler

REPO = Path(__file__).resolve().parents[2]


def test_batch_is_dict_of_stacked_dense_arrays_and_ragged_lists(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=8, seed=5) as loader:
        batch = next(loader)
    assert list(batch) == ["img", "label", "tok"]
    assert batch["img"].shape == (8, 2, 3) and batch["img"].dtype == np.float32
    assert batch["label"].shape == (8,) and batch["label"].dtype == np.int64
    assert isinstance(batch["tok"], list) and len(batch["tok"]) == 8
    # Every stream is gathered at the same indices: label i == 3*i - 7 and
    # img i starts at 3*i, tok i has i % 5 rows starting at 1000*i.
    idx = (batch["label"] + 7) // 3
    np.testing.assert_array_equal(batch["img"][:, 0, 0], idx * 3.0)
    for i, rec in zip(idx, batch["tok"]):
        np.testing.assert_array_equal(rec, ragged_record(int(i)))
        assert rec.dtype == np.int32 and rec.shape == (int(i) % 5, 2)


def test_batch_equals_hand_gather_of_the_sampler_indices(stores: dict[str, Any]) -> None:
    for mode in (Sampler.Mode.IID, Sampler.Mode.Sequential, Sampler.Mode.Cyclic):
        with DataLoader(stores, batch_size=16, mode=mode, seed=9, start_step=3) as loader:
            for k in range(12):
                assert loader.step == 3 + k
                assert_batch_equal(next(loader), expected_batch(stores, 3 + k, 16, mode, 9))


def test_dense_values_are_zero_copy_views_owned_by_their_base(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=4) as loader:
        batch = next(loader)
    img, label, tok = batch["img"], batch["label"], batch["tok"]
    assert not img.flags.owndata and img.base is not None
    assert not label.flags.owndata
    # One owner per batch: all views of the batch share it.
    assert img.base is label.base is tok[0].base
    before = img.copy()
    del batch, label, tok
    np.testing.assert_array_equal(img, before)  # still valid after the loader closed


def test_loader_is_endless_and_has_no_len(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=50, mode=Sampler.Mode.Sequential) as loader:
        with pytest.raises(TypeError, match="endless"):
            len(loader)
        seen = []
        for i, batch in enumerate(loader):
            seen.append(batch["label"])
            if i == 9:  # 500 records from a 103-record store: wraps around
                break
    got = (np.concatenate(seen) + 7) // 3
    np.testing.assert_array_equal(got, np.arange(500) % N)


@pytest.mark.parametrize("num_threads", [1, 2, 8])
@pytest.mark.parametrize("prefetch", [1, 3, 8])
def test_batches_are_identical_for_any_threads_and_prefetch(
    stores: dict[str, Any], num_threads: int, prefetch: int
) -> None:
    with DataLoader(
        stores, batch_size=12, seed=77, num_threads=num_threads, prefetch=prefetch, start_step=2
    ) as loader:
        for k in range(10):
            assert_batch_equal(next(loader), expected_batch(stores, 2 + k, 12, seed=77))


@pytest.mark.parametrize("transform_threads", [1, 2, 8])
def test_transformed_batches_keep_step_order_for_any_transform_threads(
    stores: dict[str, Any], transform_threads: int
) -> None:
    import time

    def slow_first(batch: dict[str, Any]) -> tuple[bytes, int]:
        first = int(batch["label"][0])
        time.sleep(0.002 * (first % 7))  # calls finish out of order
        return fingerprint(batch), first

    with DataLoader(
        stores, batch_size=8, transform=slow_first, seed=3, transform_threads=transform_threads, prefetch=4
    ) as loader:
        got = [next(loader) for _ in range(25)]
    for k, (fp, _) in enumerate(got):
        assert fp == fingerprint(expected_batch(stores, k, 8, seed=3)), k


def test_transform_return_value_is_yielded_unchanged(stores: dict[str, Any]) -> None:
    marker = object()
    with DataLoader(stores, batch_size=4, transform=lambda batch: (marker, batch)) as loader:
        got, batch = next(loader)
    assert got is marker
    assert set(batch) == {"img", "label", "tok"}


def test_resume_from_state_dict_continues_identically(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=10, mode=Sampler.Mode.Cyclic, seed=11) as a:
        for _ in range(7):
            next(a)
        state = a.state_dict()
        rest = [fingerprint(next(a)) for _ in range(6)]
    assert state["step"] == 7
    assert json.loads(json.dumps(state)) == state
    with DataLoader(stores, batch_size=10, mode=Sampler.Mode.Cyclic, seed=11) as b:
        next(b)
        b.load_state_dict(state)
        assert b.step == 7
        assert [fingerprint(next(b)) for _ in range(6)] == rest


def test_resume_on_another_world_size_keeps_the_global_batch(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=12, seed=4) as one:
        for _ in range(5):
            next(one)
        state = one.state_dict()
        global_batch = next(one)
    parts = []
    for rank in range(3):
        with DataLoader(stores, batch_size=4, seed=4, rank=rank, world_size=3) as part:
            part.load_state_dict(state)
            parts.append(next(part))
    np.testing.assert_array_equal(
        np.concatenate([p["label"] for p in parts]), global_batch["label"]
    )
    np.testing.assert_array_equal(np.concatenate([p["img"] for p in parts]), global_batch["img"])
    tok = [r for p in parts for r in p["tok"]]
    for a, b in zip(tok, global_batch["tok"]):
        np.testing.assert_array_equal(a, b)


def test_load_state_dict_rejects_a_state_of_another_order(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=8, seed=1) as loader:
        state = loader.state_dict()
        for key, value in [("seed", 2), ("global_batch", 16), ("mode", "IID"), ("n", 5)]:
            with pytest.raises(ValueError, match=key):
                loader.load_state_dict({**state, key: value})
        with pytest.raises(ValueError, match="missing step"):
            loader.load_state_dict({k: v for k, v in state.items() if k != "step"})
        with pytest.raises(TypeError):
            loader.load_state_dict([("step", 3)])  # type: ignore[arg-type]
        assert loader.step == 0  # nothing changed


def test_a_sampler_and_a_loader_load_each_others_state(stores: dict[str, Any]) -> None:
    # One schema (python/loaderx/_state.py): the keys of the sample order and the step.
    with DataLoader(stores, batch_size=8, seed=1, mode="Cyclic") as loader:
        next(loader)
        next(loader)
        state = loader.state_dict()
        sampler = Sampler(state["n"], 8, Sampler.Mode.Cyclic, seed=1)
        sampler.load_state_dict(state)
        assert sampler.step == 2
        np.testing.assert_array_equal(
            sampler.next(), Sampler(state["n"], 8, Sampler.Mode.Cyclic, seed=1).peek(2))
        loader.load_state_dict(Sampler(state["n"], 8, "Cyclic", seed=1, start_step=5).state_dict())
        assert loader.step == 5
        with pytest.raises(ValueError, match="state seed is 2 but this loader's is 1"):
            loader.load_state_dict(Sampler(state["n"], 8, "Cyclic", seed=2).state_dict())
        loader.skip(7, 9)
        with pytest.raises(ValueError, match=r"state skips steps \[\[7, 9\]\], which a Sampler"):
            sampler.load_state_dict(loader.state_dict())
        assert sampler.step == 3 and loader.step == 5


def test_resume_across_process_restart(paths: dict[str, Path], tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import hashlib, json, sys
        from loader_util import fingerprint, open_stores
        from loaderx.dataloader import DataLoader
        from pathlib import Path
        paths = {k: Path(v) for k, v in json.loads(sys.argv[1]).items()}
        stores = open_stores(paths)
        state_file = Path(sys.argv[2])
        loader = DataLoader(stores, batch_size=9, seed=123, num_threads=int(sys.argv[4]))
        if sys.argv[3] == "first":
            for _ in range(4):
                next(loader)
            state_file.write_text(json.dumps(loader.state_dict()))
        else:
            loader.load_state_dict(json.loads(state_file.read_text()))
        print(json.dumps([hashlib.sha256(fingerprint(next(loader))).hexdigest() for _ in range(5)]))
        loader.close()
        """
    )
    env = {"PYTHONPATH": f"{REPO / 'python'}:{Path(__file__).parent}"}
    arg = json.dumps({k: str(v) for k, v in paths.items()})
    state = tmp_path / "state.json"
    first = subprocess.run(
        [sys.executable, "-c", script, arg, str(state), "first", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    second = subprocess.run(
        [sys.executable, "-c", script, arg, str(state), "second", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    assert json.loads(state.read_text())["step"] == 4
    assert json.loads(first.stdout) == json.loads(second.stdout)


def test_seek_makes_that_step_next(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=6, seed=8, transform=lambda b: b) as loader:
        next(loader)
        next(loader)
        loader.seek(1000)
        assert loader.step == 1000
        assert_batch_equal(next(loader), expected_batch(stores, 1000, 6, seed=8))
        loader.seek(0)
        assert_batch_equal(next(loader), expected_batch(stores, 0, 6, seed=8))
        with pytest.raises(ValueError):
            loader.seek(-1)


def test_sampler_argument_supplies_the_spec_and_step(stores: dict[str, Any]) -> None:
    sampler = Sampler(N, 7, Sampler.Mode.Cyclic, seed=21, start_step=5)
    with DataLoader(stores, sampler=sampler) as loader:
        assert loader.step == 5 and loader.batch_size == 7
        assert_batch_equal(next(loader), expected_batch(stores, 5, 7, Sampler.Mode.Cyclic, 21))
    assert sampler.step == 5  # the loader does not advance the caller's sampler
    # Explicit arguments that agree are fine; conflicting ones are refused.
    DataLoader(stores, batch_size=7, seed=21, sampler=sampler).close()
    with pytest.raises(ValueError, match="seed=1 conflicts"):
        DataLoader(stores, seed=1, sampler=sampler)
    with pytest.raises(ValueError, match="batch_size=8 conflicts"):
        DataLoader(stores, batch_size=8, sampler=sampler)
    with pytest.raises(ValueError, match="covers 10 records"):
        DataLoader(stores, sampler=Sampler(10, 2))
    with pytest.raises(TypeError, match="sampler"):
        DataLoader(stores, sampler=object())  # type: ignore[arg-type]


def test_bad_streams_raise_named_errors(
    stores: dict[str, Any], paths: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="got none"):
        DataLoader({})
    with pytest.raises(ValueError, match="got none"):
        DataLoader([])
    with pytest.raises(TypeError, match="dict of name"):
        DataLoader(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\(name, store\) pairs"):
        DataLoader([stores["img"]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="'x' must be an open Dense or Ragged"):
        DataLoader({"x": np.zeros((3, 2))})
    closed = Dense.open(str(paths["img"]))
    closed.close()
    with pytest.raises(StateError, match="'img' is closed"):
        DataLoader({"img": closed})
    short = np.zeros((N - 1, 2), np.uint8)
    with Dense.create(str(tmp_path / "short"), short.dtype, (2,), codec="raw") as ds:
        ds.append(short)
    with (
        Dense.open(str(tmp_path / "short")) as s,
        pytest.raises(ValueError, match=f"img={N}, short={N - 1}"),
    ):
        DataLoader({"img": stores["img"], "short": s})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": 2.5}, TypeError, "batch_size"),
        ({"rank": 2, "world_size": 2}, ValueError, "rank"),
        ({"world_size": 0}, ValueError, "world_size"),
        ({"prefetch": 0}, ValueError, "prefetch"),
        ({"num_threads": 0}, ValueError, "num_threads"),
        ({"transform_threads": 0}, ValueError, "transform_threads"),
        ({"seed": -1}, ValueError, "seed"),
        ({"start_step": -3}, ValueError, "start_step"),
        ({"mode": "Shuffled"}, ValueError, "mode"),
        ({"transform": 3}, TypeError, "transform"),
    ],
)
def test_bad_arguments_raise_named_errors(
    stores: dict[str, Any], kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        DataLoader(stores, **kwargs)


def test_closed_loader_refuses_use(stores: dict[str, Any]) -> None:
    loader = DataLoader(stores, batch_size=4)
    loader.close()
    assert loader.closed
    with pytest.raises(LoaderClosedError):
        next(loader)
    with pytest.raises(LoaderClosedError):
        loader.seek(1)
    assert isinstance(LoaderClosedError("x"), RuntimeError)
    assert issubclass(InvalidArgumentError, ValueError)


def test_loader_does_not_own_the_streams(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=4) as loader:
        next(loader)
    # Still open and usable after the loader closed.
    assert stores["img"][0].shape == (2, 3)
    np.testing.assert_array_equal(stores["tok"][3], ragged_record(3))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    k=st.integers(0, 30),
    seed=st.integers(0, 2**64 - 1),
    mode=st.sampled_from(["Sequential", "IID", "Cyclic"]),
    batch_size=st.integers(1, 25),  # Cyclic needs batch_size * world_size <= n (103)
    world_size=st.sampled_from([1, 2, 4]),
)
def test_restored_loader_yields_what_the_original_yields_next(
    stores: dict[str, Any], k: int, seed: int, mode: str, batch_size: int, world_size: int
) -> None:
    kw = {"batch_size": batch_size * world_size, "mode": mode, "seed": seed, "num_threads": 2}
    with DataLoader(stores, start_step=k, **kw) as original:
        state = original.state_dict()
        want = [fingerprint(next(original)) for _ in range(2)]
    with DataLoader(stores, **kw) as restored:
        restored.load_state_dict(state)
        assert [fingerprint(next(restored)) for _ in range(2)] == want
    # The same global batch split over world_size ranks, resumed from the state.
    parts = []
    for rank in range(world_size):
        kw_rank = {**kw, "batch_size": batch_size, "rank": rank, "world_size": world_size}
        with DataLoader(stores, **kw_rank) as shard:
            shard.load_state_dict(state)
            parts.append(next(shard)["label"])
    expected = expected_batch(stores, k, batch_size * world_size, mode, seed)["label"]
    np.testing.assert_array_equal(np.concatenate(parts), expected)
