"""The batch comparison every daemon test relies on finds each kind of difference."""

from __future__ import annotations

import numpy as np
from batch_compare import batch_difference


def test_batch_difference_names_the_first_difference() -> None:
    a = {"x": np.arange(4, dtype=np.int64), "r": [np.ones(2, np.int32), np.zeros(0, np.int32)]}
    same = {"x": np.arange(4, dtype=np.int64), "r": [np.ones(2, np.int32), np.zeros(0, np.int32)]}
    assert batch_difference(a, same) is None
    assert batch_difference(a, {"x": a["x"]}) == "streams ['r', 'x'] != ['x']"
    assert batch_difference(a, {**a, "x": a["x"].astype(np.int32)}) == "x: int64(4,) != int32(4,)"
    assert batch_difference(a, {**a, "x": a["x"].reshape(2, 2)}) == "x: int64(4,) != int64(2, 2)"
    assert batch_difference(a, {**a, "x": a["x"] + 1}) == "x: values differ"
    assert batch_difference(a, {**a, "r": a["r"][:1]}) == "r: list of 2 != list of 1"
    assert batch_difference(a, {**a, "r": [a["r"][0], np.ones(1, np.int32)]}) == \
        "r[1]: int32(0,) != int32(1,)"
