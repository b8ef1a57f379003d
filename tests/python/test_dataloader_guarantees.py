"""DataLoader guarantees: errors per step, concurrent transform, close, exit, Ctrl-C."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import loaderx.sources as sources_module
import numpy as np
import pytest
from loader_util import (
    assert_batch_equal,
    expected_batch,
    paths_fixture,  # noqa: F401  (pytest fixture)
    stores_fixture,  # noqa: F401  (pytest fixture)
)
from loaderx.dataloader import DataLoader, SourceSpec
from loaderx.errors import CorruptStoreError, LoaderClosedError

REPO = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": f"{REPO / 'python'}:{Path(__file__).parent}", "PATH": os.environ["PATH"]}


class FakeSource:
    """A BatchSource following the documented contract, with injected faults.

    Batches are ``{"step": np.array([step])}``; steps in ``fail`` raise
    CorruptStoreError; steps in ``interrupt`` raise KeyboardInterrupt once,
    without being consumed; ``block`` makes every wait time out until closed.
    """

    def __init__(self, spec: SourceSpec, fail: set[int], block: bool, interrupt: set[int]) -> None:
        self._step = spec.start_step
        self.fail = fail
        self.block = block
        self.interrupt = interrupt
        self.closed = threading.Event()
        self.close_calls = 0
        self.interrupt_after: set[int] = set()
        self.seek_interrupt: set[int] = set()
        self.seek_lands = False
        self.seeks: list[int] = []

    @property
    def step(self) -> int:
        return self._step

    def next_raw(self, timeout: float, stash: list[Any]) -> tuple[int, dict[str, Any]] | None:
        if stash[0] is not None:  # taken before, not counted by the caller yet
            return stash[0]
        if self.closed.is_set():
            raise LoaderClosedError("fake source closed")
        if self.block:
            if self.closed.wait(timeout):
                raise LoaderClosedError("fake source closed")
            return None
        step = self._step
        if step in self.interrupt:  # Ctrl-C while waiting: nothing consumed
            self.interrupt.discard(step)
            raise KeyboardInterrupt
        self._step += 1
        if step in self.fail:
            raise CorruptStoreError(f"fake: step {step} is corrupt")
        stash[0] = step, {"step": np.array([step])}
        if step in self.interrupt_after:  # Ctrl-C just after the hand-over
            self.interrupt_after.discard(step)
            raise KeyboardInterrupt
        return stash[0]

    def seek(self, step: int) -> None:
        if step in self.seek_interrupt:  # Ctrl-C during the seek, before or after it took effect
            self.seek_interrupt.discard(step)
            if self.seek_lands:
                self._step = step
            raise KeyboardInterrupt
        self._step = step
        self.seeks.append(step)

    def close(self) -> None:
        self.close_calls += 1
        self.closed.set()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Makes the next DataLoader use a FakeSource configured through the returned dict."""
    config: dict[str, Any] = {"fail": set(), "block": False, "interrupt": set()}

    def build(streams: Any, spec: SourceSpec) -> FakeSource:
        config["source"] = FakeSource(spec, config["fail"], config["block"], config["interrupt"])
        return config["source"]

    monkeypatch.setattr(sources_module, "EmbeddedSource", build)
    return config


@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_source_error_is_raised_for_its_step_and_the_loader_goes_on(
    stores: dict[str, Any], fake: dict[str, Any], transform: Any
) -> None:
    fake["fail"] = {2}
    with DataLoader(stores, batch_size=4, transform=transform, transform_threads=3) as loader:
        assert int(next(loader)["step"][0]) == 0
        assert int(next(loader)["step"][0]) == 1
        with pytest.raises(CorruptStoreError, match="step 2 is corrupt"):
            next(loader)
        assert loader.step == 3
        assert [int(next(loader)["step"][0]) for _ in range(3)] == [3, 4, 5]


def test_transform_exception_is_raised_for_its_step_with_its_traceback(
    stores: dict[str, Any],
) -> None:
    def explode_on_step_3(batch: dict[str, Any]) -> dict[str, Any]:
        step = int(batch["label"][0] + 7) // 3 // 5  # Sequential, batch 5
        if step == 3:
            raise ValueError(f"bad batch {step}")
        return batch

    with DataLoader(stores, batch_size=5, transform=explode_on_step_3, mode="Sequential", transform_threads=4) as loader:
        for k in range(3):
            assert_batch_equal(next(loader), expected_batch(stores, k, 5, "Sequential"))
        with pytest.raises(ValueError, match="bad batch 3") as info:
            next(loader)
        frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert "explode_on_step_3" in frames
        # Usable afterwards: the failed step is consumed, the next one follows.
        assert loader.step == 4
        assert_batch_equal(next(loader), expected_batch(stores, 4, 5, "Sequential"))
        loader.close()  # closing after an exception is fine


def test_transform_calls_run_concurrently(stores: dict[str, Any]) -> None:
    # Each call waits until three calls are inside the transform at once: a
    # loader that ran them one at a time would break the barrier.
    barrier = threading.Barrier(3, timeout=10)
    active = 0
    peak = 0
    lock = threading.Lock()

    def rendezvous(batch: dict[str, Any]) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        barrier.wait()
        with lock:
            active -= 1
        return int(batch["label"][0])

    with DataLoader(stores, batch_size=4, transform=rendezvous, seed=2, transform_threads=3, prefetch=3) as loader:
        got = [next(loader) for _ in range(9)]
    assert peak == 3
    want = [int(expected_batch(stores, k, 4, seed=2)["label"][0]) for k in range(9)]
    assert got == want


def test_close_wakes_a_thread_blocked_in_next(stores: dict[str, Any], fake: dict[str, Any]) -> None:
    fake["block"] = True
    loader = DataLoader(stores, batch_size=4)
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            next(loader)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.1)
    assert t.is_alive()  # really blocked
    loader.close()
    t.join(timeout=5)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], LoaderClosedError)
    assert fake["source"].close_calls == 1


def test_close_of_the_native_pipeline_ends_a_consumer_thread(stores: dict[str, Any]) -> None:
    loader = DataLoader(stores, batch_size=64, num_threads=1, prefetch=1)
    outcome: list[BaseException] = []

    def consume_forever() -> None:
        try:
            while True:
                next(loader)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    t = threading.Thread(target=consume_forever)
    t.start()
    time.sleep(0.05)
    loader.close()
    t.join(timeout=5)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LoaderClosedError)


def test_close_is_prompt_with_transforms_in_flight_and_idempotent(
    stores: dict[str, Any],
) -> None:
    def slow(batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.2)
        return batch

    loader = DataLoader(stores, batch_size=8, transform=slow, transform_threads=4, prefetch=4)
    next(loader)  # more calls are now running
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 5  # waits for running calls (0.2 s), never hangs
    loader.close()
    assert loader.closed
    with pytest.raises(LoaderClosedError):
        next(loader)


def test_concurrent_closers_all_return_after_the_loader_is_closed(
    stores: dict[str, Any],
) -> None:
    def slow(batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.1)
        return batch

    before = set(threading.enumerate())
    loader = DataLoader(stores, batch_size=8, transform=slow, transform_threads=2)
    # This loader's pool (another test's loader may still be finishing its own).
    pool = [t for t in threading.enumerate()
            if t not in before and t.name.startswith("loaderx-transform")]
    assert len(pool) == 2
    next(loader)
    seen: list[bool] = []

    def closer() -> None:
        loader.close()
        # Whichever thread got here, the transform pool is already joined.
        seen.append(not any(t.is_alive() for t in pool))

    threads = [threading.Thread(target=closer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert seen == [True] * 4


def _threads() -> tuple[set[str], int]:
    names = {t.name for t in threading.enumerate()}
    return names, len(os.listdir("/proc/self/task"))


def _settled_threads() -> tuple[set[str], int]:
    """Thread names and OS task count once threads of earlier tests are gone."""
    import gc

    gc.collect()
    last = _threads()
    for _ in range(50):
        time.sleep(0.02)
        now = _threads()
        if now == last:
            return now
        last = now
    return last


def test_no_thread_outlives_close(stores: dict[str, Any]) -> None:
    DataLoader(stores, batch_size=8, transform=lambda b: b).close()  # lazily created process-wide pools
    before_names, before_tasks = _settled_threads()
    loader = DataLoader(stores, batch_size=8, transform=lambda b: b, num_threads=4, transform_threads=3)
    for _ in range(5):
        next(loader)
    assert _threads()[1] > before_tasks  # the loader did start threads
    loader.close()
    assert {t.name for t in threading.enumerate()} == before_names
    # Python's Thread.join returns when the thread's Python code is done; the
    # OS thread ends a moment later, so wait (boundedly) for the task count.
    deadline = time.monotonic() + 5
    while _threads()[1] != before_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads()[1] == before_tasks


def test_garbage_collected_loader_is_closed(stores: dict[str, Any]) -> None:
    import gc

    DataLoader(stores, batch_size=8, transform=lambda b: b).close()
    _, before_tasks = _settled_threads()
    loader = DataLoader(stores, batch_size=8, transform=lambda b: b, num_threads=3, transform_threads=2)
    next(loader)
    del loader
    gc.collect()
    deadline = time.monotonic() + 5
    while _threads()[1] != before_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads()[1] == before_tasks


def _run_child(
    script: str, paths: dict[str, Path], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    arg = json.dumps({k: str(v) for k, v in paths.items()})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), arg],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


_CHILD_PRELUDE = """
import json, os, signal, sys, threading, time
from pathlib import Path
from loader_util import open_stores
from loaderx.dataloader import DataLoader
stores = open_stores({k: Path(v) for k, v in json.loads(sys.argv[1]).items()})
"""


@pytest.mark.parametrize("keep", ["global", "cycle", "blocked"])
def test_unclosed_loader_does_not_hang_interpreter_exit(paths: dict[str, Path], keep: str) -> None:
    script = (
        _CHILD_PRELUDE
        + f"""
keep = {keep!r}
loader = DataLoader(stores, batch_size=16, transform=lambda b: b, num_threads=2, transform_threads=2, prefetch=4)
next(loader)
if keep == "cycle":
    loader.me = loader  # only the cycle collector could free it
if keep == "blocked":  # a daemon thread is blocked in next() at exit
    threading.Thread(target=lambda: [next(loader) for _ in iter(int, 1)], daemon=True).start()
    time.sleep(0.05)
print("exiting", flush=True)
"""
    )
    t0 = time.monotonic()
    done = _run_child(script, paths, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("where", ["native", "transform"])
def test_ctrl_c_during_next_raises_keyboard_interrupt_quickly(
    paths: dict[str, Path], where: str
) -> None:
    # The child signals itself from a helper thread and measures, on one
    # clock, how long the main thread blocked in next() takes to raise.
    script = (
        _CHILD_PRELUDE
        + f"""
where = {where!r}
stop = threading.Event()
def slow(batch):
    stop.wait(30)  # releases the GIL like real work in NumPy would
    return batch
if where == "native":
    # A loader that is always waiting for its pipeline: big batches, one
    # gather thread, prefetch 1, and a consumer that drops batches at once.
    loader = DataLoader(stores, batch_size=4096, num_threads=1, prefetch=1)
else:
    loader = DataLoader(stores, batch_size=8, transform=slow, transform_threads=2)
delays = []
for attempt in range(3):
    sent = []
    def interrupt():
        time.sleep(0.2)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt).start()
    try:
        while True:
            next(loader)
    except KeyboardInterrupt:
        delays.append(time.monotonic() - sent[0])
stop.set()
loader.close()
print(json.dumps(delays))
"""
    )
    done = _run_child(script, paths, timeout=120)
    assert done.returncode == 0, done.stderr
    delays = json.loads(done.stdout)
    assert len(delays) == 3
    assert sorted(delays)[1] < 0.1, delays  # median within 100 ms
    assert max(delays) < 1.0, delays


def take_through_interrupts(loader: DataLoader, k: int) -> tuple[list[int], int]:
    """The steps of `k` batches taken with next(), again after each KeyboardInterrupt
    (which must consume nothing, and is followed by a pause); and the interrupts."""
    got: list[int] = []
    interrupts = 0
    while len(got) < k:
        before = loader.step
        try:
            got.append(int(next(loader)["step"][0]))
        except KeyboardInterrupt:
            interrupts += 1
            assert loader.step == before == loader.state_dict()["step"]  # nothing consumed
            time.sleep(0.1)  # a pause after Ctrl-C: the transform calls under way finish
    return got, interrupts


def _slow_identity(batch: Any) -> Any:
    time.sleep(0.05)  # step 0's call still runs when next() tops up its window with step 1
    return batch


@pytest.mark.parametrize("where", ["while_waiting", "after_the_hand_over"])
@pytest.mark.parametrize("transform", [None, lambda b: b, _slow_identity])
def test_keyboard_interrupt_in_next_consumes_no_step(
    stores: dict[str, Any], fake: dict[str, Any], transform: Any, where: str
) -> None:
    # The fake raises KeyboardInterrupt once, when step 1 is fetched: in the
    # next() for step 1, or already in the next() for step 0 if that one
    # tops up its transform window while step 0's call runs. Either way no
    # step is consumed and the sequence goes on unchanged. "after_the_hand_over":
    # the source has taken step 1 and put it in the loader's stash when the
    # interrupt is raised (what a Ctrl-C during the native wait does).
    if where == "while_waiting":
        fake["interrupt"] = {1}
    with DataLoader(stores, batch_size=4, transform=transform) as loader:
        if where == "after_the_hand_over":
            fake["source"].interrupt_after = {1}
        got, interrupts = take_through_interrupts(loader, 4)
        assert got == [0, 1, 2, 3]
        assert interrupts == 1
        assert loader.step == 4


def test_an_exception_raised_after_a_batch_was_counted_gives_the_step_back(
    stores: dict[str, Any], fake: dict[str, Any]
) -> None:
    # An exception that lands in the loader's frames after the step was
    # counted (a Ctrl-C between two Python calls there) gives it back.
    with DataLoader(stores, batch_size=4) as loader:
        assert int(next(loader)["step"][0]) == 0

        def interrupted(batch: Any) -> Any:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            loader._deliver(interrupted)
        assert loader.step == 1 == loader.state_dict()["step"]
        assert [int(next(loader)["step"][0]) for _ in range(2)] == [1, 2]


@pytest.mark.parametrize("seek_lands", [False, True])
@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_keyboard_interrupt_in_next_at_the_seek_past_a_skipped_range_consumes_no_step(
    stores: dict[str, Any], fake: dict[str, Any], transform: Any, seek_lands: bool
) -> None:
    # Reaching the range [2, 5), the loader seeks the source to 5; Ctrl-C
    # lands in that seek (before or after the source moved). No step is
    # consumed or skipped beyond the range, and the source never produces
    # a step of the range.
    with DataLoader(stores, batch_size=4, transform=transform, skip=[(2, 5)]) as loader:
        source = fake["source"]
        source.seek_interrupt = {5}
        source.seek_lands = seek_lands
        source.interrupt = {2, 3, 4}  # would raise if a skipped step were ever fetched
        got, interrupts = take_through_interrupts(loader, 4)
        assert got == [0, 1, 5, 6]
        assert interrupts == 1
        assert source.interrupt == {2, 3, 4}
        assert source.seeks == [5]
        assert loader.step == 7


def _interrupt_at(n: int, files: tuple[str, ...]) -> Any:
    """A profile function raising KeyboardInterrupt at the `n`-th point of a
    frame of `files` where CPython raises a pending Ctrl-C: the entry of a
    Python function and the return of a call to a C function."""
    seen = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_return") and frame.f_code.co_filename.endswith(files):
            seen[0] += 1
            if seen[0] == n:
                raise KeyboardInterrupt

    return profile


@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_an_interrupt_at_any_point_of_the_loaders_frames_consumes_no_step(
    stores: dict[str, Any], transform: Any
) -> None:
    # A Ctrl-C is raised at the next point where CPython checks for signals,
    # which may be any function entry or call return of the loader's own
    # Python frames between the source's hand-over and the return of next()
    # (a signal that arrived just after the native wait last looked). Raise
    # it at each such point in turn: every interrupted next() consumes
    # nothing, and the batches that follow are exactly the next steps.
    files = ("loaderx/dataloader.py", "loaderx/sources.py")
    with DataLoader(stores, batch_size=4, transform=transform, prefetch=2) as loader:
        step, n, interrupts = 0, 1, 0
        while True:
            sys.setprofile(_interrupt_at(n, files))
            try:
                batch = next(loader)
            except KeyboardInterrupt:
                interrupts += 1
                assert loader.step == step == loader.state_dict()["step"], (n, loader.step, step)
            else:
                assert_batch_equal(batch, expected_batch(stores, step, 4))
                step += 1
                if sys.getprofile() is not None:  # past the last point of a next(): every one was hit
                    sys.setprofile(None)
                    break
            finally:
                sys.setprofile(None)
            assert_batch_equal(next(loader), expected_batch(stores, step, 4))
            step += 1
            n += 1
        assert interrupts == n - 1 > 5
        assert loader.step == step
