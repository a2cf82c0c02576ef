"""The figures behind four defaults, each against the alternative it was
chosen over, on a durable server (docs/benchmarks.md, "Measured apart").

    python -m bench.apart [--db URL] [--rows 1000000] [--rounds 3]

On ``bench.items (id bigint primary key, a int, b text, c text)`` of
``--rows`` rows, with one reorg node of 2 slots in this process (owner and
workers; its SparkSession warm after a first job, as a running worker's
is), every job submitted through ``framework.submit`` and timed from its
submit to its end:

    copy         `copy --create-target` of the table, against one
                 ``INSERT INTO ... SELECT *`` into a table of the same shape
                 (its primary key built as the rows go in, as the job's is)
    checksum     `checksum` of the table against a copy with 149 rows changed,
                 compared in PostgreSQL (``compare_in = "postgres"``, the
                 default) and in Spark, with 1 and with 2 subtasks at once
    per-subtask  `backfill c=md5(b)` with ranges of 50,000 and of 250,000 rows
                 (``backfill/spark/sizing.py``'s ``ROWS_PER_SUBTASK``)
    cds          a new process's SparkSession start and first Spark job, with
                 the class-data archive (``backfill/spark/cds.py``) and without
    jit          the same, with the archive, as a command's dry-run session
                 starts (``session.SHORT_LIVED_JVM``: no C2) against a worker's;
                 with the JVM's CPU seconds

``--spark-start-only`` runs the last two alone (no database).

Every figure is the median of ``--rounds`` runs, contenders taking turns
within each round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import BUILD_ARCHIVE, reorg
from bench.dataplane.server import (
    build_table,
    database,
    execute,
    query_one,
    server_kind,
    tool_parser,
)
from bench.dataplane.tracking import node_in_process, run_to_success
from framework.db import Database
from framework.submit import SubmitRequest

REPO = Path(__file__).resolve().parents[1]
TWIN = "bench.items_twin"  # the checksum's other side
COPIED = "bench.items_copied"  # the copy job's created target
FLOOR = "bench.items_floor"  # the copy's floor's target
CHANGED = 149  # rows of the twin that differ


def copy_job(db: Database, url: str) -> float:
    execute(url, f"DROP TABLE IF EXISTS {COPIED}")
    return run_to_success(db, SubmitRequest("copy", {
        "table": TABLE, "target": COPIED, "select": ["id", "a", "b", "c"], "create_target": True,
        "where": None}))


def copy_floor(url: str) -> float:
    execute(url, f"DROP TABLE IF EXISTS {FLOOR}",
            f"CREATE TABLE {FLOOR} (LIKE {TABLE} INCLUDING DEFAULTS, PRIMARY KEY (id))")
    began = time.perf_counter()
    execute(url, f"INSERT INTO {FLOOR} SELECT * FROM {TABLE}")
    return time.perf_counter() - began


def make_twin(url: str, rows: int) -> None:
    execute(url, f"DROP TABLE IF EXISTS {TWIN}",
            f"CREATE TABLE {TWIN} (LIKE {TABLE} INCLUDING ALL)",
            f"INSERT INTO {TWIN} SELECT * FROM {TABLE}",
            f"UPDATE {TWIN} SET b = b || ' changed' WHERE id IN "
            f"(SELECT g * {max(rows // CHANGED, 1)} FROM generate_series(1, {CHANGED}) g)",
            f"VACUUM (ANALYZE) {TWIN}")


def checksum_job(db: Database, compare_in: str, concurrency: int) -> float:
    return run_to_success(db, SubmitRequest("checksum", {
        "table": TABLE, "target": TWIN, "columns": None, "compare_in": compare_in},
        concurrency=concurrency))


def backfill_job(db: Database, url: str, rows_per_subtask: int) -> float:
    took = run_to_success(db, SubmitRequest("backfill", {
        "table": TABLE, "set": "c=md5(b)", "where": None, "add_column": None, "udf": None},
        rows_per_subtask=rows_per_subtask))
    # c as built again (the twin's), so the next checksum finds only CHANGED rows.
    execute(url, f"UPDATE {TABLE} SET c = NULL WHERE c IS NOT NULL", f"VACUUM {TABLE}")
    return took


# A new process: the session's start, then its first job, each timed, and
# the CPU its JVM (the process's descendants) used by then. argv[1]: "worker"
# (get_spark) or "command" (get_validation_spark, as a submit's dry run).
SESSION_START = """
import json, os, sys, time
began = time.perf_counter()
from backfill.spark import session
spark = session.get_spark() if sys.argv[1] == "worker" else session.get_validation_spark()
started = time.perf_counter()
spark.range(1000).selectExpr("sum(id)").collect()
first_job = time.perf_counter() - started

def descendants(pid):
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found += [fields] + descendants(int(entry))
    return found

ticks = os.sysconf("SC_CLK_TCK")
jvm_cpu = sum(int(f[11]) + int(f[12]) for f in descendants(os.getpid())) / ticks
print(json.dumps({"start": started - began, "first_job": first_job, "JVM CPU": jvm_cpu}))
"""


def spark_start(archive_dir: str, process: str = "worker") -> dict[str, float]:
    """``archive_dir``: REORG_SPARK_CDS for the process (``off``: no archive);
    ``process``: whose session, "worker" or "command"."""
    done = subprocess.run([sys.executable, "-c", SESSION_START, process], cwd=REPO, check=True,
                          env={**os.environ, "REORG_SPARK_CDS": archive_dir},
                          capture_output=True, text=True, timeout=600)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def build_archive(directory: str) -> None:
    """The archive a worker would build, in ``directory`` (REORG_SPARK_CDS)."""
    subprocess.run([sys.executable, "-c", BUILD_ARCHIVE], cwd=REPO, check=True,
                   env={**os.environ, "REORG_SPARK_CDS": directory}, capture_output=True,
                   timeout=900)


def main() -> None:
    parser = tool_parser("bench.apart", __doc__, rows=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spark-start-only", action="store_true",
                        help="only the Spark session starts (cds, jit); no database")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    if not args.spark_start_only:
        figures = jobs(args)
    figures |= spark_starts(args.rounds)
    print(f"\nmedian of {args.rounds} rounds\n\n| | s |\n| --- | ---: |")
    for label, runs in figures.items():
        print(f"| {label} | {statistics.median(runs):.2f} |")


def jobs(args: argparse.Namespace) -> dict[str, list[float]]:
    """copy, checksum and per-subtask: each job and its alternative, in turns."""
    figures: dict[str, list[float]] = {}

    def timed(label: str, run: Callable[[], float]) -> None:
        seconds = run()
        figures.setdefault(label, []).append(seconds)
        print(f"    {label}: {seconds:.2f} s", flush=True)

    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        where = "the --db server" if args.db else server_kind(args.fast_server)
        print(f"{TABLE} of {args.rows:,} rows on {where}", flush=True)
        build_table(url, args.rows)
        execute(url, f"VACUUM (ANALYZE) {TABLE}")
        make_twin(url, args.rows)
        (version,) = query_one(url, "SELECT version()")
        reorg(url, "db", "upgrade")
        with node_in_process(url, slots=2) as db:
            print("warm-up: a first Spark job", flush=True)
            checksum_job(db, "spark", 2)
            for n in range(1, args.rounds + 1):
                print(f"round {n}", flush=True)
                timed("copy job, 2 slots", lambda: copy_job(db, url))
                timed("INSERT INTO ... SELECT *", lambda: copy_floor(url))
                for compare_in in ("postgres", "spark"):
                    for concurrency in (1, 2):
                        timed(f"checksum in {compare_in}, {concurrency} subtask(s) at once",
                              partial(checksum_job, db, compare_in, concurrency))
                for per in (50_000, 250_000):
                    timed(f"backfill, {per:,}-row subtasks", partial(backfill_job, db, url, per))
        execute(url, f"DROP TABLE IF EXISTS {COPIED}", f"DROP TABLE IF EXISTS {FLOOR}")
    print(f"jobs on {version.split(' on ')[0]}, {where}", flush=True)
    return figures


def spark_starts(rounds: int) -> dict[str, list[float]]:
    """cds and jit: a new process's session, in turns within each round."""
    figures: dict[str, list[float]] = {}
    contenders = (("worker, with the archive", "worker", True), ("worker, without", "worker", False),
                  ("command, with the archive", "command", True))
    with tempfile.TemporaryDirectory(prefix="reorg-bench-cds-") as archive_dir:
        build_archive(archive_dir)
        for _ in range(rounds):
            for label, process, with_archive in contenders:
                took = spark_start(archive_dir if with_archive else "off", process)
                for part, value in took.items():
                    figures.setdefault(f"Spark {part.replace('_', ' ')}, {label}", []).append(value)
                print(f"    Spark {label}: start {took['start']:.2f} s, first job "
                      f"{took['first_job']:.2f} s, JVM CPU {took['JVM CPU']:.2f} s", flush=True)
    return figures


if __name__ == "__main__":
    main()
