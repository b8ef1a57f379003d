"""One rule for "two DataLoader batches are the same", shared by the tests (conftest's
``assert_same_batch``) and the client processes they start (reliability_client.py)."""

from __future__ import annotations

import numpy as np


def batch_difference(a: dict, b: dict) -> str | None:
    """``None`` if ``a`` and ``b`` hold the same streams, dtypes, shapes and values, else
    what differs first."""
    if a.keys() != b.keys():
        return f"streams {sorted(a)} != {sorted(b)}"
    for name, x in a.items():
        y = b[name]
        if isinstance(y, list):
            if not isinstance(x, list) or len(x) != len(y):
                return f"{name}: {type(x).__name__} of {len(x)} != list of {len(y)}"
            pairs = list(enumerate(zip(x, y)))
        else:
            pairs = [(None, (x, y))]
        for i, (u, v) in pairs:
            where = name if i is None else f"{name}[{i}]"
            if u.dtype != v.dtype or u.shape != v.shape:
                return f"{where}: {u.dtype}{u.shape} != {v.dtype}{v.shape}"
            if not np.array_equal(u, v):
                return f"{where}: values differ"
    return None
