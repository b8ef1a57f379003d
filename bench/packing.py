"""Sequence packing: packed tokens/s of the native packer against Python packers.

Compared on the same documents, with the same policy and unit size:

* ``native``: :class:`loaderx.packing.Packing` (one native call per batch);
* ``numpy``: :func:`numpy_pack`, a straightforward NumPy/Python packer of the
  same layout (vectorised concat; best-fit decreasing with a ``bisect`` loop
  per chunk) -- also the reference the tests compare the native packer with;
* ``grain``: Grain's best-fit packer (``grain.experimental.BestFitPackIterDataset``)
  over the same documents, when ``grain`` imports (``pip install grain``).
  Grain packs a stream, not a batch: its rows are counted as they come out,
  with as many bins open as a native unit has rows; it opens rows as needed,
  so it drops nothing where the fixed-shape native units drop their tail.

Documents: the ragged GPT-2 token store of bench/ (``bench/data/tokens_ragged``,
written by ``prepare_tokens.py``) when it exists, else synthetic lengths
(log-normal, median ~400 tokens, clipped to 16..8192; the report says which).
Reported per ``seq_len`` (2048 and 8192 by default) and policy: packed tokens/s,
and the fractions of padding and dropped tokens.

Run ``python bench/packing.py --docs 20000`` for the figures; ``--tiny`` only
checks that everything runs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DATA, update_doc_section


def numpy_pack(
    docs: Sequence[np.ndarray], seq_len: int, rows: int, policy: str, pad: int = 0
) -> dict[str, Any]:
    """One unit packed in NumPy/Python: the layout of common/include/loaderx/pack.h.

    Returns ``tokens``, ``segment_ids``, ``positions`` (``(rows, seq_len)``) and
    ``tokens_dropped``.
    """
    dtype = docs[0].dtype if docs else np.dtype(np.int32)
    cap = rows * seq_len
    tokens = np.full(cap, pad, dtype=dtype)
    segs = np.zeros(cap, np.int32)
    pos = np.zeros(cap, np.int32)
    lens = np.array([len(d) for d in docs], np.int64)
    total = int(lens.sum())
    if policy == "concat":
        take = min(total, cap)
        if take:
            flat = np.concatenate(docs)[:take]
            doc_of = np.repeat(np.arange(len(docs)), lens)[:take]
            idx = np.arange(take)
            new = idx % seq_len == 0
            new[1:] |= doc_of[1:] != doc_of[:-1]
            count = np.cumsum(new)
            segs[:take] = count - count[idx // seq_len * seq_len] + 1
            start = np.maximum.accumulate(np.where(new, idx, 0))
            pos[:take] = idx - start
            tokens[:take] = flat
        return {
            "tokens": tokens.reshape(rows, seq_len),
            "segment_ids": segs.reshape(rows, seq_len),
            "positions": pos.reshape(rows, seq_len),
            "tokens_dropped": total - take,
        }
    if policy != "best_fit":
        raise ValueError(f"unknown policy {policy!r}")
    chunks = [
        (d, o, min(seq_len, len(docs[d]) - o))
        for d in range(len(docs))
        for o in range(0, len(docs[d]), seq_len)
    ]
    chunks.sort(key=lambda c: -c[2])  # stable: ties keep document order
    used: list[int] = []
    nseg: list[int] = []
    room: list[tuple[int, int]] = []  # sorted (free, row)
    dropped = 0
    for d, o, n in chunks:
        i = bisect.bisect_left(room, (n, 0))
        if i < len(room):
            row = room.pop(i)[1]
        elif len(used) < rows:
            row = len(used)
            used.append(0)
            nseg.append(0)
        else:
            dropped += n
            continue
        at = row * seq_len + used[row]
        tokens[at : at + n] = docs[d][o : o + n]
        nseg[row] += 1
        segs[at : at + n] = nseg[row]
        pos[at : at + n] = np.arange(n)
        used[row] += n
        if used[row] < seq_len:
            bisect.insort(room, (seq_len - used[row], row))
    return {
        "tokens": tokens.reshape(rows, seq_len),
        "segment_ids": segs.reshape(rows, seq_len),
        "positions": pos.reshape(rows, seq_len),
        "tokens_dropped": dropped,
    }


def load_documents(n: int, seed: int = 0) -> tuple[list[np.ndarray], str]:
    """``n`` token documents: the bench token store's records if prepared, else synthetic."""
    ragged = DATA / "tokens_ragged"
    if (ragged / "offsets.npy").exists():
        values = np.load(ragged / "values.npy", mmap_mode="r")
        offsets = np.load(ragged / "offsets.npy")
        k = min(n, len(offsets) - 1)
        return (
            [np.asarray(values[offsets[i] : offsets[i + 1]]) for i in range(k)],
            f"bench GPT-2 token store ({k} records of {len(offsets) - 1})",
        )
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(400), 1.0, n).astype(np.int64), 16, 8192)
    return (
        [rng.integers(0, 50257, int(m), dtype=np.int32) for m in lengths],
        f"synthetic: {n} documents, log-normal lengths (median 400, 16..8192)",
    )


def _units(docs: list[np.ndarray], per_unit: int) -> list[list[np.ndarray]]:
    return [docs[i : i + per_unit] for i in range(0, len(docs) - per_unit + 1, per_unit)]


def _rows_for(units: list[list[np.ndarray]], seq_len: int) -> int:
    """Rows per unit: the mean tokens of a unit / seq_len, rounded up (a fixed shape)."""
    mean = np.mean([sum(len(d) for d in u) for u in units])
    return max(1, int(np.ceil(mean / seq_len)))


def bench_native(
    units: list[list[np.ndarray]], seq_len: int, rows: int, policy: str
) -> dict[str, float]:
    from loaderx.packing import Packing

    packer = Packing(seq_len, rows, policy=policy, streams=("tokens",))
    counts = {"tokens": 0, "tokens_padded": 0, "tokens_dropped": 0}
    t0 = time.perf_counter()
    for u in units:
        c = packer({"tokens": u})["pack_counts"]
        for k in counts:
            counts[k] += c[k]
    dt = time.perf_counter() - t0
    packed = counts["tokens"] - counts["tokens_dropped"]
    cells = len(units) * rows * seq_len
    return {
        "tokens_per_s": packed / dt,
        "padded": counts["tokens_padded"] / cells,
        "dropped": counts["tokens_dropped"] / counts["tokens"],
    }


def bench_numpy(
    units: list[list[np.ndarray]], seq_len: int, rows: int, policy: str
) -> dict[str, float]:
    tokens = dropped = 0
    t0 = time.perf_counter()
    for u in units:
        dropped += numpy_pack(u, seq_len, rows, policy)["tokens_dropped"]
        tokens += sum(len(d) for d in u)
    dt = time.perf_counter() - t0
    cells = len(units) * rows * seq_len
    return {
        "tokens_per_s": (tokens - dropped) / dt,
        "padded": (cells - tokens + dropped) / cells,
        "dropped": dropped / tokens,
    }


def bench_grain(docs: list[np.ndarray], seq_len: int, bins: int) -> dict[str, float] | str:
    """Grain's best-fit packer over the same documents, or why it did not run.

    Grain refuses sequences longer than ``seq_len``, so it gets the documents
    already cut into ``seq_len`` chunks (as ``best_fit`` cuts them; not timed),
    and keeps ``bins`` rows open at once (the native unit's rows).
    """
    try:
        import grain
        from grain.experimental import BestFitPackIterDataset
    except ImportError as e:
        return f"not run: grain does not import ({e})"
    chunks = [{"tokens": d[o : o + seq_len]} for d in docs for o in range(0, len(d), seq_len)]
    ds = grain.MapDataset.source(chunks).to_iter_dataset()
    packed = BestFitPackIterDataset(
        ds, length_struct={"tokens": seq_len}, num_packing_bins=bins, shuffle_bins=False
    )
    cells = tokens = 0
    t0 = time.perf_counter()
    for row in packed:
        seg = row["tokens_segment_ids"]
        cells += seg.size
        tokens += int(np.count_nonzero(seg))
    dt = time.perf_counter() - t0
    total = sum(len(d) for d in docs)
    return {
        "tokens_per_s": tokens / dt,
        "padded": (cells - tokens) / max(cells, 1),
        "dropped": (total - tokens) / total,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20000, help="documents packed per configuration")
    ap.add_argument("--unit", type=int, nargs="+", default=[256, 1024], help="documents per pack unit")
    ap.add_argument("--seq-len", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--tiny", action="store_true", help="a few units only: checks that it runs")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    args = ap.parse_args(argv)
    n = 2 * max(args.unit) if args.tiny else args.docs
    docs, what = load_documents(n)
    print(f"documents: {what}")
    results: list[dict[str, Any]] = []
    for unit in args.unit:
        units = _units(docs, unit)
        for seq_len in args.seq_len:
            rows = _rows_for(units, seq_len)
            for policy in ("concat", "best_fit"):
                for name, fn in (("native", bench_native), ("numpy", bench_numpy)):
                    fn(units[:1], seq_len, rows, policy)  # warm-up (imports, first allocations)
                    r = fn(units, seq_len, rows, policy)
                    results.append({"unit": unit, "seq_len": seq_len, "rows": rows, "policy": policy,
                                    "packer": name, **r})
            g = bench_grain([d for u in units for d in u], seq_len, rows)
            results.append({"unit": unit, "seq_len": seq_len, "rows": rows, "policy": "best_fit (grain)",
                            "packer": "grain", **(g if isinstance(g, dict) else {"note": g})})
    print(
        f"{'unit':>5} {'seq_len':>7} {'rows':>4} {'policy':<17} {'packer':<7} {'tokens/s':>12} "
        f"{'padded':>7} {'dropped':>7}"
    )
    for r in results:
        head = f"{r['unit']:>5} {r['seq_len']:>7} {r['rows']:>4} {r['policy']:<17} {r['packer']:<7}"
        if "note" in r:
            print(f"{head} {r['note']}")
            continue
        print(f"{head} {r['tokens_per_s']:>12.4g} {r['padded']:>7.2%} {r['dropped']:>7.2%}")
    if args.json:
        args.json.write_text(json.dumps({"documents": what, "results": results}, indent=1))
    if not args.no_doc and not args.tiny:
        update_doc_section("packing", doc_section(results, what))
    return 0


def doc_section(results: list[dict[str, Any]], what: str) -> str:
    """The docs/benchmarks.md section: per unit, seq_len and policy, native against the Python packers."""
    from benchlib import machine_line, markdown_table

    rows = []
    for unit, seq_len in sorted({(r["unit"], r["seq_len"]) for r in results}):
        mine = [r for r in results if r["seq_len"] == seq_len and r["unit"] == unit]
        grain = next((r for r in mine if r["packer"] == "grain"), None)
        for policy in ("concat", "best_fit"):
            nat = next(r for r in mine if r["packer"] == "native" and r["policy"] == policy)
            npy = next(r for r in mine if r["packer"] == "numpy" and r["policy"] == policy)
            g = grain if policy == "best_fit" and grain is not None and "note" not in grain else None
            rows.append([
                unit, seq_len, nat["rows"], policy, f"{nat['tokens_per_s']:.3g}",
                f"{npy['tokens_per_s']:.3g} ({nat['tokens_per_s'] / npy['tokens_per_s']:.1f}x)",
                f"{g['tokens_per_s']:.3g} ({nat['tokens_per_s'] / g['tokens_per_s']:.0f}x)" if g else "-",
                f"{nat['padded']:.2%}" + (f" (Grain {g['padded']:.2%})" if g else ""),
                f"{nat['dropped']:.2%}" + (f" (Grain {g['dropped']:.2%})" if g else ""),
            ])
    note = next((r["note"] for r in results if "note" in r), "")
    table = markdown_table(["unit (documents)", "seq_len", "rows", "policy", "native tokens/s", "NumPy packer (native / it)",
                            "Grain best-fit (native / it)", "padded", "dropped"], rows)
    return (f"### Sequence packing (bench/packing.py)\n\nRun: {machine_line()}.\nDocuments: {what}; "
            "packed in units of a fixed number of documents (the `docs` of `Packing`), each unit into a "
            "fixed (rows, seq_len) block, rows = the mean tokens of a unit over seq_len, rounded up. "
            "Tokens/s count the real (non-padding) tokens of the packed rows; padded is the share of "
            "row cells that are padding, dropped the share of the documents' tokens that did not fit "
            "a unit's rows. Grain packs a stream (it opens rows as needed), so it drops nothing; "
            "the native packer's fixed block per unit is what makes a packed step a pure function of "
            "(seed, step) on any world size; the larger the unit, the smaller the spread of its token "
            "count, and the less it pads and drops.\n\n" + table + "\n"
            + (f"\nGrain: {note}\n" if note else ""))


if __name__ == "__main__":
    sys.exit(main())
