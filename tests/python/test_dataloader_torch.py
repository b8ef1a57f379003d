"""loaderx.torch: zero-copy tensors from loader batches (skipped without torch)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from loader_util import make_stores, open_stores

torch = pytest.importorskip("torch")

from loaderx.dataloader import DataLoader
from loaderx.torch import StatefulLoader, device_transform, iter_torch, to_torch


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = open_stores(make_stores(tmp_path_factory.mktemp("stores")))
    yield s
    for store in s.values():
        store.close()


def test_to_torch_shares_the_batch_memory(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=8, seed=3) as loader:
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
    with DataLoader(stores, batch_size=4, seed=9) as a, DataLoader(stores, batch_size=4, seed=9) as b:
        for _, tensors in zip(range(3), iter_torch(a)):
            want = next(b)
            np.testing.assert_array_equal(tensors["img"].numpy(), want["img"])


def test_device_transform_moves_every_array(stores: dict[str, Any]) -> None:
    move = device_transform("cpu")  # no pinning on the CPU: nothing to overlap with
    with DataLoader(stores, batch_size=4, transform=move, seed=1) as loader, DataLoader(stores, batch_size=4, seed=1) as raw:
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


def test_stateful_loader_checkpoint_survives_torch_save_weights_only(
        stores: dict[str, Any], tmp_path: Any) -> None:
    with StatefulLoader(DataLoader(stores, batch_size=6, mode="Cyclic", seed=5, num_threads=1)) as run:
        want = [next(run) for _ in range(12)]  # the uninterrupted run
    with StatefulLoader(DataLoader(stores, batch_size=6, mode="Cyclic", seed=5, num_threads=3)) as first:
        for k in range(5):
            got = next(first)
            assert isinstance(got["img"], torch.Tensor)
            assert torch.equal(got["img"], want[k]["img"])
        torch.save({"loader": first.state_dict(), "epoch": 0}, tmp_path / "ckpt.pt")
        assert first.step == 5
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["loader"]["step"] == 5 and ckpt["loader"]["mode"] == "Cyclic"
    # Resume on more threads and more prefetch: the next batches are steps 5.. exactly.
    with StatefulLoader(DataLoader(stores, batch_size=6, mode="Cyclic", seed=5, num_threads=4,
                                   prefetch=5)) as resumed:
        resumed.load_state_dict(ckpt["loader"])
        for k in range(5, 12):
            got = next(resumed)
            assert torch.equal(got["img"], want[k]["img"])
            assert torch.equal(got["label"], want[k]["label"])
            assert all(torch.equal(a, b) for a, b in zip(got["tok"], want[k]["tok"]))
    # ... and as rank 1 of 2 (batch 3 each, the same global batch of 6): its half of each step.
    with StatefulLoader(DataLoader(stores, batch_size=3, mode="Cyclic", seed=5, rank=1,
                                   world_size=2)) as half:
        half.load_state_dict(ckpt["loader"])
        got = next(half)
        assert torch.equal(got["img"], want[5]["img"][3:])


def test_stateful_loader_refuses_a_state_of_another_order(stores: dict[str, Any]) -> None:
    with StatefulLoader(DataLoader(stores, batch_size=4, seed=1)) as a, \
            StatefulLoader(DataLoader(stores, batch_size=4, seed=2)) as b:
        next(a)
        with pytest.raises(ValueError, match="seed"):
            b.load_state_dict(a.state_dict())
        assert b.step == 0
    with pytest.raises(TypeError):
        StatefulLoader(stores)  # type: ignore[arg-type]


def test_stateful_loader_owns_its_loader(stores: dict[str, Any]) -> None:
    inner = DataLoader(stores, batch_size=4)
    wrapped = StatefulLoader(inner)
    assert bool(wrapped)
    got = next(iter(wrapped))
    assert got["img"].data_ptr() != 0 and tuple(got["img"].shape) == (4, 2, 3)
    wrapped.close()
    assert inner.closed and not wrapped


def test_stateful_loader_checkpoints_skipped_ranges(stores: dict[str, Any], tmp_path: Any) -> None:
    def label_of(step: int) -> Any:
        with DataLoader(stores, batch_size=4, seed=5, start_step=step) as ref:
            return torch.from_numpy(next(ref)["label"].copy())

    with StatefulLoader(DataLoader(stores, batch_size=4, seed=5, skip=[(2, 4)])) as first:
        assert [torch.equal(next(first)["label"], label_of(s)) for s in (0, 1, 4)] == [True] * 3
        first.loader.skip(6, 9)
        torch.save({"loader": first.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["loader"]
    assert state["step"] == 5 and state["skip"] == [[2, 4], [6, 9]]
    with StatefulLoader(DataLoader(stores, batch_size=4, seed=5)) as resumed:
        resumed.load_state_dict(state)
        assert resumed.loader.skip_ranges == ((2, 4), (6, 9))
        assert [torch.equal(next(resumed)["label"], label_of(s)) for s in (5, 9)] == [True, True]
        assert resumed.step == 10
