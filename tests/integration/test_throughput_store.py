"""A job's rows/s over its life (``framework.store.throughput``, the
dashboard's chart), against subtasks whose times and rows are known: each
subtask's rows spread over its span, live and moved to history alike, revert
subtasks and unstarted ones left out."""

from __future__ import annotations

import pytest
from support import execute, fill, make_items

from framework.db import Database
from framework.store import throughput
from framework.submit import submit

T0 = "2026-11-27 12:00:00+00"


def _subtask(db: Database, job: int, table: str, ordinal: int, *, step: int = 1,
             start: float | None, end: float | None, rows: int, updated: float | None = None,
             state: str = "succeeded") -> None:
    """A subtask of ``rows`` rows from T0 + ``start`` s to T0 + ``end`` s
    (its finish; None: unfinished, its last batch at T0 + ``updated`` s)."""
    execute(db, f"""
        INSERT INTO reorg.{table} (id, job_id, step, ordinal, state, start_key, end_key,
                                   curr_key, row_count, started_at, finished_at, updated_at)
        VALUES (nextval('reorg.subtask_id_seq'), :j, :step, :o, :state, '0', '10', '10', :rows,
                CAST(:t0 AS timestamptz) + make_interval(secs => CAST(:start AS float8)),
                CAST(:t0 AS timestamptz) + make_interval(secs => CAST(:end AS float8)),
                CAST(:t0 AS timestamptz) + make_interval(secs => CAST(:upd AS float8)))""",
            {"j": job, "step": step, "o": ordinal, "state": state, "rows": rows, "t0": T0,
             "start": start, "end": end, "upd": updated if updated is not None else end or 0})


def _job(db: Database, seconds: float | None, table: str = "items") -> int:
    """A job that started at T0 and ran ``seconds`` s (None: not started)."""
    make_items(db, 10, table=table)
    job = submit(db, fill("md5(b)", table=table)).job_id
    assert job is not None
    if seconds is not None:
        execute(db, "UPDATE reorg.jobs SET started_at = CAST(:t0 AS timestamptz), "
                    "finished_at = CAST(:t0 AS timestamptz) + make_interval(secs => :s) "
                    "WHERE id = :j", {"t0": T0, "s": seconds, "j": job})
    return job


def _of(db: Database, job: int, buckets: int) -> throughput.Throughput | None:
    with db.begin() as conn:
        return throughput.of_job(db, conn, job, buckets)


def test_each_subtasks_rows_are_spread_over_its_span(db: Database) -> None:
    job = _job(db, 10)
    history = "background_subtask_history"
    _subtask(db, job, history, 0, start=0, end=4, rows=400)  # 200 in each of buckets 0, 1
    _subtask(db, job, history, 1, start=3, end=5, rows=100)  # 50 in bucket 1, 50 in 2
    _subtask(db, job, "background_subtask", 2, start=7, end=7, rows=30)  # no length: bucket 3
    # Running: its rows so far, up to its last batch.
    _subtask(db, job, "background_subtask", 3, start=8, end=None, updated=10, rows=60,
             state="running")
    _subtask(db, job, "background_subtask", 4, start=None, end=None, rows=0, state="pending")
    _subtask(db, job, "background_subtask", 0, step=-1, start=0, end=10, rows=1_000)  # a revert
    series = _of(db, job, 5)
    assert series is not None and series.bucket_seconds == 2.0
    assert series.rows == pytest.approx([200, 250, 50, 30, 60])
    assert series.rows_per_sec == pytest.approx([100, 125, 25, 15, 30])
    assert series.seconds == 10 and series.start.isoformat() == "2026-11-27T12:00:00+00:00"


def test_a_short_job_gets_fewer_buckets_and_one_not_started_none(db: Database) -> None:
    short = _job(db, 1.2)
    _subtask(db, short, "background_subtask_history", 0, start=0, end=1.2, rows=120)
    series = _of(db, short, 60)
    assert series is not None and len(series.rows) == 2  # half a second at least each
    assert series.rows == pytest.approx([60, 60]) and series.bucket_seconds == pytest.approx(0.6)
    assert _of(db, _job(db, None, table="queued"), 60) is None
