"""The top-level package: what ``import loaderx`` offers, what it costs, and the names it no longer has."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import loaderx
import loaderx.client
import loaderx.dataloader
import loaderx.idx
import loaderx.zrecord
import numpy as np
import pytest

PKG_ROOT = Path(loaderx.__file__).resolve().parent.parent  # the directory holding loaderx/


def test_top_level_names_are_the_submodules_classes() -> None:
    from loaderx import DataLoader, Dense, Ragged, RaggedBatch

    assert DataLoader is loaderx.dataloader.DataLoader
    assert Dense is loaderx.zrecord.Dense
    assert Ragged is loaderx.zrecord.Ragged
    assert RaggedBatch is loaderx.dataloader.RaggedBatch
    assert {"DataLoader", "Dense", "Ragged", "RaggedBatch"} <= set(loaderx.__all__)
    assert {"DataLoader", "Dense", "Ragged", "RaggedBatch"} <= set(dir(loaderx))


def test_top_level_names_load_a_batch(tmp_path: Path) -> None:
    with loaderx.Dense.create(tmp_path / "x", np.uint8, (2, 3), codec="raw") as w:
        w.append(np.arange(60, dtype=np.uint8).reshape(10, 2, 3))
    with loaderx.Dense.open(tmp_path / "x") as ds, loaderx.DataLoader(
        {"x": ds}, batch_size=4, mode="Sequential"
    ) as loader:
        batch = next(loader)
    assert batch["x"].shape == (4, 2, 3) and batch["x"].dtype == np.uint8
    assert batch["x"].ravel().tolist() == list(range(24))


def test_import_loaderx_loads_neither_the_loader_nor_the_native_module() -> None:
    code = (
        "import sys, loaderx\n"
        "heavy = ['loaderx.dataloader', 'loaderx.zrecord', 'loaderx._loaderx', 'numpy']\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "loaderx.Dense\n"
        "print('loaderx.zrecord' in sys.modules, 'loaderx.dataloader' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(PKG_ROOT)},
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()
    assert out == ["[]", "True False"]


def test_unknown_top_level_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="'loaderx' has no attribute 'Loader'"):
        _ = loaderx.Loader  # type: ignore[attr-defined]
    assert not hasattr(loaderx, "Sampler")


def test_idx_module_replaces_datasets() -> None:
    # The idx reader lives in loaderx.idx. The 2.5.4 wheel had no
    # loaderx.datasets (its files: __init__, _storage, converter, dataloader,
    # utils, zrecord, zsampler), so the old name is gone rather than kept as an alias.
    assert callable(loaderx.idx.read_idx) and callable(loaderx.idx.fashion_mnist)
    with pytest.raises(ModuleNotFoundError, match="loaderx.datasets"):
        importlib.import_module("loaderx.datasets")


def test_daemon_source_alias_is_gone() -> None:
    # DataLoader(..., daemon=...) is the one way to get a daemon loader; the
    # 2.5.4 wheel had no loaderxd, so no 2.5.4 code calls this alias.
    assert not hasattr(loaderx.client, "daemon_source")
    assert "daemon_source" not in loaderx.client.__all__
