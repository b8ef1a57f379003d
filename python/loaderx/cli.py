"""The ``loaderx`` command line: inspect and check Zrecord stores.

    loaderx info PATH [--json]   schema, count, codec, sizes and compression ratio
    loaderx verify PATH          check every checksum; exit 1 naming the first bad record

Exit status: 0 success, 1 corrupt or unreadable store, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from . import _loaderx
from .errors import LoaderxError

__all__ = ["main"]


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit} ({n} B)"
        size /= 1024
    raise AssertionError("unreachable")


def _info(store: Any) -> dict[str, Any]:
    import numpy as np

    dense = store.kind == "dense"
    info: dict[str, Any] = {
        "path": store.label,
        "kind": store.kind,
        "dtype": store.dtype,
        "dtype_name": np.dtype(store.dtype).name,
    }
    if dense:
        info["item_shape"] = list(store.item_shape)
    else:
        info["ndim"] = store.ndim
    info.update({
        "count": len(store),
        "codec": store.codec,
        "data_shards": store.data_shards,
        "logical_bytes": store.nbytes,
        "stored_bytes": store.stored_bytes,
        "ratio": round(store.nbytes / store.stored_bytes, 3) if store.stored_bytes else None,
    })
    return info


def _cmd_info(args: argparse.Namespace) -> int:
    info = _info(_loaderx.Store.open(args.path))
    if args.json:
        print(json.dumps(info))
        return 0
    shape = (f"item_shape   {tuple(info['item_shape'])}" if "item_shape" in info
             else f"ndim         {info['ndim']} (ragged: every axis may vary)")
    ratio = f"{info['ratio']:.2f}x" if info["ratio"] is not None else "n/a"
    print(f"path         {info['path']}\n"
          f"kind         {info['kind']}\n"
          f"dtype        {info['dtype']} ({info['dtype_name']})\n"
          f"{shape}\n"
          f"records      {info['count']}\n"
          f"codec        {info['codec']}\n"
          f"data_shards  {info['data_shards']}\n"
          f"logical      {_human(info['logical_bytes'])}\n"
          f"stored       {_human(info['stored_bytes'])}\n"
          f"ratio        {ratio} (logical / stored)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    store = _loaderx.Store.open(args.path)
    n = len(store)
    bar = None
    if not args.quiet:
        try:
            from tqdm import tqdm

            bar = tqdm(total=n, unit="rec", desc="verify", file=sys.stderr, leave=False)
        except ImportError:  # tqdm is a dependency, but verify must work without it
            bar = None

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.update(done - bar.n)

    try:
        store.verify(progress)
    finally:
        if bar is not None:
            bar.close()
    print(f"{args.path}: OK ({n} records, every checksum verified)")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loaderx", description="Inspect and check Zrecord stores.")
    sub = p.add_subparsers(dest="command", required=True)
    pi = sub.add_parser("info", help="print a store's schema, size and compression ratio")
    pi.add_argument("path")
    pi.add_argument("--json", action="store_true", help="one JSON object instead of text")
    pi.set_defaults(func=_cmd_info)
    pv = sub.add_parser("verify", help="check every checksum of a store")
    pv.add_argument("path")
    pv.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    pv.set_defaults(func=_cmd_verify)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loaderx`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LoaderxError as e:
        print(f"loaderx {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"loaderx {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
