"""Interpreter exit while daemon threads are inside native store calls.

Every native store entry point releases the GIL with the extension's one
exit-safe rule (``WithoutGil`` in python/src/bindings.h). A daemon thread that
is inside a store call when the interpreter finalizes must not abort the
process (``terminate called without an active exception``, exit code 134):
the process exits 0 and promptly. One child interpreter per kind of call, so
a failure names the entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from loaderx.zrecord import Dense, Ragged

ROOT = Path(__file__).resolve().parents[2]

# Each loop keeps one daemon thread (two for gathers) inside native store
# work, with large enough records that most of the time is spent there.
CALLS = {
    "dense_gather": "lambda: dense[idx]",
    "dense_record": "lambda: dense[7]",
    "ragged_gather": "lambda: ragged[idx]",
    "ragged_record": "lambda: ragged[3]",
    "verify": "lambda: dense.verify()",
    "write": "write_one",
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("exit_stores")
    rng = np.random.default_rng(5)
    with Dense.create(root / "dense", np.uint8, (3, 128, 128), codec="zstd") as d:
        d.append(rng.integers(0, 255, (256, 3, 128, 128), dtype=np.uint8))
    with Ragged.create(root / "ragged", np.int32, 1, codec="zstd") as r:
        r.append([rng.integers(0, 50_000, 20_000 + 37 * k, dtype=np.int32) for k in range(64)])
    return root


@pytest.mark.parametrize("call", sorted(CALLS))
def test_exit_while_daemon_threads_are_in_a_store_call_exits_zero(stores: Path, tmp_path: Path,
                                                                  call: str) -> None:
    script = textwrap.dedent(f"""
        import itertools, sys, threading, time
        import numpy as np
        from loaderx.zrecord import Dense, Ragged
        root = sys.argv[1]
        dense = Dense.open(root + "/dense")
        ragged = Ragged.open(root + "/ragged")
        idx = np.arange(0, 64, dtype=np.int64)
        counter = itertools.count()
        block = np.zeros((64, 3, 128, 128), dtype=np.uint8)
        def write_one():
            with Dense.create(sys.argv[2] + "/w%d" % next(counter), np.uint8, (3, 128, 128),
                              codec="zstd") as w:
                w.append(block)
        fn = {CALLS[call]}
        started = threading.Event()
        def loop():
            while True:
                fn()
                started.set()
        for _ in range(2):
            threading.Thread(target=loop, daemon=True).start()
        started.wait(30)
        time.sleep(0.2)
        print("exiting", flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    for attempt in range(3):  # the abort hit every run before the fix; three chances to hit it
        done = subprocess.run([sys.executable, "-c", script, str(stores), str(tmp_path / str(attempt))],
                              check=False, capture_output=True, text=True, timeout=60, env=env)
        assert "terminate called" not in done.stderr, done.stderr[-2000:]
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert done.stdout.strip() == "exiting"
