"""The Spark job types' per-worker start-up (``JobType.warm_up``).

A worker starts Spark only when a job type that needs it is about to run a
subtask, or analyse a job's input, on it: a worker that only runs
``sql-update`` never starts a JVM. The first start also builds, once per
host, the class-data archive later JVMs start from (``backfill.spark.cds``).
"""

from __future__ import annotations

import logging
import threading

from framework.errors import one_line

log = logging.getLogger("reorg.spark")

_archive_checked = threading.Event()


def start_worker_spark() -> None:
    """The process's SparkSession, started unless it runs (seconds, once)."""
    from backfill.spark import cds, session

    session.get_spark()
    if _archive_checked.is_set():
        return
    _archive_checked.set()
    try:
        cds.ensure_in_background(session.cds_archive(), session.settings_environ())
    except Exception as exc:  # only a speed-up: never fail a subtask for it
        log.warning("not building a Spark class-data archive: %s", one_line(exc))


# One row of the column types a job's sample most often has: what a first
# analysis reads (JDBC), analyses, computes and collects as Arrow.
_WARM_ROW = ("(SELECT 1::bigint AS id, 'x'::text AS b, 1.5::numeric(10,2) AS n, "
             "now() AS t, true AS f) reorg_warm")


def warm_analysis(database_url: str) -> None:
    """Run once what a job's analysis runs, on a made-up row: a JDBC read, an
    expression analysed, computed and collected as Arrow. The JVM loads and
    compiles those paths now, while the worker is idle, instead of in the
    first submit's wait."""
    # The functions module too, which a first analysis would import.
    from pyspark.sql import functions as F

    from backfill.spark import session
    from backfill.spark.jdbc import jdbc_target

    jdbc = jdbc_target(database_url)
    rows = session.get_spark().read.jdbc(jdbc.url, _WARM_ROW, properties=jdbc.read_props())
    rows = rows.withColumn("e", F.expr("CAST(n AS string)"))
    rows.selectExpr("id", "md5(b) AS c", "upper(b) || CAST(id AS string) AS d", "e").toArrow()
