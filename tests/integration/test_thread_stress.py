"""Many Python threads on one shared native object: no crash, hang or wrong value.

The groundwork for free-threaded CPython (docs/platforms.md, "Free-threaded
CPython"). On the GIL build every call below that does real work releases the
GIL (gathers, the loader's waits, its seeks and closes, large sampler fills),
so the threads do run the engine concurrently; what the GIL still serialises
is the Python code around those calls. Each test runs its threads for
``LOADERX_STRESS_SECONDS`` (default 1.5 s) and joins them with a timeout, so
a hang fails instead of blocking the suite.

Every value a thread gets is checked exactly against the records written:
a loader batch must be a whole, correct batch of *some* step (its rows are
identified by the label stream, labels are ``3 * index``), and the steps
handed out must be distinct and, without seeks, exactly ``0..total-1``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from loaderx.dataloader import DataLoader
from loaderx.errors import LoaderClosedError, StateError
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

SECONDS = float(os.environ.get("LOADERX_STRESS_SECONDS", "1.5"))
THREADS = 8
BATCH = 8
JOIN_SECONDS = 20.0  # far above SECONDS: only a hang gets there


def run_threads(targets: list[Callable[[], None]]) -> None:
    """Runs each target on its own thread; re-raises the first failure; fails on a hang."""
    errors: list[BaseException] = []

    def guard(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_SECONDS
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads still running after {JOIN_SECONDS} s: {hung}"
    if errors:
        raise errors[0]


class Reference:
    """The records of the ``stores`` fixture and the sampler's steps, to check batches exactly."""

    def __init__(self, stores: dict[str, Any], mode: Any, seed: int, steps: int) -> None:
        self.images: np.ndarray = stores["images"]
        self.tokens: list[np.ndarray] = stores["tokens"]
        n = len(self.images)
        sampler = Sampler(n, BATCH, mode, seed)
        self.step_of = {tuple(sampler.peek(s).tolist()): s for s in range(steps)}
        # Each step's indices identify it (else "which step" would be ambiguous).
        assert len(self.step_of) == steps

    def step(self, batch: dict[str, Any]) -> int:
        """The step whose batch this is; fails unless every byte of it is that step's."""
        assert sorted(batch) == ["image", "label", "tokens"]
        label = batch["label"]
        assert label.dtype == np.int64 and label.shape == (BATCH,)
        assert (label % 3 == 0).all(), label
        idx = label // 3
        step = self.step_of.get(tuple(idx.tolist()))
        assert step is not None, f"indices {idx.tolist()} are no step's batch"
        image = batch["image"]
        assert image.dtype == np.uint8 and image.shape == (BATCH, 3, 8, 8)
        assert np.array_equal(image, self.images[idx]), f"step {step}: image rows differ"
        tokens = batch["tokens"]
        assert len(tokens) == BATCH
        for k, i in enumerate(idx):
            want = self.tokens[i]
            assert tokens[k].dtype == want.dtype and np.array_equal(tokens[k], want), (step, k)
        return step


def loader_kwargs(transform: bool, daemon: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"batch_size": BATCH, "seed": 5, "prefetch": 4, "num_threads": 2}
    if transform:
        # A transform other than identity: batches go through the transform pool.
        kwargs.update(transform=lambda b: b, transform_threads=3)
    if daemon is not None:
        kwargs["daemon"] = daemon.socket
    return kwargs


HOSTS = ["embedded", "loaderxd"]


@pytest.fixture(params=HOSTS)
def host(request: pytest.FixtureRequest) -> Any:
    """None for the embedded loader, else a real loaderxd (tests/integration/conftest.py)."""
    return request.getfixturevalue("daemon") if request.param == "loaderxd" else None


@pytest.mark.parametrize("transform", [False, True], ids=["raw", "transform"])
def test_concurrent_next_hands_out_each_step_once_in_order(stores, host, transform) -> None:
    steps = 6000  # more than the threads take in SECONDS on this machine
    ref = Reference(stores, Sampler.Mode.Cyclic, 5, steps)
    got: list[list[int]] = [[] for _ in range(THREADS)]
    states: list[int] = []
    stop = time.monotonic() + SECONDS
    per_thread = steps // THREADS

    with DataLoader(stores["streams"], **loader_kwargs(transform, host)) as loader:

        def consume(mine: list[int]) -> None:
            while time.monotonic() < stop and len(mine) < per_thread:
                mine.append(ref.step(next(loader)))

        def watch() -> None:
            while time.monotonic() < stop:
                states.append(loader.state_dict()["step"])
                states.append(loader.step)
                time.sleep(0.001)

        run_threads([lambda mine=mine: consume(mine) for mine in got] + [watch])
        total = sum(len(mine) for mine in got)
        assert loader.step == total and loader.state_dict()["step"] == total

    # Every step once, none skipped: exactly 0..total-1 across all threads;
    # each thread's own steps are increasing (delivery is in step order).
    assert sorted(s for mine in got for s in mine) == list(range(total))
    for mine in got:
        assert mine == sorted(mine)
    assert total >= THREADS  # every thread got batches
    # The position only moves forward and never past what was handed out.
    assert states == sorted(states) and all(0 <= s <= total for s in states)


@pytest.mark.parametrize("transform", [False, True], ids=["raw", "transform"])
def test_next_seek_state_dict_and_close_from_many_threads(stores, host, transform) -> None:
    seek_range = 100
    max_calls = 3000
    ref = Reference(stores, Sampler.Mode.Cyclic, 5, seek_range + max_calls + 1)
    calls = [0]
    count_lock = threading.Lock()
    closed = threading.Event()
    seen: list[int] = []
    seeks: list[int] = []

    loader = DataLoader(stores["streams"], **loader_kwargs(transform, host))

    def consume() -> None:
        while True:
            with count_lock:
                calls[0] += 1
                if calls[0] > max_calls:  # keeps every step inside ref
                    break
            try:
                batch = next(loader)
            except LoaderClosedError:
                assert closed.is_set()
                return
            seen.append(ref.step(batch))
        closed.wait(JOIN_SECONDS)

    def seek_and_save() -> None:
        rng = np.random.default_rng(1)
        while not closed.is_set():
            try:
                target = int(rng.integers(0, seek_range))
                loader.seek(target)
                seeks.append(target)
                state = loader.state_dict()
                assert 0 <= state["step"] <= seek_range + max_calls
                loader.load_state_dict(state)
            except LoaderClosedError:
                assert closed.is_set()
                return
            time.sleep(0.002)

    def close_later() -> None:
        time.sleep(SECONDS)
        closed.set()
        loader.close()

    consumers = [consume for _ in range(THREADS - 2)]
    run_threads([*consumers, seek_and_save, seek_and_save, close_later])
    loader.close()  # idempotent
    assert loader.closed and len(seen) > THREADS and len(seeks) > 2
    with pytest.raises(LoaderClosedError):
        next(loader)
    assert loader.state_dict()["step"] >= 0


def test_concurrent_closers_and_consumers_end_cleanly(stores, host) -> None:
    """close() from several threads at once, while others are blocked in next()."""
    ref = Reference(stores, Sampler.Mode.Cyclic, 5, 4000)
    for _ in range(3):
        loader = DataLoader(stores["streams"], **loader_kwargs(True, host))
        close_while_consuming(loader, ref)
        assert loader.closed


def close_while_consuming(loader: DataLoader, ref: Reference) -> None:
    start = threading.Barrier(THREADS)

    def consume() -> None:
        start.wait()
        for _ in range(400):
            try:
                ref.step(next(loader))
            except LoaderClosedError:
                return

    def close() -> None:
        start.wait()
        time.sleep(0.05)
        loader.close()

    run_threads([consume] * (THREADS - 3) + [close] * 3)


# -- stores ----------------------------------------------------------------


def test_gathers_on_shared_stores_from_many_threads(tmp_path) -> None:
    n = 300
    rng = np.random.default_rng(2)
    small = rng.integers(0, 1 << 30, size=(n, 5), dtype=np.int64)
    # 32 KiB records: a gather of 64+ of them passes 2 MiB, one of 128+ the
    # 4 MiB above which outputs come from the reused-buffer allocator.
    big = np.stack([(np.arange(1 << 15, dtype=np.uint32) * 7 + i) % 251 for i in range(n)]).astype(np.uint8)
    tokens = [(np.arange(i % 37, dtype=np.int32) * 3 + i).reshape(-1) for i in range(n)]
    with Dense.create(str(tmp_path / "small"), small.dtype, (5,), codec="raw") as w:
        w.append(small)
    with Dense.create(str(tmp_path / "big"), big.dtype, big.shape[1:], codec="zstd") as w:
        w.append(big)
    with Ragged.create(str(tmp_path / "tok"), np.int32, ndim=1, codec="zstd") as w:
        w.append(tokens)
    ds, db, rs = (Dense.open(str(tmp_path / "small")), Dense.open(str(tmp_path / "big")),
                  Ragged.open(str(tmp_path / "tok")))
    stop = time.monotonic() + SECONDS
    done = [0]

    def reader(seed: int) -> None:
        r = np.random.default_rng(seed)
        kept: list[tuple[np.ndarray, np.ndarray]] = []  # large outputs held while others gather
        while time.monotonic() < stop:
            idx = r.integers(0, n, size=int(r.integers(1, 200))).astype(np.uint64)
            op = int(r.integers(0, 6))
            if op == 0:
                out = db[idx]  # GIL-free gather, reused buffer when >= 4 MiB
                assert out.shape == (len(idx), 1 << 15) and np.array_equal(out, big[idx])
                kept = [*kept[-3:], (out, idx)]
            elif op == 1:
                assert np.array_equal(ds[idx], small[idx])
            elif op == 2:
                got = rs[idx]
                assert len(got) == len(idx)
                assert all(np.array_equal(g, tokens[i]) for g, i in zip(got, idx))
            elif op == 3:
                i = int(idx[0])
                assert np.array_equal(ds[i], small[i]) and np.array_equal(db[i], big[i])
                assert np.array_equal(rs[i], tokens[i])
            elif op == 4:
                a, b = sorted(r.integers(0, n, size=2).tolist())
                assert np.array_equal(db[a:b], big[a:b])
            else:
                as_list = idx.astype(np.int64).tolist()
                assert np.array_equal(ds[as_list], small[as_list])
            done[0] += 1
        # What a thread held stayed its own while the others gathered.
        for out, idx in kept:
            assert np.array_equal(out, big[idx])

    run_threads([lambda s=s: reader(s) for s in range(THREADS)])
    assert done[0] > THREADS
    for s in (ds, db, rs):
        s.close()


def test_store_close_while_threads_read_raises_state_error_or_reads_correctly(tmp_path) -> None:
    n = 100
    data = np.arange(n * 4096, dtype=np.int32).reshape(n, 4096)
    with Dense.create(str(tmp_path / "d"), data.dtype, (4096,), codec="zstd") as w:
        w.append(data)
    for _ in range(5):
        close_while_reading(Dense.open(str(tmp_path / "d")), data)


def close_while_reading(store: Dense, data: np.ndarray) -> None:
    closed = threading.Event()
    start = threading.Barrier(THREADS)

    def read(seed: int) -> None:
        r = np.random.default_rng(seed)
        start.wait()
        while True:
            idx = r.integers(0, len(data), size=64).astype(np.uint64)
            was_closed = closed.is_set()
            try:
                out = store[idx] if seed % 2 else store[idx.astype(np.int64).tolist()]
            except StateError:
                assert closed.is_set()
                return
            assert not was_closed, "a read after close() returned data"
            assert np.array_equal(out, data[idx])

    def close() -> None:
        start.wait()
        time.sleep(0.02)
        closed.set()
        store.close()

    run_threads([lambda s=s: read(s) for s in range(THREADS - 1)] + [close])


# -- sampler ---------------------------------------------------------------


def test_shared_sampler_draws_each_step_once() -> None:
    n, steps = 1000, 20000
    sampler = Sampler(n, 16, Sampler.Mode.IID, seed=3)
    reference = Sampler(n, 16, Sampler.Mode.IID, seed=3)
    step_of = {tuple(reference.peek(s).tolist()): s for s in range(steps)}
    assert len(step_of) == steps
    per_thread = steps // THREADS
    drawn = [0] * THREADS
    stop = time.monotonic() + SECONDS

    def draw(k: int) -> None:
        while time.monotonic() < stop and drawn[k] < per_thread:
            # Below 2**16 indices the draw fills the shared buffer with the
            # GIL held, so a copy made with the GIL held is one whole draw
            # (docs/guide.md, Sampler, "Threads"). tolist() holds it; an
            # ndarray copy need not (NumPy 1.x copies without the GIL).
            got = tuple(sampler.next().tolist())
            drawn[k] += 1
            assert got in step_of

    def peek(seed: int) -> None:
        r = np.random.default_rng(seed)
        while time.monotonic() < stop:
            s = int(r.integers(0, steps))
            assert np.array_equal(sampler.peek(s), reference.peek(s))
            assert sampler.state_dict()["step"] <= steps

    run_threads([lambda k=k: draw(k) for k in range(THREADS - 2)] + [lambda: peek(7), lambda: peek(8)])
    # No draw lost or repeated a cursor move.
    assert sampler.step == sum(drawn)


def test_shared_sampler_with_large_batches_filled_without_the_gil() -> None:
    big = 1 << 16  # from here fills release the GIL
    sampler = Sampler(10**9, big, Sampler.Mode.IID, seed=9)
    reference = Sampler(10**9, big, Sampler.Mode.IID, seed=9)
    drawn = [0] * 4
    stop = time.monotonic() + SECONDS

    def draw(k: int) -> None:
        while time.monotonic() < stop:
            view = sampler.next()
            assert view.shape == (big,) and view.dtype == np.uint64
            drawn[k] += 1
            s = int(np.random.default_rng(k + drawn[k]).integers(0, 50))
            assert np.array_equal(sampler.peek(s), reference.peek(s))

    run_threads([lambda k=k: draw(k) for k in range(4)])
    assert sampler.step == sum(drawn)
