"""A job's rows/s over its life, for the dashboard's chart, from what the
system tables keep of its batches: each subtask's rows (``row_count``, the
sum of its committed batches) between its first claim (``started_at``) and
its last batch (``finished_at``, or ``updated_at`` while unfinished: its last
checkpoint or release).

No table keeps each batch's time (``job_progress_sample`` holds only the
last couple of minutes), so a subtask's rows are spread evenly over its
span: the chart is exact at the scale of one subtask's duration and smooths
anything shorter. A subtask paused half way spreads its rows over the pause
too. Forward steps only, as ``rows_per_sec`` of ``reorg status``.

One statement over live and history subtasks; the answer is one row per
bucket, whatever the size of the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from framework.db import SqlConnection, SqlDatabase
from framework.records import STEP_REVERT

# Shortest bucket: a job of a few seconds is drawn in half seconds, not in
# slivers of one.
MIN_BUCKET_SECONDS = 0.5


@dataclass(frozen=True)
class Throughput:
    """Rows done in each of ``len(rows)`` equal buckets from ``start``."""

    start: datetime
    bucket_seconds: float
    rows: list[float]

    @property
    def rows_per_sec(self) -> list[float]:
        return [r / self.bucket_seconds for r in self.rows]

    @property
    def seconds(self) -> float:
        return self.bucket_seconds * len(self.rows)


_SPANS = f"""
    SELECT CAST(extract(epoch FROM started_at - b.t0) AS float8) AS s,
           CAST(extract(epoch FROM coalesce(finished_at, updated_at) - b.t0) AS float8) AS e,
           row_count
    FROM {{s}}.TABLE, b
    WHERE job_id = :job_id AND step <> {STEP_REVERT} AND row_count > 0
      AND started_at IS NOT NULL"""


def of_job(db: SqlDatabase, conn: SqlConnection, job_id: int,
           buckets: int) -> Throughput | None:
    """The job's rows in up to ``buckets`` equal buckets from its start to
    its end (or now); None before it started."""
    span = conn.execute(
        db.sql("""
            SELECT started_at AS t0,
                   CAST(extract(epoch FROM coalesce(finished_at, clock_timestamp())
                                           - started_at) AS float8) AS seconds
            FROM {s}.jobs WHERE id = :job_id AND started_at IS NOT NULL"""),
        {"job_id": job_id},
    ).mappings().first()
    if span is None:
        return None
    # A short job gets fewer buckets, none shorter than MIN_BUCKET_SECONDS.
    seconds = max(float(span["seconds"]), MIN_BUCKET_SECONDS)
    buckets = max(1, min(buckets, math.floor(seconds / MIN_BUCKET_SECONDS)))
    width = seconds / buckets
    # The planner cannot tell how many buckets a subtask spans, guesses a
    # thousand, and compiles the statement (JIT): 0.7 s spent on a 0.2 s read.
    conn.execute(db.sql("SET LOCAL jit = off"))
    spans = " UNION ALL ".join(_SPANS.replace("TABLE", table)
                               for table in ("background_subtask", "background_subtask_history"))
    rows = conn.execute(
        db.sql(f"""
            WITH b AS (SELECT CAST(:t0 AS timestamptz) AS t0),
            st AS (SELECT s, greatest(e, s) AS e, row_count FROM ({spans}) x)
            SELECT g.i, sum(CASE WHEN st.e - st.s < 1e-6 THEN st.row_count
                                 ELSE st.row_count * (least(st.e, (g.i + 1) * :w)
                                                      - greatest(st.s, g.i * :w))
                                      / (st.e - st.s) END) AS rows
            FROM st CROSS JOIN LATERAL generate_series(
                greatest(floor(st.s / :w), 0)::int,
                least(floor(st.e / :w), :n - 1)::int) g(i)
            GROUP BY g.i"""),
        {"job_id": job_id, "t0": span["t0"], "w": width, "n": buckets},
    ).all()
    per_bucket = [0.0] * buckets
    for i, done in rows:
        per_bucket[i] += float(done)
    return Throughput(span["t0"], width, per_bucket)
