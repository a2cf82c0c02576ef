"""The WAL a job writes per row, against chunked SQL writing the same rows:
the figure ``docs/benchmarks.md``'s estimates at 1,000,000,000 rows start
from (WAL volume, a standby's replay).

    python -m bench.wal_volume [--rows 500000] [--rows-per-subtask 50000] [--db URL]

On a throwaway durable local PostgreSQL (fsync, synchronous_commit and
full_page_writes on; or ``--db``, an otherwise idle server: the WAL counted
is the whole server's), ``bench.items`` of ``--rows`` rows, autovacuum off.
Each contender sets a column on every row, after the table is reset to one
physical state (``bench.dataplane.server.reset_table``: reloaded in key
order, vacuumed, CHECKPOINT, so each pays the same full-page images):

- chunked SQL, ``c = md5(b)`` on a NULL ``c`` (10,000-key chunks, 2
  connections, autocommit);
- ``reorg submit sql-update --set c=md5(b)`` on the NULL ``c``;
- ``reorg submit sql-update --add-column d:text --set d=md5(b)``;
- chunked SQL on old values writing sql-update's before-images (the floor of
  an overwrite);
- ``reorg submit sql-update --set c=md5(b)`` on old values (an image per row).

The reorg jobs run on one ``reorg worker --slots 2`` at
``--rows-per-subtask``; their WAL counts from the submit to every subtask
moved to history (the claims, checkpoints, batch records and history moves
included). Reported: WAL bytes (``pg_current_wal_lsn`` before and after),
per row, per subtask over chunked SQL's, and full-page images and records
(``pg_stat_wal``).

Then, on the throwaway server only, how fast PostgreSQL replays WAL, which
bounds a standby's lag: the overwrite's chunked SQL runs once more after a
CHECKPOINT, the server is stopped with SIGQUIT (an immediate shutdown, no
checkpoint) and started again; crash recovery's redo is the same
single-process replay a streaming standby runs, and the server log gives its
elapsed time ("redo done ... elapsed"). A real standby also waits for the
network and for its readers' conflicts: this is its ceiling.

Prints one JSON document and a markdown table.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bigtable.measure import wait_for
from bench.cancel_scale import workers
from bench.dataplane.baselines import run_chunked_sql
from bench.dataplane.errors import BenchError
from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import reorg
from bench.dataplane.server import add_fast_server, build_table, query_one, reset_table
from bench.dataplane.tracking import job_status, system_tables
from framework import migrate
from framework.db import Database
from framework.localpg.cluster import LocalPostgres

WAL_NOW = "SELECT pg_current_wal_lsn()::text, wal_fpi, wal_records FROM pg_stat_wal"


def wal_of(url: str, work: Callable[[], int | None]) -> dict[str, Any]:
    """The WAL the server wrote while ``work`` ran (it returns the subtasks
    of its job, or None)."""
    lsn, fpi, records = query_one(url, WAL_NOW)
    subtasks = work()
    after, fpi_after, records_after = query_one(url, WAL_NOW)
    written = query_one(url, "SELECT pg_wal_lsn_diff(%s, %s)::bigint", (after, lsn))[0]
    return {"bytes": int(written), "full_page_images": int(fpi_after - fpi),
            "records": int(records_after - records), "subtasks": subtasks}


def reorg_job(url: str, db: Database, rows_per_subtask: int, *args: str) -> Callable[[], int]:
    def run() -> int:
        done = reorg(url, "submit", "sql-update", "--table", TABLE, *args,
                     "--rows-per-subtask", str(rows_per_subtask), "--json")
        job_id = int(json.loads(done.stdout)["id"])

        def moved() -> bool:
            job = job_status(db, job_id)
            if job["state"] in ("failed", "cancelled", "reverted"):
                raise BenchError(f"job {job_id} {job['state']}: {job['error']}")
            return bool(job["state"] == "succeeded" and job["history_done"])
        wait_for(f"job {job_id} to succeed and move to history", moved, 1800)
        return int(job_status(db, job_id)["succeeded"])
    return run


def measure(url: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    build_table(url, args.rows, autovacuum=False)
    results: dict[str, dict[str, Any]] = {}

    def chunked(images: bool) -> Callable[[], None]:
        return lambda: (run_chunked_sql(url, images=images), None)[1]

    with system_tables(url) as db:
        migrate.upgrade(db)
        with workers(url, db, 1, 2, log_dir, name="wal"):
            contenders: list[tuple[str, bool, Callable[[], int | None]]] = [
                ("chunked SQL, c NULL", False, chunked(False)),
                ("sql-update, c NULL", False,
                 reorg_job(url, db, args.rows_per_subtask, "--set", "c=md5(b)")),
                ("sql-update --add-column", False,
                 reorg_job(url, db, args.rows_per_subtask, "--set", "d=md5(b)",
                           "--add-column", "d:text")),
                ("chunked SQL writing before-images, old values", True, chunked(True)),
                ("sql-update overwriting old values (images kept)", True,
                 reorg_job(url, db, args.rows_per_subtask, "--set", "c=md5(b)")),
            ]
            for label, old_values, work in contenders:
                reset_table(url, old_values=old_values)
                print(f"{label} ...", file=sys.stderr, flush=True)
                results[label] = wal_of(url, work)
    size = query_one(url, f"SELECT pg_total_relation_size('{TABLE}')")[0]
    return {"rows": args.rows, "rows_per_subtask": args.rows_per_subtask,
            "table_bytes_after": int(size), "contenders": results}


def replay(cluster: LocalPostgres) -> dict[str, Any]:
    """WAL replayed per second by crash recovery (see the module's doc)."""
    url = cluster.url()
    reset_table(url, old_values=True)
    written = wal_of(url, lambda: (run_chunked_sql(url, images=True), None)[1])["bytes"]
    pid = int((cluster.pgdata / "postmaster.pid").read_text().split()[0])
    logged = cluster.log_file.stat().st_size
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + 60
    while cluster.is_running():
        if time.monotonic() > deadline:
            raise BenchError("the server did not stop after SIGQUIT")
        time.sleep(0.1)
    cluster.start()  # returns once recovery is over and it accepts connections
    with open(cluster.log_file, errors="replace") as log:
        log.seek(logged)
        found = re.search(r"redo done at .*elapsed: ([0-9.]+) s", log.read())
    if found is None:
        raise BenchError(f"no 'redo done ... elapsed' line in {cluster.log_file}")
    seconds = float(found.group(1))
    return {"wal_bytes": written, "redo_seconds": seconds,
            "mib_per_second": round(written / 2**20 / seconds, 1)}


def table(report: dict[str, Any]) -> list[str]:
    rows = report["rows"]
    contenders = report["contenders"]
    base = {False: contenders["chunked SQL, c NULL"]["bytes"],
            True: contenders["chunked SQL writing before-images, old values"]["bytes"]}
    lines = ["| contender | WAL | per row | x chunked SQL | per subtask over it | "
             "full-page images | records |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, r in contenders.items():
        floor = base["old values" in label]
        extra = (f"{(r['bytes'] - floor) / r['subtasks']:,.0f} B" if r["subtasks"] else "")
        lines.append(f"| {label} | {r['bytes'] / 2**20:,.1f} MiB | {r['bytes'] / rows:,.0f} B | "
                     f"{r['bytes'] / floor:.2f} | {extra} | {r['full_page_images']:,} | "
                     f"{r['records']:,} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wal_volume",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--rows-per-subtask", type=int, default=50_000)
    parser.add_argument("--db", help="postgresql:// URL of an otherwise idle scratch server")
    add_fast_server(parser)
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="reorg-wal-logs-"))
    try:
        if args.db:
            report = measure(args.db, args, log_dir)
        else:
            data_dir = Path(tempfile.mkdtemp(prefix="reorg-bench-", dir="/tmp"))
            cluster = LocalPostgres(data_dir, durable=not args.fast_server)
            try:
                cluster.init()
                cluster.start()
                report = measure(cluster.url(), args, log_dir)
                report["replay"] = replay(cluster)
            finally:
                cluster.stop()
                shutil.rmtree(data_dir, ignore_errors=True)
    except BenchError as exc:
        sys.exit(f"error: {exc} (worker logs in {log_dir})")
    print(json.dumps(report, indent=2))
    print("\n".join(table(report)))
    if "replay" in report:
        r = report["replay"]
        print(f"\nreplay: {r['wal_bytes'] / 2**20:,.1f} MiB of WAL redone in "
              f"{r['redo_seconds']:.2f} s, {r['mib_per_second']:,.1f} MiB/s")


if __name__ == "__main__":
    main()
