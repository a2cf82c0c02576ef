"""Issue 24's 100M-row targets for ``rewrite``: the job running within 10 s
of its submit, and its copy at ≥ 0.8x the rate of one ``INSERT ... SELECT``
of the whole table.

    python -m bench.bigtable.rewrite_copy --db URL [--rows 100000000] [--window 60] [--rounds 5]

On ``bench.items`` (bench.bigtable's table, built if missing), with one
`reorg worker --slots 2`, each round:

    submit   `reorg submit rewrite --table bench.items` -> the job `running`
             (prepare: the shadow, the log, the capture trigger; the split)
    copy     rows the job copied into the shadow over ``--window`` seconds,
             from a fresh CHECKPOINT
    cancel   `reorg cancel` -> the job `cancelled`; nothing of it left behind
             (no relation named for the job, no trigger on the table)
    floor    one ``INSERT INTO a new table SELECT * FROM bench.items LIMIT n``
             (the statement a whole-table copy is, over its first n rows: a
             sequential scan, no index on the new table, as the shadow has
             none during the copy), n = the rows reorg copied, from a fresh
             CHECKPOINT; then the new table dropped

A whole pass over 100M rows would take most of an hour a contender on 2
cores, so the rates come from the job's window and from the same number of
rows for the floor. The table (~7 GB) fits in the machine's page cache, so
both read it from memory; both write their WAL to a durable server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from backfill.rewrite import names
from bench.bigtable import build, measure
from bench.dataplane import window_cpu
from bench.dataplane.errors import BenchError
from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import reorg
from bench.dataplane.server import add_fast_server, database, execute, query_one, server_kind
from bench.dataplane.tracking import job_status, system_tables
from bench.dataplane.workers import running_worker
from framework.db import Database

FLOOR_TABLE = "bench.copy_floor"
RUNNING_TARGET = 10.0  # seconds, submit -> running
COPY_TARGET = 0.8  # minimum, reorg's copy rate / the floor's


@dataclass
class Round:
    running_seconds: float  # `reorg submit` launched -> the job running
    db_running_seconds: float  # the job's created_at -> its running event
    reorg: measure.Rate
    floor: measure.Rate
    cancel_seconds: float

    @property
    def ratio(self) -> float:
        return self.reorg.per_second / self.floor.per_second


def copy_rate(url: str, db: Database, job_id: int, window: float,
              worker_pid: int) -> measure.Rate:
    """``measure.reorg_rate`` over a window the job spends copying: it must
    not leave the copy step within the window (rows_processed counts every
    step's rows: a verify's too)."""
    before = job_status(db, job_id)
    copied = measure.reorg_rate(url, db, job_id, window, worker_pid)
    after = job_status(db, job_id)
    if after["state"] != "running" or after["step"] != before["step"]:
        raise BenchError(f"job {job_id} left its copy step within the {window:.0f}-s window "
                         f"({after['state']}, step {after['step']}): give more --rows or a "
                         "shorter --window")
    if not copied.rows:
        raise BenchError(f"job {job_id} copied no row in {window:.0f} s; give a longer --window")
    return copied


def cancel_and_check(url: str, db: Database, job_id: int, timeout: float) -> float:
    """Seconds from `reorg cancel` to the job cancelled; raises if anything of
    the job is left: a relation named for it, a trigger on the table."""
    seconds = measure.cancel_and_wait(url, db, job_id, timeout)
    (relations,) = query_one(url, "SELECT count(*) FROM pg_class WHERE starts_with(relname, %s) "
                                  "OR starts_with(relname, %s)",
                             (names.prefix(job_id), f"rewrite_{job_id}_"))
    (triggers,) = query_one(url, "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
                                 "AND NOT tgisinternal", (TABLE,))
    if relations or triggers:
        raise BenchError(f"job {job_id} cancelled but left {relations} relations and "
                         f"{triggers} triggers behind")
    return seconds


def floor_rate(url: str, rows: int) -> measure.Rate:
    """One ``INSERT ... SELECT`` of the table's first ``rows`` rows into a new
    table of its columns."""
    execute(url, f"DROP TABLE IF EXISTS {FLOOR_TABLE}",
            f"CREATE TABLE {FLOOR_TABLE} (LIKE {TABLE} INCLUDING DEFAULTS)")
    cpu = window_cpu.WindowCpu(url, {"this benchmark": os.getpid()})
    measure.fresh_checkpoint(url)
    cpu.start()
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        backend = conn.info.backend_pid
        conn.execute(f"INSERT INTO {FLOOR_TABLE} SELECT * FROM {TABLE} "  # type: ignore[arg-type]
                     f"LIMIT {int(rows)}")
    seconds = time.perf_counter() - began
    # Its backend ends with its connection: counted once reaped.
    used = cpu.stop(ended={backend})
    execute(url, f"DROP TABLE {FLOOR_TABLE}")
    return measure.Rate(rows, seconds, used)


def one_round(url: str, db: Database, worker_pid: int, window: float) -> Round:
    start = measure.start_job(url, db, 600, ("rewrite", "--table", TABLE))
    job_id = start.job_id
    print(f"    job {job_id} running {start.wall_seconds:.2f} s after its submit "
          f"({start.db_seconds:.2f} s on the database clock)", flush=True)
    copied = copy_rate(url, db, job_id, window, worker_pid)
    print(f"    copy: {copied.rows:,} rows, {copied.per_second:,.0f} rows/s; cores: "
          f"{window_cpu.describe(copied.cpu, copied.seconds)}", flush=True)
    cancel_seconds = cancel_and_check(url, db, job_id, timeout=600)
    print(f"    cancelled in {cancel_seconds:.2f} s, nothing left behind", flush=True)
    floor = floor_rate(url, copied.rows)
    print(f"    floor: {floor.rows:,} rows in {floor.seconds:.1f} s, {floor.per_second:,.0f} "
          f"rows/s; cores: {window_cpu.describe(floor.cpu, floor.seconds)}", flush=True)
    return Round(start.wall_seconds, start.db_seconds, copied, floor, cancel_seconds)


def summary(rounds: list[Round]) -> str:
    ratios = [r.ratio for r in rounds]
    running = [r.running_seconds for r in rounds]
    return (f"copy / floor per round: {', '.join(f'{x:.3f}' for x in ratios)}; median "
            f"{statistics.median(ratios):.3f} (target ≥ {COPY_TARGET}); running after "
            f"{', '.join(f'{x:.2f}' for x in running)} s (target ≤ {RUNNING_TARGET:.0f} s)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bigtable.rewrite_copy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--db", help="postgresql:// URL of an existing server (TCP host); "
                                     "default: a throwaway local cluster, durable")
    parser.add_argument("--window", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--rounds", type=int, default=5)
    add_fast_server(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-rewrite-copy-logs-"))
    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        have = build.existing_rows(url)
        if have is None or abs(have - args.rows) > args.rows // 5:
            print(f"building {TABLE} with {args.rows:,} rows", flush=True)
            build.build_table(url, args.rows)
        (size,) = query_one(url, f"SELECT pg_size_pretty(pg_total_relation_size('{TABLE}'))")
        (version,) = query_one(url, "SELECT version()")
        print(f"{TABLE}: ~{build.existing_rows(url):,} rows, {size}; "
              f"{version.split(' on ')[0]}, "
              f"{'the --db server' if args.db else server_kind(args.fast_server)}", flush=True)
        reorg(url, "db", "upgrade")
        rounds = []
        with system_tables(url) as db, running_worker(url, "rewrite-copy-1", log_dir) as worker:
            for n in range(1, args.rounds + 1):
                print(f"round {n}", flush=True)
                rounds.append(one_round(url, db, worker.proc.pid, args.window))
                print(f"    copy / floor {rounds[-1].ratio:.3f}", flush=True)
    print(summary(rounds), flush=True)
    print(f"worker log in {log_dir}", flush=True)


if __name__ == "__main__":
    began = time.perf_counter()
    try:
        main()
    except BenchError as exc:
        sys.exit(f"error: {exc}")
    print(f"took {time.perf_counter() - began:.0f} s", flush=True)
