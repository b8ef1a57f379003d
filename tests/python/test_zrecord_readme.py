"""Runs, unmodified, every code example of the reference README's "Records",
"Creating containers" and "Codec notes" sections against this package.

The examples are read from the reference README at test time (not copied
here); the test is skipped where that file is absent. Names the examples leave
to the reader (``images``, ``consume``, ...) are provided with real arrays.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loaderx.zrecord import Dense, Ragged

README = Path(os.environ.get("LOADERX_REFERENCE_README",
                             "/work/shared/reference/loaderx-2.5.4-README.txt"))
SECTIONS = ("Records", "Creating containers", "Codec notes")


def _examples() -> list[tuple[str, int, str]]:
    if not README.exists():
        return []
    text = README.read_text()
    out = []
    for name in SECTIONS:
        m = re.search(rf"^### {re.escape(name)}\n(.*?)(?=^### |\Z)", text, re.DOTALL | re.MULTILINE)
        assert m, f"section {name!r} not found in {README}"
        for k, block in enumerate(re.findall(r"```python\n(.*?)```", m.group(1), re.DOTALL)):
            out.append((name, k, block))
    return out


EXAMPLES = _examples()


def _namespace(consumed: list[Any]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (64, 28, 28), dtype=np.uint8)
    images[:, :8] = 0
    seqs = [rng.integers(0, 100, int(n), dtype=np.int32) for n in rng.integers(1, 300, 200)]
    return {
        "np": np,
        "consume": consumed.append,
        "images": images,
        "sequences": seqs,
        "settled_array": rng.integers(0, 20, (2000, 64), dtype=np.int32),
        "token_generator": (s for s in seqs),
        "data": rng.integers(0, 20, (500, 16), dtype=np.int32),
    }


@pytest.mark.skipif(not EXAMPLES, reason=f"reference README not found at {README}")
@pytest.mark.parametrize("section,k,code", EXAMPLES, ids=[f"{s}-{k}" for s, k, _ in EXAMPLES])
def test_reference_example_runs_unmodified(section: str, k: int, code: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The codec-change example reads an existing store called "src".
    with Dense.create("src", np.float32, (4, 4), codec="zstd") as s:
        s.append(np.tile(np.arange(16, dtype=np.float32).reshape(1, 4, 4), (300, 1, 1)))
    consumed: list[Any] = []
    ns = _namespace(consumed)
    exec(compile(code, f"README:{section}:{k}", "exec"), ns)  # noqa: S102 - running them is the test

    # The documented types and shapes.
    if "record" in ns and "batch" in ns:          # Records, Dense
        assert ns["record"].shape == (2, 4) and ns["record"].dtype == np.float32
        assert ns["batch"].shape == (3, 2, 4)
        data = np.arange(64, dtype=np.float32).reshape(8, 2, 4)
        np.testing.assert_array_equal(ns["batch"], data[[0, 5, 2]])
        assert len(consumed) == 8 and all(c.shape == (2, 4) for c in consumed)
    if "records" in ns:                            # Records, Ragged
        assert ns["record"].shape == (5,)  # the loop left the last record bound
        assert isinstance(ns["records"], list)
        assert [r.tolist() for r in ns["records"]] == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
        assert ns["padded"].shape == (3, 5)
        assert [c.shape for c in consumed] == [(3,), (1,), (4,), (1,), (5,)]
    if "first_four" in ns:                         # Creating containers
        assert ns["first_four"].shape == (4, 28, 28) and ns["first_four"].dtype == np.uint8
        np.testing.assert_array_equal(ns["first_four"], ns["images"][:4])
        with Ragged.open("tokens") as t:
            assert len(t) == len(ns["sequences"])
            assert all(np.array_equal(a, b) for a, b in zip(t, ns["sequences"]))
    if section == "Codec notes" and "d" in ns and isinstance(ns["d"], bytes):
        with Dense.open("data") as ds:
            assert ds.codec == "zstd_dict"
            np.testing.assert_array_equal(ds[:], ns["data"])
    if section == "Codec notes" and Path("dst").exists():
        with Dense.open("dst") as d, Dense.open("src") as s:
            assert d.codec == "zstd_dict" and d.item_shape == s.item_shape
            np.testing.assert_array_equal(d[:], s[:])


def test_examples_were_found() -> None:
    if not README.exists():
        pytest.skip("reference README absent")
    assert {s for s, _, _ in EXAMPLES} == set(SECTIONS)
    assert len(EXAMPLES) >= 5
