"""The same UPDATE inside reorg's batches and in chunked SQL, seen from the
server: ``python -m bench.dataplane.statement_inside [--rounds 3]``.

Issue 25 target 3 asks why ``sql-update --add-column`` takes longer than
chunked SQL when both run the same ``UPDATE ... WHERE id >= lo AND id < hi``
of 10,000 keys. For each contender, round after round on one server (the
table reset before each, ``server.reset_table``): the statements'
``pg_stat_statements`` figures (calls, mean execution and planning time,
buffers dirtied and written, WAL records, full-page images and bytes) and
what the contender's backends were doing, sampled from ``pg_stat_activity``
every few milliseconds (running on a CPU, or the wait event). Contenders:

    chunked     chunked SQL (``baselines.run_chunked_sql``): 2 autocommit connections
    reorg       ``reorg submit sql-update --set d=md5(b) --add-column d:text --wait``
                on one ``reorg worker --slots 2``
    chunked+ck  chunked SQL, each chunk in a transaction with a one-row UPDATE
                of a checkpoint table, as a reorg batch commits with its fenced
                checkpoint (no lease, no fence: the transaction's shape only)

The server loads ``pg_stat_statements`` (the throwaway cluster only; with
``--db`` it must be in ``shared_preload_libraries``). Printed, not written.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.dataplane import reorg_cli, workers
from bench.dataplane.baselines import run_chunked_sql
from bench.dataplane.chunks import in_parallel
from bench.dataplane.records import CHUNK_ROWS, SQL_CONNECTIONS, TABLE
from bench.dataplane.server import Server, build_table, execute, query_one, reset_table, verify
from bench.dataplane.server import tool_parser as _tool_parser

SAMPLE_SECONDS = 0.005
CHECKPOINTS = "bench.chunk_checkpoint"


@contextlib.contextmanager
def _server(url: str | None, durable: bool) -> Iterator[Server]:
    """``server.database`` with ``pg_stat_statements`` loaded."""
    if url:
        yield Server(url, None, None)
        return
    from framework.localpg.cluster import LocalPostgres

    data_dir = Path(tempfile.mkdtemp(prefix="reorg-bench-", dir="/tmp"))
    cluster = LocalPostgres(data_dir, durable=durable)
    try:
        cluster.init()
        with open(cluster.pgdata / "postgresql.conf", "a") as conf:
            conf.write("shared_preload_libraries = 'pg_stat_statements'\n"
                       "pg_stat_statements.track = 'all'\n")
        cluster.start()
        yield Server(cluster.url(), cluster.log_file, None)
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


class WaitSampler:
    """What the backends named by ``names`` (``application_name`` prefixes)
    do, sampled until stopped: 'CPU' for an active backend with no wait
    event, else 'type:event'."""

    def __init__(self, url: str, names: Sequence[str]) -> None:
        self.url, self.names = url, list(names)
        self.counts: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM "
                    "pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
                    "AND application_name LIKE ANY (%s)",
                    ([f"{n}%" for n in self.names],)).fetchall()
                self.counts.update(r[0] for r in rows)
                time.sleep(SAMPLE_SECONDS)


STATEMENTS = """
    SELECT calls, total_exec_time, mean_exec_time, total_plan_time, shared_blks_hit,
           shared_blks_read, shared_blks_dirtied, shared_blks_written, wal_records, wal_fpi,
           wal_bytes, query
    FROM pg_stat_statements WHERE calls >= 20 ORDER BY total_exec_time DESC LIMIT 8"""


def _statements(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(STATEMENTS)
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _chunked_with_checkpoint(url: str) -> float:
    """Chunked SQL whose chunks commit as reorg's batches do: the UPDATE and
    a one-row UPDATE of a checkpoint table in one transaction."""
    low, high = query_one(url, f"SELECT min(id), max(id) FROM {TABLE}")
    execute(url, f"DROP TABLE IF EXISTS {CHECKPOINTS}",
            f"CREATE TABLE {CHECKPOINTS} (id int PRIMARY KEY, curr bigint)",
            f"INSERT INTO {CHECKPOINTS} SELECT g, 0 FROM generate_series(1, 64) g")

    def update(conn: psycopg.Connection[Any], lo: int) -> None:
        with conn.transaction():
            conn.execute(f"UPDATE {TABLE} SET d = md5(b) WHERE id >= %s AND id < %s",
                         (lo, lo + CHUNK_ROWS))
            conn.execute(f"UPDATE {CHECKPOINTS} SET curr = %s WHERE id = %s",
                         (lo + CHUNK_ROWS, 1 + (lo // CHUNK_ROWS) % 64))

    began = time.perf_counter()
    in_parallel(url, SQL_CONNECTIONS, iter(range(int(low), int(high) + 1, CHUNK_ROWS)),
                update, "chunked SQL with checkpoints")
    return time.perf_counter() - began


def _measure(url: str, name: str, run: Callable[[], object]) -> dict[str, Any]:
    execute(url, "SELECT pg_stat_statements_reset()")
    began = time.perf_counter()
    with WaitSampler(url, ["reorg-worker", "psycopg", ""]) as sampler:
        run()
    seconds = time.perf_counter() - began
    return {"name": name, "seconds": seconds, "waits": dict(sampler.counts),
            "statements": _statements(url)}


def _add_d(url: str) -> None:
    execute(url, f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS d text")


def main(argv: Sequence[str] | None = None) -> None:
    parser = _tool_parser("bench.dataplane.statement_inside", __doc__, rows=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-inside-logs-"))
    results: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    with _server(args.db, not args.fast_server) as server:
        url = server.url
        build_table(url, args.rows, autovacuum=False)
        execute(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        reorg_cli.reorg(url, "db", "upgrade")
        with workers.running_worker(url, f"inside-{os.getpid()}", log_dir):
            for n in range(args.rounds):
                reset_table(url)
                results["chunked"].append(_measure(url, "chunked", lambda: run_chunked_sql(url)))
                reset_table(url)
                results["reorg"].append(_measure(
                    url, "reorg", lambda: reorg_cli.WaitingSubmit(
                        url, "sql-update", reorg_cli.ADD_D).wait()))
                verify(url, args.rows, "reorg", "d")
                reset_table(url)
                _add_d(url)
                results["chunked+ck"].append(_measure(
                    url, "chunked+ck", lambda: _chunked_with_checkpoint(url)))
                print(f"round {n + 1}: " + ", ".join(
                    f"{k} {v[-1]['seconds']:.2f} s" for k, v in results.items()), flush=True)
    for name, runs in results.items():
        print(f"\n== {name}: median {statistics.median(r['seconds'] for r in runs):.2f} s")
        for r in runs:
            total = sum(r["waits"].values()) or 1
            top = sorted(r["waits"].items(), key=lambda kv: -kv[1])[:6]
            print(f"  {r['seconds']:.2f} s; backends: " + ", ".join(
                f"{k} {v / total:.0%}" for k, v in top))
            for s in r["statements"][:4]:
                print(f"    {s['calls']:>5} x {s['mean_exec_time']:.2f} ms exec "
                      f"(plan {s['total_plan_time'] / s['calls']:.2f} ms), dirtied "
                      f"{s['shared_blks_dirtied']}, written {s['shared_blks_written']}, "
                      f"wal {s['wal_records']} rec / {s['wal_fpi']} fpi / "
                      f"{int(s['wal_bytes']) / 2**20:.1f} MiB: {' '.join(s['query'].split())[:110]}")


if __name__ == "__main__":
    main()
