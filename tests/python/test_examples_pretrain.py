"""examples/pretrain_lm.py: packed, mixed batches with a schedule, a skipped
range, a checkpoint, an appended weight change and a resume on another world
size. The script checks the resumed rows itself; this runs it and reads what
it reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pretraining_example_resumes_on_one_rank_with_the_rows_of_two(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "pretrain_lm.py"), "--root", str(tmp_path),
         "--steps", "30", "--switch", "20", "--spike", "6"],
        check=False, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[1] == "skipped steps 7..11 after the spike at 6"
    # Checkpoint at step 15 (the next batch 16); the steps to 40 + 5 = 45,
    # less none skipped after the checkpoint, are compared one by one.
    m = re.fullmatch(r"resumed on 1 rank at step (\d+): (\d+) steps identical to 2 ranks", out[2])
    assert m is not None, out[2]
    assert int(m.group(1)) == 16 and int(m.group(2)) == 45 - 16
    assert out[3] == "schedule: [0, 20, 40]"
    m = re.fullmatch(r"packed (\d+) tokens into rows of 512: ([\d.]+)% padding, ([\d.]+)% dropped",
                     out[0])
    assert m is not None, out[0]
    assert int(m.group(1)) > 0 and 0 < float(m.group(2)) < 100 and 0 <= float(m.group(3)) < 100
