"""The embedded DataLoader's own test suite (and the mixing and packing suites), run
unchanged through loaderxd.

Every DataLoader those tests build gets ``daemon=<socket>`` (plugin
daemon_everywhere.py), so their determinism, resume, sharding, transform and
error checks all hold for the daemon path too. Deselected: the few tests that
swap the embedded pipeline for a scripted fake source (``fake`` fixture) to
test the DataLoader shell itself — with a daemon, batches do not come from
that fake, and the shell they test is the same object either way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT

SUITE = ["tests/python/test_dataloader.py", "tests/python/test_dataloader_guarantees.py",
         "tests/python/test_dataloader_skip.py", "tests/python/test_mix.py",
         "tests/python/test_ragged_batch.py",
         "tests/python/test_packing.py"]
FAKE_SOURCE_TESTS = ("not (source_error_is_raised or close_wakes_a_thread_blocked or keyboard_interrupt_in_next"
                     " or exception_raised_after_a_batch_was_counted)")


def test_embedded_loader_suite_passes_through_the_daemon(daemon) -> None:
    here = os.path.dirname(__file__)
    env = dict(os.environ, LOADERX_FORCE_DAEMON=daemon.socket,
               PYTHONPATH=os.pathsep.join([*sys.path, here]))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "daemon_everywhere",
         "-k", FAKE_SOURCE_TESTS, *SUITE],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", r.stdout).group(1))
    assert passed >= 40
    assert daemon.stats()["batches_served"] > 100  # really served by the daemon
