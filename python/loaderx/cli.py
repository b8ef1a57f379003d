"""The ``loaderx`` command line (also ``python -m loaderx``).

    loaderx info PATH [--json]          a store's schema, count, codec, sizes, ratio and
                                        metadata
    loaderx verify PATH [-q]            check every checksum; names the first bad record
    loaderx convert SOURCE OUTPUT       Hugging Face dataset (save_to_disk directory,
                                        directory of data files, Hub owner/name or
                                        --hub NAME) -> stores
    loaderx train-dict STORE OUTPUT     train a zstd dictionary from a store's records
    loaderx bench PATH                  quick random-gather benchmark beside NumPy
    loaderx status [--socket P] [--json] [--watch [SECONDS]]
                                        what loaderxd is doing: the daemon, its groups
                                        (members, ranks, cursors, what a group waits
                                        for), solo loaders, per-uid usage
    loaderx --version

``info``, ``verify`` and ``bench`` take a store or a directory holding stores (a
converter output: OUTPUT/<split>/<column>); for a directory they list, check or
time every store below it, named by its path relative to the directory.
``-q`` prints nothing on success (the exit status says it); errors still do.

Exit status (documented in docs/guide.md, "Command line"):
    0    success
    1    the operation failed: corrupt, missing or unreadable store, conversion
         refused (the one-line message says why)
    2    usage error (unknown command or option, bad option value)
    130  interrupted (Ctrl-C)
    141  stdout was closed early (``loaderx info ... | head -1``); nothing is printed

Errors are one line on stderr, ``loaderx CMD: ErrorClass: message``; ``--debug``
shows the traceback instead. Progress bars go to stderr, only when it is a
terminal (never into a pipe or a log file).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ._version import DISTRIBUTION, __version__

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit} ({n} B)"
        size /= 1024
    raise AssertionError("unreachable")


def _bar(total: int, desc: str, quiet: bool = False) -> Any:
    """A tqdm bar on stderr when it is a terminal, else None."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, unit="rec", desc=desc, file=sys.stderr, leave=False)


def _open(path: str) -> Any:
    from . import _loaderx

    return _loaderx.Store.open(path)


def _info(store: Any) -> dict[str, Any]:
    import numpy as np

    info: dict[str, Any] = {
        "path": store.label,
        "kind": store.kind,
        "dtype": store.dtype,
        "dtype_name": np.dtype(store.dtype).name,
    }
    if store.kind == "dense":
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
    metadata = getattr(store, "metadata", None)
    if metadata is not None:
        info["metadata"] = metadata
    return info


def _stores_under(root: Path) -> Iterator[Path]:
    """Store directories below `root` (a directory holding a ``meta`` file), sorted."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if "meta" in filenames:
            dirnames[:] = []
            yield Path(dirpath)


def _store_dirs(path: str) -> list[Path] | None:
    """The stores `path` names for info, verify and bench: None when it is one store (or
    not a directory: opening it says why), else every store below it (a converter
    output), sorted. A directory with neither raises StoreNotFoundError."""
    from .errors import StoreNotFoundError

    root = Path(path)
    if not root.is_dir() or (root / "meta").exists():
        return None
    stores = list(_stores_under(root))
    if stores:
        return stores
    if any(p.name == "index" or p.name.startswith("data-") for p in root.iterdir()):
        return None  # a store's files without its metadata: opening it says it is damaged
    raise StoreNotFoundError(f"{path}: no Zrecord store here or below (a store is a directory "
                             "with a 'meta' file)")


def _cmd_info(args: argparse.Namespace) -> int:
    stores = _store_dirs(args.path)
    if stores is not None:
        return _info_many(Path(args.path), stores, args.json)
    info = _info(_open(args.path))
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    shape = (f"item_shape   {tuple(info['item_shape'])}" if "item_shape" in info
             else f"ndim         {info['ndim']} (ragged: every axis may vary)")
    ratio = f"{info['ratio']:.2f}x" if info["ratio"] is not None else "n/a"
    lines = [f"path         {info['path']}",
             f"kind         {info['kind']}",
             f"dtype        {info['dtype']} ({info['dtype_name']})",
             shape,
             f"records      {info['count']}",
             f"codec        {info['codec']}",
             f"data_shards  {info['data_shards']}",
             f"logical      {_human(info['logical_bytes'])}",
             f"stored       {_human(info['stored_bytes'])}",
             f"ratio        {ratio} (logical / stored)"]
    if "metadata" in info:
        lines.append(f"metadata     {json.dumps(info['metadata'], sort_keys=True)}")
    print("\n".join(lines))
    return EXIT_OK


def _info_many(root: Path, stores: list[Path], as_json: bool) -> int:
    infos = []
    for p in stores:
        info = _info(_open(str(p)))
        info["path"] = str(p.relative_to(root))
        infos.append(info)
    if as_json:
        print(json.dumps({"root": str(root), "stores": infos}))
        return EXIT_OK
    width = max(len(i["path"]) for i in infos)
    for i in infos:
        shape = (f"item_shape={tuple(i['item_shape'])}" if "item_shape" in i
                 else f"ndim={i['ndim']}")
        print(f"{i['path']:<{width}}  {i['kind']:<6}  {i['dtype_name']:<8}  {shape:<22}  "
              f"{i['count']:>10} records  {i['codec']:<9}  {_human(i['stored_bytes'])}")
    return EXIT_OK


def _verify(path: str, quiet: bool, desc: str = "verify") -> int:
    """Checks every checksum of the store at `path`; returns its record count."""
    store = _open(path)
    n = len(store)
    bar = _bar(n, desc, quiet)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.update(done - bar.n)

    try:
        store.verify(progress)
    finally:
        if bar is not None:
            bar.close()
    return int(n)


def _cmd_verify(args: argparse.Namespace) -> int:
    stores = _store_dirs(args.path)
    if stores is None:
        n = _verify(args.path, args.quiet)
        if not args.quiet:
            print(f"{args.path}: OK ({n} records, every checksum verified)")
        return EXIT_OK
    # A converter output: every store is checked, a bad one does not stop the others.
    root = Path(args.path)
    total = failed = 0
    for p in stores:
        try:
            n = _verify(str(p), args.quiet, str(p.relative_to(root)))
        except Exception as e:
            if args.debug:
                raise
            failed += 1
            print(_error_line(args.command, e), file=sys.stderr, flush=True)
            continue
        total += n
        if not args.quiet:
            print(f"{p.relative_to(root)}: OK ({n} records, every checksum verified)", flush=True)
    if failed:
        print(f"loaderx {args.command}: {args.path}: {failed} of {len(stores)} stores failed "
              "verification", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        print(f"{args.path}: OK ({len(stores)} stores, {total} records, every checksum verified)")
    return EXIT_OK


# A Hub dataset id given without --hub: owner/name, each part as the Hub spells names.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def _hub_source(source: str) -> bool:
    """Whether SOURCE, which is not a local path, names a Hub dataset: a well-formed
    ``owner/name`` whose ``owner`` is not a local directory (then it is a mistyped
    local path). A bare name (``mnist``) goes to the Hub only with --hub."""
    if _HUB_ID.fullmatch(source) is None or Path(source.split("/")[0]).is_dir():
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        return False
    return True


def _dataset(args: argparse.Namespace) -> Any:
    """The DatasetDict SOURCE names: a local directory, else a Hub dataset (see _hub_source)."""
    from .converter import _from_hub, _need_datasets, huggingface

    datasets = _need_datasets()  # ImportError naming the extra to install, before anything
    if args.hub:  # the Hub, even if a local path is spelled the same
        return _from_hub(datasets, args.source, args.config, args.revision, None, args.endpoint)
    if not os.path.lexists(args.source) and not _hub_source(args.source):
        raise FileNotFoundError(f"{args.source}: no such directory (a Hub dataset is given as "
                                "owner/name, or with --hub)")
    return huggingface(args.source, config=args.config, revision=args.revision,
                       endpoint=args.endpoint)


def _cmd_convert(args: argparse.Namespace) -> int:
    from .converter import convert

    dict_bytes = args.dict.read_bytes() if args.dict is not None else None
    dataset = _dataset(args)
    out = convert(dataset, args.output, codec=args.codec, image_layout=args.image_layout,
                  image_mode=args.image_mode, data_shards=args.data_shards,
                  dict_bytes=dict_bytes, progress=False if args.quiet else None,
                  narrow=not args.no_narrow)
    if not args.quiet:
        n = sum(len(ds) for ds in dataset.values())
        print(f"{out}: {len(dataset)} split(s), {n} records")
    return EXIT_OK


def _cmd_train_dict(args: argparse.Namespace) -> int:
    from .utils import train_dict
    from .zrecord import Dense, Ragged

    stores = _store_dirs(args.store)
    if stores is not None:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"{args.store}: a directory of {len(stores)} stores (a converter "
                                   f"output), not one store; pass one of them, e.g. {stores[0]}")
    native = _open(args.store)
    cls = Dense if native.kind == "dense" else Ragged
    with cls.open(args.store) as store:
        d = train_dict(store, size=args.size, narrow=not args.no_narrow)
    out = Path(args.output)
    if out.exists():
        from .errors import StoreExistsError

        raise StoreExistsError(f"{out}: already exists")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_bytes(d)
    os.replace(tmp, out)
    print(f"{out}: {len(d)} bytes (use with codec='zstd_dict', dict_bytes=open(...).read(), or "
          f"`loaderx convert SOURCE OUTPUT --codec zstd_dict --dict {out}`)")
    return EXIT_OK


def _time_loop(fn: Callable[[Any], Any], plans: list[Any], min_seconds: float) -> tuple[float, float,
                                                                                         int]:
    """(wall seconds, CPU seconds, batches) of repeating fn over plans for at least min_seconds."""
    fn(plans[0])  # warm-up
    count = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        for p in plans:
            fn(p)
            count += 1
        wall = time.perf_counter() - wall0
        if wall >= min_seconds:
            return wall, time.process_time() - cpu0, count


def _bench(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Times random gathers of the store at `path`, loaderx beside NumPy (the --json object)."""
    import numpy as np

    from .errors import InvalidArgumentError
    from .zrecord import Dense, Ragged

    native = _open(path)
    dense = native.kind == "dense"
    n = len(native)
    if n == 0:
        raise InvalidArgumentError(f"{path}: the store is empty")
    store = (Dense if dense else Ragged).open(path)
    try:
        # The NumPy side holds a prefix of the store in memory (at most --numpy-mib);
        # both sides gather the same random batches from that prefix.
        per = max(1, native.nbytes // n)
        m = int(min(n, max(1, (args.numpy_mib << 20) // per)))
        rng = np.random.default_rng(args.seed)
        plans = [rng.integers(0, m, args.batch, dtype=np.int64) for _ in range(args.plans)]
        ref = store[:m]
        if dense:
            def numpy_gather(idx: Any) -> Any:
                return ref[idx]
        else:
            def numpy_gather(idx: Any) -> Any:
                return [ref[i] for i in idx]
        got: Any = store[plans[0]]
        want = numpy_gather(plans[0])
        same = (np.array_equal(got, want) if dense else
                all(np.array_equal(a, b) for a, b in zip(got, want)))
        if not same:  # pragma: no cover - would be a gather bug
            raise RuntimeError("the store and NumPy returned different records")
        batch_bytes = got.nbytes if dense else sum(a.nbytes for a in got)
        rows = []
        for name, fn in (("loaderx", lambda idx: store[idx]), ("numpy", numpy_gather)):
            wall, cpu, count = _time_loop(fn, plans, args.seconds)
            rows.append({"backend": name, "batches": count,
                         "batches_per_s": count / wall,
                         "records_per_s": count * args.batch / wall,
                         "mib_per_s": batch_bytes * count / wall / (1 << 20),
                         "cpu_per_batch_ms": cpu / count * 1e3})
    finally:
        store.close()
    return {"store": path, "batch": args.batch, "records_in_numpy": m, "records": n,
            "kind": native.kind, "dtype": native.dtype, "codec": native.codec, "results": rows}


def _bench_text(r: dict[str, Any]) -> None:
    print(f"{r['store']}: {r['kind']} {r['dtype']} codec={r['codec']}, random batches of "
          f"{r['batch']} from the first {r['records_in_numpy']} of {r['records']} records "
          "(NumPy holds them in memory)")
    rows = r["results"]
    for row in rows:
        print(f"  {row['backend']:<8} {row['batches_per_s']:10.1f} batches/s "
              f"{row['records_per_s'] / 1e3:10.1f} krec/s {row['mib_per_s']:9.1f} MiB/s "
              f"{row['cpu_per_batch_ms']:8.3f} ms CPU/batch")
    print(f"  ratio    {rows[0]['batches_per_s'] / rows[1]['batches_per_s']:.2f}x "
          "(loaderx / numpy, one run: a quick look, not a published benchmark)")


def _cmd_bench(args: argparse.Namespace) -> int:
    stores = _store_dirs(args.store)
    if stores is None:
        r = _bench(args.store, args)
        if args.json:
            print(json.dumps(r))
        else:
            _bench_text(r)
        return EXIT_OK
    # A converter output: every store in turn, each named relative to the root.
    root = Path(args.store)
    results = []
    for p in stores:
        r = _bench(str(p), args)
        r["store"] = str(p.relative_to(root))
        results.append(r)
        if not args.json:
            _bench_text(r)
            sys.stdout.flush()
    if args.json:
        print(json.dumps({"root": args.store, "stores": results}))
    return EXIT_OK


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= v <= 3600:
        raise argparse.ArgumentTypeError(f"must be in 0.1..3600 seconds, got {text}")
    return v


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _held(g: dict[str, Any]) -> str:
    held = "nothing held" if g["oldest_held"] is None else f"holds steps {g['oldest_held']}..{g['newest_held']}"
    return (f"{held}, next gather {g['next_gather']}, ring {_size(g['ring_bytes'])} ({g['slots']} slots), "
            f"{g['batches_gathered']} gathered, {g['batches_served']} served")


def _status_text(s: dict[str, Any]) -> str:
    """The human form of ``Client.stats()`` (docs/daemon.md, "Status")."""
    lines = []
    d = s.get("daemon")
    if d is None:  # a daemon older than protocol 1.2: counters only
        lines.append("loaderxd (protocol < 1.2: counters only)")
    else:
        lim = d["limits"]
        lines.append(f"loaderxd pid {d['pid']}, version {d['version']}, protocol {d['protocol']}, "
                     f"up {_duration(d['uptime_s'])}, socket {d['socket']}")
        lines.append(f"limits: ring memory {_size(lim['memory_limit'])} ({_size(lim['memory_per_uid'])} per uid), "
                     f"{lim['sessions_per_uid']} sessions per uid, {lim['max_leases']} leases, "
                     f"prefetch {lim['max_prefetch']}, max-skew {lim['max_skew']}, "
                     f"group prefetch {lim.get('group_prefetch', '-')}, "
                     f"group timeout {lim['group_timeout_s']:g} s")
    lines.append(f"totals: {s['sessions']} sessions, {s['loaders']} loaders, {s['groups']} groups "
                 f"({s['group_members']} members), ring {_size(s['ring_bytes'])}, "
                 f"{s['batches_gathered']} batches gathered, {s['batches_served']} served, "
                 f"{s['refused']} refused")
    if d is not None and not d["sees_all_uids"]:
        lines.append(f"(groups, loaders and usage of uid {d['viewer_uid']} only; root sees every uid's)")
    for g in s.get("named_groups", []):
        shape = f"batch {g['batch_size']}" + (f" x world {g['world_size']}" if g["mode"] == "shard" else "")
        lines.append(f"group {g['name']!r} ({g['mode']}, uid {g['uid']}, {shape}): {_held(g)}")
        if g["mode"] == "shard":
            first, replicas = g.get("ranks_first", 0), g.get("replicas", 1)
            by_position = {(m["rank"], m.get("replica", 0)): m for m in g["members"]}
            for position, cursor in enumerate(g["rank_cursors"]):
                rank, replica = first + position // replicas, position % replicas
                m = by_position.get((rank, replica))
                who = (f"pid {m['pid']} uid {m['uid']} session {m['session']}, served {m['batches_served']}"
                       if m else "no member")
                name = f"rank {rank}" + (f" replica {replica}" if replicas > 1 else "")
                lines.append(f"  {name}: step {cursor}, {who}")
        else:
            for m in g["members"]:
                lines.append(f"  session {m['session']}: step {m['cursor']}, pid {m['pid']} uid {m['uid']}, "
                             f"served {m['batches_served']}")
        w = g["waiting"]
        if w is not None:
            who = ", ".join(f"rank {r}" for r in w["ranks"]) if "ranks" in w else \
                ", ".join(f"session {x}" for x in w["sessions"])
            lines.append(f"  waits for {who} at step {w['step']} since {_duration(w['since_s'])}")
    for lo in s.get("solo_loaders", []):
        lines.append(f"loader session {lo['session']} (pid {lo['pid']}, uid {lo['uid']}, batch {lo['batch_size']}): "
                     f"step {lo['cursor']}, {_held(lo)}")
    for u in s.get("uids", []):
        lines.append(f"uid {u['uid']}: {u['sessions']} sessions, ring {_size(u['ring_bytes'])}")
    return "\n".join(lines)


def _cmd_status(args: argparse.Namespace) -> int:
    from .client import connect

    if args.watch is None:
        _show_status(connect(args.socket).stats(), args.json, watch=False)
        return EXIT_OK
    try:  # Ctrl-C anywhere in the loop is the way a watch ends
        while True:
            _show_status(connect(args.socket).stats(), args.json, watch=True)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK


def _show_status(s: dict[str, Any], as_json: bool, watch: bool) -> None:
    if as_json:
        print(json.dumps(s, sort_keys=True, indent=None if watch else 2))
        return
    if watch and sys.stdout.isatty():
        print("\x1b[H\x1b[2J", end="")
    print(_status_text(s))


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _codecs() -> tuple[str, ...]:
    """The codecs of the store API (loaderx.zrecord.Codec), without importing NumPy."""
    from ._codecs import CODECS

    return CODECS


def _parser() -> argparse.ArgumentParser:
    # One flat table of every subcommand and option (81 lines): read top to
    # bottom it is the CLI's reference; split up, it would be scattered.
    p = argparse.ArgumentParser(prog="loaderx",
                                description="Inspect, check, build and time Zrecord stores.",
                                epilog="exit status: 0 ok, 1 failed, 2 usage, 130 interrupted, "
                                       "141 stdout closed")
    p.add_argument("--version", action="version", version=f"{DISTRIBUTION} {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # --debug is also accepted after the command (`loaderx info PATH --debug`);
    # SUPPRESS keeps a subcommand from resetting the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")

    pi = sub.add_parser("info", parents=[common], help="a store's schema, size, ratio and metadata")
    pi.add_argument("path", help="a store, or a directory of stores (a converter output)")
    pi.add_argument("--json", action="store_true", help="one JSON object instead of text")
    pi.set_defaults(func=_cmd_info)

    pv = sub.add_parser("verify", parents=[common], help="check every checksum of a store")
    pv.add_argument("path", help="a store, or a directory of stores (each one is checked)")
    pv.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bar and nothing printed on success")
    pv.set_defaults(func=_cmd_verify)

    pc = sub.add_parser("convert", parents=[common], help="a Hugging Face dataset -> aligned stores",
                        description="SOURCE is a save_to_disk directory, a directory of data "
                                    "files, or a Hub dataset: owner/name (when owner is not a "
                                    "local directory), or any Hub name with --hub. A SOURCE "
                                    "that is none of these is refused as a missing directory. "
                                    "OUTPUT/<split>/<column> stores are published "
                                    "atomically. A Hub token comes from HF_TOKEN or "
                                    "`hf auth login` (never a command-line argument).")
    pc.add_argument("source")
    pc.add_argument("output")
    pc.add_argument("--hub", action="store_true",
                    help="SOURCE is a Hub dataset id, even a bare name or one spelled like a "
                         "local path")
    pc.add_argument("--codec", choices=_codecs(), default="zstd",
                    help="zstd_dict needs --dict (default zstd)")
    pc.add_argument("--dict", type=Path, metavar="FILE",
                    help="the zstd dictionary for --codec zstd_dict (loaderx train-dict writes one)")
    pc.add_argument("--config", help="configuration (subset) name")
    pc.add_argument("--revision", default="main", help="Hub branch, tag or commit")
    pc.add_argument("--endpoint", help="Hub base URL (mirror or private Hub)")
    pc.add_argument("--image-layout", choices=("HWC", "CHW"), default="HWC")
    pc.add_argument("--image-mode", help="PIL mode every image is converted to, e.g. RGB")
    pc.add_argument("--data-shards", type=_positive, default=4)
    pc.add_argument("--no-narrow", action="store_true",
                    help="store integer values at full width (format 1.1, for loaderx builds "
                         "older than format 1.2)")
    pc.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bars and nothing printed on success")
    pc.set_defaults(func=_cmd_convert)

    pt = sub.add_parser("train-dict", parents=[common], help="train a zstd dictionary from a store's records")
    pt.add_argument("store")
    pt.add_argument("output", help="file to write the dictionary to (must not exist)")
    pt.add_argument("--size", type=_positive, default=110 * 1024, help="capacity in bytes")
    pt.add_argument("--no-narrow", action="store_true",
                    help="train on full-width integer values (for stores written with --no-narrow)")
    pt.set_defaults(func=_cmd_train_dict)

    pb = sub.add_parser("bench", parents=[common], help="quick random-gather benchmark of a store beside NumPy")
    pb.add_argument("store", help="a store, or a directory of stores (each one is timed)")
    pb.add_argument("--batch", type=_positive, default=256)
    pb.add_argument("--plans", type=_positive, default=20, help="distinct random batches")
    pb.add_argument("--seconds", type=float, default=1.0, help="time per backend (default 1)")
    pb.add_argument("--numpy-mib", type=_positive, default=512,
                    help="records NumPy holds in memory, in MiB (default 512)")
    pb.add_argument("--seed", type=int, default=0)
    pb.add_argument("--json", action="store_true")
    pb.set_defaults(func=_cmd_bench)
    ps = sub.add_parser("status", parents=[common], help="what loaderxd is doing: groups, members, loaders",
                        description="Shows the daemon (pid, uptime, version, limits), every group "
                                    "with its members (pid, uid, rank, cursor), the oldest step "
                                    "it holds and what it waits for, solo loaders and per-uid "
                                    "usage. A plain user sees their own groups and loaders; "
                                    "root sees every user's (docs/daemon.md, \"Status\").")
    ps.add_argument("--socket", help="loaderxd's socket (default: the default socket path)")
    ps.add_argument("--json", action="store_true", help="the status document as JSON "
                    "(one line per refresh with --watch)")
    ps.add_argument("--watch", type=_interval, nargs="?", const=2.0, default=None, metavar="SECONDS",
                    help="refresh every SECONDS (default 2) until Ctrl-C")
    ps.set_defaults(func=_cmd_status)
    return p


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so interpreter exit flushes nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # pragma: no cover - stdout without a descriptor
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loaderx`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print(f"loaderx {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # every failure becomes one line (or --debug)
        if args.debug:
            raise
        print(_error_line(args.command, e), file=sys.stderr)
        return EXIT_FAILED


def _error_line(command: str, e: Exception) -> str:
    """``loaderx CMD: ErrorClass: message``, the one line an error prints."""
    from .errors import LoaderxError

    name = type(e).__name__
    if not isinstance(e, (LoaderxError, OSError, ValueError, TypeError, ImportError)):
        name = f"unexpected {name} (run with --debug for the traceback)"
    message = str(e).splitlines()[0] if str(e) else ""
    return f"loaderx {command}: {name}: {message}"


if __name__ == "__main__":
    sys.exit(main())
