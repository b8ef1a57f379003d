"""loaderx.torch: zero-copy tensors from loader batches (skipped without torch)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from loader_util import make_stores, open_stores

torch = pytest.importorskip("torch")

from loaderx.dataloader import DataLoader
from loaderx.torch import device_transform, iter_torch, to_torch


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = open_stores(make_stores(tmp_path_factory.mktemp("stores")))
    yield s
    for store in s.values():
        store.close()


def test_to_torch_shares_the_batch_memory(stores: dict[str, Any]) -> None:
    with DataLoader(stores, 8, seed=3) as loader:
        batch = next(loader)
    tensors = to_torch(batch)
    img = tensors["img"]
    assert img.dtype == torch.float32 and tuple(img.shape) == (8, 2, 3)
    assert img.data_ptr() == batch["img"].ctypes.data  # no copy
    assert tensors["label"].dtype == torch.int64
    assert isinstance(tensors["tok"], list) and len(tensors["tok"]) == 8
    for t, a in zip(tensors["tok"], batch["tok"]):
        assert t.dtype == torch.int32 and tuple(t.shape) == a.shape
        np.testing.assert_array_equal(t.numpy(), a)
    del batch
    np.testing.assert_array_equal(img.numpy(), img.numpy().copy())  # still alive


def test_to_torch_of_read_only_arrays_does_not_warn_or_copy() -> None:
    a = np.arange(6, dtype=np.uint8)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = to_torch({"a": a, "meta": "kept"})
    assert t["a"].data_ptr() == a.ctypes.data
    assert t["meta"] == "kept"


def test_iter_torch_yields_tensors_of_the_same_batches(stores: dict[str, Any]) -> None:
    with DataLoader(stores, 4, seed=9) as a, DataLoader(stores, 4, seed=9) as b:
        for _, tensors in zip(range(3), iter_torch(a)):
            want = next(b)
            np.testing.assert_array_equal(tensors["img"].numpy(), want["img"])


def test_device_transform_moves_every_array(stores: dict[str, Any]) -> None:
    move = device_transform("cpu")  # no pinning on the CPU: nothing to overlap with
    with DataLoader(stores, 4, move, seed=1) as loader, DataLoader(stores, 4, seed=1) as raw:
        got, want = next(loader), next(raw)
    assert got["img"].device.type == "cpu"
    np.testing.assert_array_equal(got["img"].numpy(), want["img"])
    assert all(isinstance(t, torch.Tensor) for t in got["tok"])


def test_pinned_device_transform_needs_an_accelerator() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: pinned-memory transfer cannot be exercised")
    move = device_transform("cuda:0")
    out = move({"x": np.arange(4, dtype=np.float32)})
    assert out["x"].device.type == "cuda"
