"""The command line of the data-plane benchmark (``python -m bench.dataplane``):
its arguments, the order the contenders run in, and the report at the end."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from bench.dataplane.baselines import run_chunked_sql, run_plain_spark, run_single_update
from bench.dataplane.errors import BenchError
from bench.dataplane.kill_run import run_reorg_killed
from bench.dataplane.proctree import Neighbours
from bench.dataplane.records import SPARK_PARTITIONS, TABLE, Results
from bench.dataplane.reorg_cli import REPO, build_spark_archive, reorg, stack_import_seconds
from bench.dataplane.reorg_runs import run_reorg_contender
from bench.dataplane.report import machine, summary_lines, write_doc
from bench.dataplane.server import (
    add_fast_server,
    build_table,
    database,
    query_one,
    server_kind,
    verify,
)
from bench.dataplane.submit_times import run_submit_times
from bench.dataplane.timing import contend, timed

DEFAULT_DOC = REPO / "docs" / "benchmarks.md"

T = TypeVar("T")


def check_job_type(job_type: str) -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group="reorg.job_types")}
    if job_type not in names:
        raise SystemExit(f"error: job type {job_type!r} is not registered (entry point group "
                         f"reorg.job_types has: {', '.join(sorted(names)) or 'none'}); "
                         "reinstall with `pip install -e .` or use --job-type sql-update")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dataplane",
        description="reorg's backfill against a hand-written PySpark job and plain SQL")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows in bench.items")
    parser.add_argument("--db", help="postgresql:// URL of an existing server (TCP host); "
                        "default: a throwaway local cluster")
    parser.add_argument("--skip-reorg", action="store_true", help="only the baselines (2)-(4)")
    parser.add_argument("--job-type", choices=["backfill", "sql-update", "both"],
                        default="backfill", help="reorg job type(s) for contender (1)")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 run")
    parser.add_argument("--no-submit-times", action="store_true",
                        help="skip `reorg submit` of every job type (run with backfill)")
    parser.add_argument("--spark-partitions", type=int, default=SPARK_PARTITIONS,
                        help="JDBC read partitions of the plain Spark job")
    parser.add_argument("--quiet-wait", type=float, default=120.0, metavar="SECONDS",
                        help="before each contender, wait up to this long for other processes "
                        "to leave the CPUs alone (0: don't wait)")
    parser.add_argument("--retries", type=int, default=2,
                        help="run a contender again, up to this often, when other processes took "
                        "over 10%% of the CPUs while it ran")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="markdown report to write")
    add_fast_server(parser)
    return parser.parse_args(argv)


def shown_command(argv: Sequence[str]) -> str:
    """The command line for the report, with the database URL (it may hold a
    password) left out."""
    shown, hide = [], False
    for arg in argv:
        shown.append("URL" if hide else re.sub(r"^--db=.*", "--db=URL", arg))
        hide = arg == "--db"
    return " ".join(["python -m bench.dataplane", *shown])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    job_types = [] if args.skip_reorg else (
        ["backfill", "sql-update"] if args.job_type == "both" else [args.job_type])
    for job_type in job_types:
        check_job_type(job_type)
    started = time.perf_counter()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-bench-logs-"))
    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        print(f"building {TABLE} with {args.rows:,} rows", flush=True)
        with timed("build") as build:
            build_table(url, args.rows)
        # Without our own server, its work would count as other processes': don't measure.
        neighbours = Neighbours([os.getpid(), server.postmaster] if server.postmaster else [],
                                args.quiet_wait)
        others_cpu: dict[str, float | None] = {}

        def baseline(name: str, run: Callable[[], T], old_values: bool = False) -> T:
            print(name, flush=True)
            result, others_cpu[name] = contend(url, neighbours, args.retries, run,
                                               old_values=old_values)
            verify(url, args.rows, name)
            return result

        single = baseline("one UPDATE", lambda: run_single_update(url))
        chunked = baseline("chunked SQL", lambda: run_chunked_sql(url))
        chunked_old = chunked_images = stack_import = None
        if "sql-update" in job_types:
            stack_import = stack_import_seconds()
            # What sql-update overwriting old values is judged against, and
            # PostgreSQL alone writing the same before-images.
            chunked_old = baseline("chunked SQL, old values", lambda: run_chunked_sql(url),
                                   old_values=True)
            chunked_images = baseline("chunked SQL with before-images, old values",
                                      lambda: run_chunked_sql(url, images=True), old_values=True)
        plain = baseline("plain Spark", lambda: run_plain_spark(url, args.spark_partitions))
        (pg_version,) = query_one(url, "SELECT version()")
        res = Results(shown_command(sys.argv[1:] if argv is None else argv), args.rows,
                      machine(pg_version), stamp,
                      "`--db` server" if args.db else server_kind(args.fast_server),
                      build.seconds, single, chunked, plain, others_cpu=others_cpu,
                      chunked_sql_old=chunked_old, chunked_sql_images=chunked_images,
                      stack_import=stack_import)
        if job_types:
            res.machine["Spark class-data archive"] = build_spark_archive()
            print("(1) reorg", flush=True)
            reorg(url, "db", "upgrade")
            for job_type in job_types:
                startup, runs = run_reorg_contender(url, args.rows, job_type, log_dir, neighbours,
                                                    args.retries)
                res.worker_startup[job_type] = startup
                res.reorg_runs += runs
            if "backfill" in job_types and not args.no_submit_times:
                res.submit_times = run_submit_times(url, log_dir)
            if not args.no_kill:
                res.kill = run_reorg_killed(server, args.rows, job_types[0], log_dir)
        res.wall = time.perf_counter() - started
        neighbours.stop()
    print("\n".join(["", "results", *summary_lines(res)]), flush=True)
    write_doc(res, args.doc)
    if job_types:
        print(f"written to {args.doc}; worker and kill-run server logs in {log_dir}", flush=True)
    else:
        log_dir.rmdir()
        print(f"written to {args.doc}", flush=True)


def run(argv: Sequence[str] | None = None) -> None:
    """``main`` with a BenchError as one line on stderr and exit status 1."""
    try:
        main(argv)
    except BenchError as exc:
        sys.exit(f"error: {exc}")
