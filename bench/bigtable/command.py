"""The command line of the big-table benchmark and the order of its measures."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.bigtable import build, measure, report
from bench.dataplane import window_cpu
from bench.dataplane.errors import BenchError
from bench.dataplane.reorg_cli import reorg
from bench.dataplane.server import add_fast_server, database, query_one, server_kind
from bench.dataplane.tracking import system_tables
from bench.dataplane.workers import running_worker

DEFAULT_DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bigtable",
        description="reorg on a 100M-row table: submit -> running, range evenness, "
                    "rows/s against chunked SQL, cancel time")
    parser.add_argument("--rows", type=int, default=100_000_000, help="rows in bench.items")
    parser.add_argument("--db", help="postgresql:// URL of an existing server (TCP host); "
                                     "default: a throwaway local cluster, durable")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a bench.items of about --rows rows (within 20%%, the planner's "
                             "estimate) left by an earlier run (with --db) instead of "
                             "building it again")
    parser.add_argument("--old-values", action="store_true",
                        help="build c with a value in every row (default NULL), so the job "
                             "keeps a before-image of every row it writes and the cancel "
                             "restores them all")
    parser.add_argument("--window", type=float, default=180.0, metavar="SECONDS",
                        help="how long each contender runs for its rows/s")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC,
                        help="markdown file whose '100M rows' section is written")
    parser.add_argument("--heading", default=report.HEADING,
                        help="the section's heading (replaced if present)")
    add_fast_server(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-bigtable-logs-"))
    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        have = build.existing_rows(url) if args.reuse else None
        if have is not None and abs(have - args.rows) <= args.rows // 5:
            print(f"reusing bench.items (~{have:,} rows)", flush=True)
            build_seconds = None
        else:
            print(f"building bench.items with {args.rows:,} rows", flush=True)
            build_seconds = build.build_table(url, args.rows, args.old_values)
        (size,) = query_one(url, "SELECT pg_size_pretty(pg_total_relation_size('bench.items'))")
        (pg_version,) = query_one(url, "SELECT version()")
        reorg(url, "db", "upgrade")
        with system_tables(url) as db, running_worker(url, "bigtable-1", log_dir) as worker:
            print("submit -> running", flush=True)
            start = measure.start_job(url, db, timeout=600)
            print(f"    {start.wall_seconds:.2f} s ({start.db_seconds:.2f} s on the database "
                  f"clock; the submit command {start.submit_seconds:.2f} s): {start.detail}",
                  flush=True)
            print(f"reorg sql-update for {args.window:.0f} s", flush=True)
            reorg_rate = measure.reorg_rate(url, db, start.job_id, args.window, worker.proc.pid)
            print(f"    {reorg_rate.rows:,} rows, {reorg_rate.per_second:,.0f} rows/s; cores: "
                  f"{window_cpu.describe(reorg_rate.cpu, reorg_rate.seconds)}", flush=True)
            print("cancel", flush=True)
            cancel = measure.cancel_job(url, db, start.job_id, timeout=3600,
                                        old_values=args.old_values)
            print(f"    cancelled after {cancel.seconds:.2f} s (the owner's longest "
                  f"transaction {cancel.owner_longest_transaction:.2f} s); {cancel.still_set} of "
                  f"{cancel.touched_rows:,} touched rows still set", flush=True)
            if cancel.still_set:
                raise BenchError(f"cancel left {cancel.still_set} rows changed")
            even = measure.evenness(url, db, start.job_id)
            low, mid, high = even.figures()
            print(f"    evenness of {len(even.counted)} of {even.ranges} ranges: "
                  f"min {low:,} median {mid:,.0f} max {high:,}", flush=True)
        print(f"chunked SQL for {args.window:.0f} s", flush=True)
        chunked, keys = measure.chunked_sql_rate(url, args.window)
        print(f"    {chunked.rows:,} rows, {chunked.per_second:,.0f} rows/s; cores: "
              f"{window_cpu.describe(chunked.cpu, chunked.seconds)}", flush=True)
        measure.put_back(url, keys, args.old_values)
    res = report.Results(stamp, args.rows, str(size), pg_version.split(" on ")[0],
                         "`--db` server" if args.db else server_kind(args.fast_server),
                         build_seconds, args.window, start, even, reorg_rate, chunked, cancel,
                         args.old_values)
    report.write(res, args.doc, args.heading)
    print(f"written to {args.doc} ({args.heading}); worker log in {log_dir}", flush=True)


def run(argv: Sequence[str] | None = None) -> None:
    """``main`` with a BenchError as one line on stderr and exit status 1."""
    began = time.perf_counter()
    try:
        main(argv)
    except BenchError as exc:
        sys.exit(f"error: {exc}")
    print(f"took {time.perf_counter() - began:.0f} s", flush=True)
