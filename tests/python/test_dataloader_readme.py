"""The reference README's loader examples run unmodified against loaderx.

The examples are read at test time from the reference README (never copied
into this repository): the "Quick Start", every block of "DataLoader and
multi-stream stores" and of "CPU → GPU transfer". Names the README leaves to
the reader (``joint``, ``seqs``, ``model`` ...) are defined by a small prelude
on generated data. The one substitution: without CUDA the torch example's
``device = "cuda:0"`` becomes ``"cpu"``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

README = Path(
    os.environ.get("LOADERX_REFERENCE_README", "/work/shared/reference/loaderx-2.5.4-README.txt")
)

pytestmark = pytest.mark.skipif(not README.exists(), reason=f"reference README not at {README}")


def _blocks(section: str) -> list[str]:
    """The ```python blocks under the '### <section>' heading, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"### {section}\n")
    end = text.find("\n### ", start + 1)
    end = text.find("\n## ", start + 1) if end < 0 else min(end, text.find("\n## ", start + 1))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.DOTALL)


def _run(code: str, namespace: dict[str, Any]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the examples under test
    return out.getvalue()


def test_quick_start_prints_the_documented_shapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.save("data.npy", rng.integers(0, 255, (700, 28, 28), dtype=np.uint8))
    np.save("label.npy", rng.integers(0, 10, 700).astype(np.int64))
    (code,) = _blocks("Quick Start")
    ns: dict[str, Any] = {}
    assert _run(code, ns) == "(256, 28, 28)\n(256,)\n"
    assert ns["loader"].closed


def _multi_stream_prelude(n: int = 300) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    return {
        "np": np,
        "joint": rng.standard_normal((n, 3, 25, 2)).astype(np.float32),
        "label": rng.integers(0, 60, n).astype(np.int64),
        "seqs": [np.arange(i % 7 + 1, dtype=np.int32) for i in range(n)],
    }


def test_multi_stream_example_gives_index_aligned_dense_and_ragged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = _blocks("DataLoader and multi-stream stores")
    assert len(blocks) == 3  # multi-stream, collate, numba
    ns = _multi_stream_prelude()
    _run(blocks[0], ns)
    batch = ns["batch"]
    assert batch["joint"].shape == (256, 3, 25, 2) and batch["joint"].dtype == np.float32
    assert batch["label"].shape == (256,)
    assert isinstance(batch["token"], list) and len(batch["token"]) == 256
    # Index-aligned: find each joint row's record and check label and token.
    for k in range(0, 256, 17):
        i = int(np.flatnonzero((ns["joint"] == batch["joint"][k]).all(axis=(1, 2, 3)))[0])
        assert batch["label"][k] == ns["label"][i]
        np.testing.assert_array_equal(batch["token"][k], ns["seqs"][i])


def test_collate_example_returns_the_transform_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loaderx.zrecord import Dense

    monkeypatch.chdir(tmp_path)
    tokens = np.arange(50 * 16, dtype=np.int32).reshape(50, 16)
    labels = np.arange(50, dtype=np.int64)
    for name, arr in (("tok", tokens), ("lab", labels)):
        with Dense.create(name, arr.dtype, arr.shape[1:], codec="raw") as ds:
            ds.append(arr)
    ns: dict[str, Any] = {"DataLoader": __import__("loaderx.dataloader").dataloader.DataLoader}
    ns["dense_tokens"], ns["labelset"] = Dense.open("tok"), Dense.open("lab")
    _run(_blocks("DataLoader and multi-stream stores")[1], ns)
    batch = ns["batch"]
    assert set(batch) == {"input_ids", "label"}
    assert batch["input_ids"].shape == (32, 16) and batch["label"].shape == (32,)
    np.testing.assert_array_equal(batch["input_ids"][:, 0] // 16, batch["label"])
    ns["dense_tokens"].close()
    ns["labelset"].close()


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")
def test_numba_transform_example_runs() -> None:
    ns: dict[str, Any] = {}
    _run(_blocks("DataLoader and multi-stream stores")[2], ns)
    out = ns["transform"]({"image": np.full((2, 3, 224, 224), 255, np.uint8)})["image"]
    assert out.dtype == np.float32 and float(out.max()) == 1.0


def test_torch_device_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from loaderx.zrecord import Dense

    monkeypatch.chdir(tmp_path)
    blocks = _blocks("CPU → GPU transfer")
    assert len(blocks) == 3  # torch transfer, pinned variant, jax
    ns = _multi_stream_prelude()
    root = "xsub/train"
    for name in ("joint", "label"):
        with Dense.create(f"{root}/{name}", ns[name].dtype, ns[name].shape[1:], codec="zstd") as s:
            s.append(ns[name])

    class Done(Exception):
        pass

    seen: list[Any] = []

    def model(batch: Any) -> None:
        seen.append(batch)
        if len(seen) == 3:
            raise Done

    ns.update(root=root, model=model, Dense=Dense)
    ns["DataLoader"] = __import__("loaderx.dataloader").dataloader.DataLoader
    code = blocks[0]
    if not torch.cuda.is_available():
        code = code.replace('device = "cuda:0"', 'device = "cpu"')
    with pytest.raises(Done):
        _run(code, ns)
    batch = seen[-1]
    assert isinstance(batch["joint"], torch.Tensor) and batch["joint"].shape == (256, 3, 25, 2)
    assert batch["label"].dtype == torch.int64
    ns["loader"].close()
    for s in ns["streams"].values():
        s.close()
    _run(blocks[1], ns)  # defines the pinned-memory variant
    assert callable(ns["to_device"])


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")
def test_jax_device_put_example_runs() -> None:
    ns: dict[str, Any] = {}
    _run(_blocks("CPU → GPU transfer")[2], ns)
    out = ns["to_device"]({"x": np.arange(4)})
    assert np.asarray(out["x"]).tolist() == [0, 1, 2, 3]
