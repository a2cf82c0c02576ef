"""`reorg submit` wall time of every job type, on a warm worker: the command
as a user runs it, from launch to exit, each job waited for before the next.

The jobs run on a small copy of the table (``SMALL``): a submit's own work
(parsing, PostgreSQL-side checks, writing the job, and for the Spark types the
owner's analysis and dry run on sample rows) does not grow with the table,
and the jobs it starts then finish in a moment."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.dataplane.records import TABLE
from bench.dataplane.reorg_cli import reorg, wait_job
from bench.dataplane.server import execute
from bench.dataplane.timing import timed
from bench.dataplane.workers import running_worker, wait_spark_ready

SMALL, TWIN = "bench.small", "bench.small_twin"
SMALL_ROWS = 10_000
REPEATS = 3


def submit_arguments(job_type: str, attempt: object) -> list[str]:
    """``reorg submit JOB_TYPE``'s arguments for a job on ``SMALL`` (``copy``
    writes a table of its own per ``attempt``)."""
    if job_type in ("sql-update", "backfill"):
        return ["--table", SMALL, "--set", "c=md5(b)"]
    if job_type == "copy":
        return ["--table", SMALL, "--target", f"bench.small_copy_{attempt}", "--create-target",
                "--select", "id", "--select", "md5(b) AS c"]
    return ["--table", SMALL, "--target", TWIN]  # checksum


def run_submit_times(url: str, log_dir: Path) -> dict[str, list[float]]:
    """Seconds of each `reorg submit` per job type (REPEATS each), on one
    `reorg worker` with Spark started before the first."""
    execute(url, f"DROP TABLE IF EXISTS {SMALL}, {TWIN}",
            f"CREATE TABLE {SMALL} AS SELECT * FROM {TABLE} WHERE id <= {SMALL_ROWS}",
            f"ALTER TABLE {SMALL} ADD PRIMARY KEY (id)",
            f"CREATE TABLE {TWIN} AS SELECT * FROM {SMALL}",
            f"ALTER TABLE {TWIN} ADD PRIMARY KEY (id)",
            f"ANALYZE {SMALL}", f"ANALYZE {TWIN}")
    times: dict[str, list[float]] = {}
    print("  `reorg submit` wall time of every job type", flush=True)
    with running_worker(url, "bench-submit", log_dir, spark_warmup=True) as worker:
        wait_spark_ready(worker)
        for job_type in ("sql-update", "backfill", "copy", "checksum"):
            for attempt in range(REPEATS):
                with timed(f"reorg submit {job_type}") as lap:
                    done = reorg(url, "submit", job_type, *submit_arguments(job_type, attempt))
                times.setdefault(job_type, []).append(lap.seconds)
                wait_job(url, int(done.stdout.strip()))
    execute(url, f"DROP TABLE IF EXISTS {SMALL}, {TWIN}",
            *(f"DROP TABLE IF EXISTS bench.small_copy_{i}" for i in range(REPEATS)))
    return times


def median(seconds: list[float]) -> float:
    return statistics.median(seconds)
