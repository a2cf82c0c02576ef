"""Where a ``backfill`` batch's time goes: ``python -m bench.dataplane.spark_batch_profile``.

Runs ``backfill --set c=md5(b)`` jobs on ``bench.items`` with one in-process
node (its SparkSession in this process), the first to warm Spark, the JDBC
driver and reorg's per-job caches, then times the second one's batches stage
by stage as they run: the read thread's key scan, the JDBC DataFrames Spark
creates (each one a connection and a schema query), the transform's plan, the
Spark job ending in ``toArrow`` (job scheduling, the JDBC read, md5, Arrow to
the driver), the CSV for COPY; and in the batch transaction every statement
by kind (COPY into the staging table, the merge, the checkpoint, the commit).
Then, on the same warm session, probes that split the Spark job: a job that
reads no rows (Spark's and JDBC's fixed cost per batch) and PostgreSQL
serving the same read to psycopg. Printed as milliseconds per batch; wall
times on a shared machine, to be read as shares of a batch.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import reorg
from bench.dataplane.server import build_table, database, reset_table, tool_parser
from bench.dataplane.statement_timing import timing_statements
from bench.dataplane.tracking import run_to_success

# Statements of the batch transaction by what they are for; the first match wins.
KINDS = [
    ("create staging (if not exists)", "CREATE TEMP TABLE"),
    ("session settings", "SET LOCAL"),
    ("checkpoint", "curr_key = b.curr_key"),
    ("merge (UPDATE ... FROM staging)", "reorg_stage_"),
    ("batch record (INSERT, for rollback)", "_batches\" (subtask_id"),
]


class StageClock:
    """Wall seconds per stage, summed over every thread that runs a batch."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.samples[stage].append(seconds)

    def wrap(self, owner: Any, name: str, stage: str) -> Callable[[], None]:
        """Time every call of ``owner.name`` as ``stage``; returns the undo."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(stage, time.perf_counter() - began)

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    @contextmanager
    def installed(self) -> Iterator[None]:
        from pyspark.sql import DataFrameReader

        from backfill.spark import landing
        from backfill.spark.pipeline import RangePipeline
        from backfill.spark.transform import Transform
        from backfill.spark_backfill import batches

        def in_batch() -> bool:
            return threading.current_thread().name.startswith(("slot-", "read-"))

        def statement(text: str, seconds: float) -> None:
            kind = next((k for k, mark in KINDS if mark in text), None)
            if kind and in_batch():
                self.add(kind, seconds)

        def commit(seconds: float) -> None:
            if threading.current_thread().name.startswith("slot-"):
                self.add("commit", seconds)

        undo = [
            self.wrap(RangePipeline, "bounds", "read: key scan for the batch's end (PostgreSQL)"),
            self.wrap(RangePipeline, "_read", "read thread: whole read (all its batches)"),
            self.wrap(RangePipeline, "_apply", "main thread: whole batch transaction"),
            self.wrap(DataFrameReader, "jdbc", "read: new JDBC DataFrame (connection + schema query)"),
            self.wrap(Transform, "output", "read: transform's DataFrame (plan, expression check)"),
            self.wrap(_dataframe_class(), "toArrow",
                      "read: Spark job (JDBC read, md5, Arrow to driver)"),
            self.wrap(batches.SubtaskRunner, "apply", "in the transaction: apply (COPY, merge, record)"),
            self.wrap(landing, "to_csv", "read: Arrow -> CSV"),
            self.wrap(batches.landing, "copy_in", "COPY into the staging table"),
        ]
        try:
            with timing_statements(statement, commit):
                yield
        finally:
            for u in undo:
                u()


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds used so far by ``root``'s process tree, by command name
    (``java``, ``python``, ``postgres``), counting the children its processes
    reaped (a Spark JDBC connection's backend exits with its task)."""
    import os
    from pathlib import Path

    from bench.dataplane.proctree import process_tree, stat_fields

    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    for pid in process_tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue  # exited meanwhile
        fields = stat_fields(pid)
        if fields is None:
            continue
        ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        kind = "java" if name == "java" else "postgres" if name.startswith("postgres") \
            else "python"
        out[kind] += ticks / hz
    return out


def _dataframe_class() -> Any:
    """The DataFrame class whose methods run (Spark 4's classic one, when there)."""
    import importlib

    try:
        return importlib.import_module("pyspark.sql.classic.dataframe").DataFrame
    except ImportError:
        return importlib.import_module("pyspark.sql.dataframe").DataFrame


def run_job(url: str, node: Any, db: Any, batch_rows: int) -> float:
    """One backfill job of c = md5(b) on ``node``: its wall time, submit to succeeded."""
    from framework.submit import SubmitRequest

    return run_to_success(db, SubmitRequest("backfill", {"table": TABLE, "set": "c=md5(b)"},
                                            batch_rows=batch_rows))


def probes(url: str, batch_rows: int, repeat: int) -> dict[str, list[float]]:
    """The Spark job of one batch split on the warm session: a job on no rows
    (fixed cost), the same batch's read, and PostgreSQL serving that read."""
    import psycopg
    from pyspark.sql import functions as F

    from backfill.spark import session
    from backfill.spark.jdbc import jdbc_target, read_base
    from backfill.spark.pipeline import key_between

    spark = session.get_spark()
    target = jdbc_target(url)
    base = read_base(spark, target, TABLE)
    out: dict[str, list[float]] = defaultdict(list)
    sql = (f"SELECT *, xmin::text::bigint FROM {TABLE} WHERE id >= %s AND id < %s")
    def lap(name: str, fn: Callable[[], Any]) -> None:
        began = time.perf_counter()
        fn()
        out[name].append(time.perf_counter() - began)

    def md5_to_arrow(lo: int, hi: int) -> Any:
        return key_between(base, "id", lo, hi).select("id", F.md5("b").alias("c")).toArrow()

    def fetch(conn: psycopg.Connection[Any], lo: int, hi: int) -> Any:
        return conn.cursor(binary=True).execute(sql, (lo, hi)).fetchall()

    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(repeat):
            lo = 1 + i * batch_rows
            hi = lo + batch_rows
            lap("Spark job on an empty range (fixed cost: job, JDBC connection, query)",
                partial(md5_to_arrow, -2, -1))
            lap("Spark job reading the batch's rows, md5, toArrow", partial(md5_to_arrow, lo, hi))
            lap("Spark job reading the batch's rows, no transform, count",
                key_between(base, "id", lo, hi).count)
            lap("PostgreSQL serving the same read to psycopg (binary)",
                partial(fetch, conn, lo, hi))
    return out


def report(clock: StageClock, batches: int, wall: float) -> list[str]:
    lines = [f"{batches} batches, job {wall:.2f} s submit to succeeded; "
             "per batch: median and sum over all batches (2 slots overlap)"]
    for stage, samples in sorted(clock.samples.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {stage:<62} median {statistics.median(samples) * 1000:7.1f} ms  "
                     f"sum {sum(samples):6.2f} s  ({len(samples)} calls)")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = tool_parser("bench.dataplane.spark_batch_profile", __doc__, rows=400_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10, help="rounds of each probe")
    parser.add_argument("--batches-per-read", type=int, nargs="+", default=[1, 5],
                        help="profile a job for each: batches one Spark job reads")
    args = parser.parse_args(argv)
    from backfill.spark_backfill.batches import SubtaskRunner
    from framework.config import Settings
    from framework.db import Database
    from framework.node import Node

    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        build_table(url, args.rows)
        reorg(url, "db", "upgrade")
        settings = Settings(database_url=url)

        def pg_cpu() -> dict[str, float]:
            return {"postgres": tree_cpu(server.postmaster)["postgres"]} if server.postmaster \
                else {}

        db = Database(settings)
        node = Node(settings, node_id="profile", slots=args.slots)
        node.start()
        try:
            reset_table(url)
            run_job(url, node, db, args.batch_rows)  # warms Spark and the caches
            out = []
            for per_read in args.batches_per_read:
                SubtaskRunner.batches_per_read = per_read
                reset_table(url)
                clock = StageClock()
                cpu_before = {**tree_cpu(os.getpid()), **pg_cpu()}
                with clock.installed():
                    wall = run_job(url, node, db, args.batch_rows)
                cpu = {k: v - cpu_before.get(k, 0.0)
                       for k, v in {**tree_cpu(os.getpid()), **pg_cpu()}.items()}
                batches = len(clock.samples["main thread: whole batch transaction"])
                out.append(f"{per_read} batch(es) per Spark read:")
                out += report(clock, batches, wall)
                out.append("  CPU seconds during the job: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in sorted(cpu.items()))
                    + f"; {sum(cpu.values()):.2f} in all, {sum(cpu.values()) / wall:.2f} "
                    "CPUs on average")
            out.append("probes on the warm session, median of "
                       f"{args.repeat} ({args.batch_rows:,}-row batches):")
            for name, samples in probes(url, args.batch_rows, args.repeat).items():
                out.append(f"  {name:<72} {statistics.median(samples) * 1000:7.1f} ms")
        finally:
            node.drain(timeout=30)
            db.dispose()
    print("\n".join(out))


if __name__ == "__main__":
    main()
