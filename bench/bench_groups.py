"""loaderxd groups: N consumers of one dataset, N solo loaders vs one broadcast group.

Real data: the zstd photo-crop store of bench_loader.py (3×224×224 uint8,
``bench/data/loader/loaderx/zstd/image``). ``--members`` consumers each draw
``--steps`` batches of ``--batch`` images (IID, same seed), each in its own
thread, either as separate solo daemon loaders (every batch gathered and
decoded once per consumer) or as members of one broadcast group (gathered
once, mapped by all). Before timing, every member's batch is checked against
the embedded loader's. Reported: wall time, loaderxd CPU seconds
(utime + stime from /proc), batches the daemon gathered and the ring memory it
held. One run; the table goes into docs/daemon.md (section "groups", under
Groups: it is the measurement behind that section's claim).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_daemon import Daemon, loaderxd_binary
from benchlib import DATA, REPO, machine_line, markdown_table, update_doc_section

STORE = DATA / "loader" / "loaderx" / "zstd" / "image"


def daemon_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(daemon: Daemon, members: int, steps: int, batch: int, group: bool) -> dict[str, float]:
    from loaderx import _loaderx
    from loaderx.client import DaemonOptions
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    store = Dense.open(str(STORE))
    opts = DaemonOptions(daemon.sock, group="bench" if group else None, group_mode="broadcast")
    loaders = [DataLoader({"image": store}, batch_size=batch, seed=7, daemon=opts)
               for _ in range(members)]
    # Exactness first: every consumer's first batch is the embedded one.
    with DataLoader({"image": store}, batch_size=batch, seed=7) as local:
        want = next(local)["image"]
    for loader in loaders:
        np.testing.assert_array_equal(next(loader)["image"], want)
    before = _loaderx.daemon_stats(daemon.sock)
    cpu0 = daemon_cpu_seconds(daemon.proc.pid)
    errors: list[BaseException] = []

    def consume(loader: DataLoader) -> None:
        try:
            for _ in range(steps):
                next(loader)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=consume, args=(ld,)) for ld in loaders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = daemon_cpu_seconds(daemon.proc.pid) - cpu0
    after = _loaderx.daemon_stats(daemon.sock)
    for loader in loaders:
        loader.close()
    store.close()
    if errors:
        raise errors[0]
    return {"wall": wall, "cpu": cpu,
            "gathered": after["batches_gathered"] - before["batches_gathered"],
            "ring_mib": after["ring_bytes"] / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loaderxd")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    if not STORE.exists():
        raise SystemExit(f"{STORE} missing: run bench/prepare_vision.py and bench_loader.py first")
    exe = loaderxd_binary(args.loaderxd)
    rows = []
    results = {}
    for label, group in (("solo loaders", False), ("one broadcast group", True)):
        daemon = Daemon(exe, args.threads)
        try:
            r = run(daemon, args.members, args.steps, args.batch, group)
        finally:
            daemon.close()
        results[label] = r
        rows.append([f"{args.members} × {label}", f"{r['wall']:.2f}", f"{r['cpu']:.2f}",
                     f"{int(r['gathered'])}", f"{r['ring_mib']:.0f}"])
        print(label, r, flush=True)
    solo, grp = results["solo loaders"], results["one broadcast group"]
    table = markdown_table(["consumers", "wall s", "loaderxd CPU s", "batches gathered",
                            "ring MiB"], rows)
    body = (
        "### Measured: one gather for N consumers\n\n"
        f"{machine_line()}\n\n"
        f"`bench/bench_groups.py`: {args.members} consumers (threads of one process) each draw "
        f"{args.steps} IID batches of {args.batch} zstd photo crops (3×224×224 uint8, "
        f"{args.batch * 3 * 224 * 224 / 2**20:.1f} MiB), checked against the embedded loader "
        f"first; loaderxd --threads {args.threads}. One run (load average "
        f"{os.getloadavg()[0]:.1f} at the end: the box is shared, so wall times are noisy; "
        "CPU seconds are the daemon's own).\n\n"
        f"{table}\n\n"
        f"The group gathered {solo['gathered'] / max(grp['gathered'], 1):.1f}× fewer batches and "
        f"loaderxd spent {solo['cpu'] / max(grp['cpu'], 1e-9):.1f}× less CPU; its ring is "
        f"{solo['ring_mib'] / max(grp['ring_mib'], 1e-9):.1f}× smaller than the solo rings "
        "together (a group ring has max_skew more slots than one solo ring).\n"
    )
    print(body)
    if not args.no_doc:
        update_doc_section("groups", body, REPO / "docs" / "daemon.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
