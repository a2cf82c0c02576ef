"""``rewrite`` (repack) against pg_repack and ``VACUUM FULL`` on a bloated
``pgbench_accounts``, an application running pgbench's TPC-B transaction
the whole time (but during VACUUM FULL, the offline floor)::

    python -m bench.rewrite                      # scale 100 (10,000,000 rows), a throwaway server
    python -m bench.rewrite --scale 2            # 200,000 rows: a smoke run
    python -m bench.rewrite --db postgresql://me@127.0.0.1:5432/scratch --pg-repack PATH

For each contender, on the same fresh table: ``pgbench -i -s SCALE``, one
secondary index (``abalance``), a third of the rows updated once and
vacuumed (the bloat every contender removes). Then the application (2
sessions running pgbench's built-in TPC-B transaction, through psycopg so
the run stops exactly when the contender ends, each transaction timed)
runs a few seconds alone (its baseline TPS), then through the contender:

- ``VACUUM FULL pgbench_accounts`` (no application: it locks the table);
- ``pg_repack --no-order --table pgbench_accounts`` (1.4.8; the server
  needs the extension: Debian's ``postgresql-15-repack``);
- ``reorg submit rewrite --table pgbench_accounts`` on one in-process node
  of 2 slots, default knobs (``--max-rows-per-sec`` with ``--rate``).

Printed: wall time and its ratio to pg_repack's and to VACUUM FULL's, the
longest application transaction, TPS during the run against the baseline,
WAL bytes written during the run (the application's included: the same
for every contender but VACUUM FULL) and the table's size after.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.dataplane.server import database
from bench.dataplane.tracking import node_in_process, run_to_success
from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.submit import SubmitRequest

BASELINE_SECONDS = 3.0


class Application(threading.Thread):
    """One session running pgbench's TPC-B transaction in a loop, each timed."""

    def __init__(self, url: str, scale: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.url, self.scale, self.random = url, scale, random.Random(seed)
        self.stop_event = threading.Event()
        self.longest, self.transactions, self.errors = 0.0, 0, 0
        self.window_started = time.monotonic()

    def run(self) -> None:
        r = self.random
        with psycopg.connect(self.url, prepare_threshold=None) as conn:
            while not self.stop_event.is_set():
                aid, tid = r.randint(1, 100_000 * self.scale), r.randint(1, 10 * self.scale)
                bid, delta = r.randint(1, self.scale), r.randint(-5000, 5000)
                started = time.monotonic()
                try:
                    conn.execute("UPDATE pgbench_accounts SET abalance = abalance + %s "
                                 "WHERE aid = %s", (delta, aid))
                    conn.execute("SELECT abalance FROM pgbench_accounts WHERE aid = %s", (aid,))
                    conn.execute("UPDATE pgbench_tellers SET tbalance = tbalance + %s "
                                 "WHERE tid = %s", (delta, tid))
                    conn.execute("UPDATE pgbench_branches SET bbalance = bbalance + %s "
                                 "WHERE bid = %s", (delta, bid))
                    conn.execute("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
                                 "VALUES (%s, %s, %s, %s, CURRENT_TIMESTAMP)",
                                 (tid, bid, aid, delta))
                    conn.commit()
                except psycopg.Error:
                    conn.rollback()
                    self.errors += 1
                    continue
                self.longest = max(self.longest, time.monotonic() - started)
                self.transactions += 1

    def window(self) -> tuple[int, float, float]:
        """Transactions, seconds and the longest transaction since the last call."""
        now = time.monotonic()
        seen = (self.transactions, now - self.window_started, self.longest)
        self.transactions, self.window_started, self.longest = 0, now, 0.0
        return seen


@dataclass
class Result:
    seconds: float
    wal_bytes: int
    longest: float | None  # seconds; None: no application ran
    tps: float | None
    baseline_tps: float | None
    size_after: int


def prepare_table(url: str, scale: int) -> None:
    subprocess.run(["pgbench", "-i", "-q", "-s", str(scale), "-I", "dtgvp", url], check=True,
                   capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE INDEX pgbench_accounts_abalance ON pgbench_accounts (abalance)")
        conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 3 = 0")
        conn.execute("VACUUM ANALYZE pgbench_accounts")


def wal_lsn(url: str) -> str:
    with psycopg.connect(url) as conn:
        return str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]


def wal_since(url: str, lsn: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                                (lsn,)).fetchone()[0])  # type: ignore[index]


def size(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT pg_total_relation_size('pgbench_accounts')")
                   .fetchone()[0])  # type: ignore[index]


def vacuum_full(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM FULL pgbench_accounts")


def pg_repack(binary: str) -> Callable[[str], None]:
    def run(url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_repack")
        # pg_repack 1.4.8 takes no connection URI: its parts as options.
        at = psycopg.conninfo.conninfo_to_dict(url)
        options = [f"--{name}={at[key]}" for name, key in (
            ("host", "host"), ("port", "port"), ("username", "user"), ("dbname", "dbname"))
            if at.get(key)]
        env = {**os.environ, **({"PGPASSWORD": str(at["password"])} if at.get("password") else {})}
        done = subprocess.run([binary, "--no-order", "--table", "pgbench_accounts", *options],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"pg_repack failed: {done.stderr.strip()}")
    return run


def reorg_rewrite(rate: int | None) -> Callable[[str], None]:
    def run(url: str) -> None:
        with node_in_process(url) as db:
            run_to_success(db, SubmitRequest("rewrite", {"table": "pgbench_accounts"},
                                             max_rows_per_sec=rate))
    return run


def measure(url: str, scale: int, contender: Callable[[str], None], with_app: bool) -> Result:
    prepare_table(url, scale)
    apps = [Application(url, scale, seed) for seed in range(2)] if with_app else []
    for app in apps:
        app.start()
    time.sleep(BASELINE_SECONDS if apps else 0)
    baseline = _tps([a.window() for a in apps])
    lsn = wal_lsn(url)
    started = time.monotonic()
    contender(url)
    took = time.monotonic() - started
    wal = wal_since(url, lsn)
    during = [a.window() for a in apps]
    for app in apps:
        app.stop_event.set()
        app.join(60)
    longest = max((w[2] for w in during), default=None)
    return Result(took, wal, longest, _tps(during), baseline, size(url))


def _tps(windows: list[tuple[int, float, float]]) -> float | None:
    if not windows:
        return None
    return sum(w[0] for w in windows) / max(w[1] for w in windows)


def run(url: str, scale: int, repack_binary: str | None, rate: int | None) -> dict[str, Result]:
    migrate.upgrade(Database(Settings(url)))
    from backfill.rewrite.job import register

    register()  # whether or not the installed entry points know it yet
    contenders: list[tuple[str, Callable[[str], None], bool]] = [
        ("VACUUM FULL (offline)", vacuum_full, False)]
    if repack_binary:
        contenders.append(("pg_repack 1.4.8 --no-order", pg_repack(repack_binary), True))
    contenders.append(("reorg rewrite" + (f" --max-rows-per-sec {rate}" if rate else ""),
                       reorg_rewrite(rate), True))
    results = {}
    for name, contender, with_app in contenders:
        result = measure(url, scale, contender, with_app)
        results[name] = result
        app = (f", longest transaction {result.longest * 1000:.0f} ms, TPS {result.tps:.0f} "
               f"(baseline {result.baseline_tps:.0f})"
               if result.longest is not None and result.tps and result.baseline_tps else "")
        print(f"{name}: {result.seconds:.1f} s, WAL {result.wal_bytes / 2**20:.0f} MiB{app}",
              flush=True)
    return results


def report(scale: int, results: dict[str, Result]) -> None:
    floor = next(r for n, r in results.items() if n.startswith("VACUUM FULL"))
    repack = next((r for n, r in results.items() if n.startswith("pg_repack")), None)
    print(f"\n| pgbench_accounts, scale {scale} ({scale * 100_000:,} rows, a third updated) "
          "| wall time | vs pg_repack | vs VACUUM FULL | longest app transaction "
          "| TPS (baseline) | WAL | size after |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        vs_repack = f"{r.seconds / repack.seconds:.2f}x" if repack else "-"
        app = (f"{r.longest * 1000:.0f} ms | {r.tps:.0f} ({r.baseline_tps:.0f})"
               if r.tps is not None and r.longest is not None else "- | -")
        print(f"| {name} | {r.seconds:.1f} s | {vs_repack} | {r.seconds / floor.seconds:.2f}x "
              f"| {app} | {r.wal_bytes / 2**20:.0f} MiB | {r.size_after / 2**20:.0f} MiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=100, help="pgbench scale (100,000 rows each)")
    parser.add_argument("--db", help="postgresql:// URL; default: a throwaway server under /tmp")
    parser.add_argument("--pg-repack", default=shutil.which("pg_repack")
                        or "/usr/lib/postgresql/15/bin/pg_repack",
                        help="the pg_repack client (the server needs its extension)")
    parser.add_argument("--rate", type=int, help="the rewrite's --max-rows-per-sec")
    args = parser.parse_args()
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    repack = args.pg_repack if Path(args.pg_repack).exists() else None
    if repack is None:
        print(f"pg_repack not found at {args.pg_repack}: left out (apt install "
              "postgresql-15-repack)")
    with database(args.db) as server:
        results = run(server.url, args.scale, repack, args.rate)
    report(args.scale, results)


if __name__ == "__main__":
    main()
