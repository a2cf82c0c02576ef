"""``reorg status`` rows/s and ETA are over the recent window (the owner's
progress samples), not the job's lifetime average."""

from __future__ import annotations

import pytest
from support import scalar, started_fill

from framework import control
from framework.store import progress
from framework.worker import WorkerPool


@pytest.fixture
def job_an_hour_old(db) -> int:
    """Three 10-row ranges; started an hour ago; one range done just now."""
    job_id, _ = started_fill(db, 3, expr="'x' || b", prepared=True)
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET started_at = clock_timestamp() - "
                            "interval '1 hour' WHERE id = :j"), {"j": job_id})
    assert WorkerPool(db, "w1", slots=1).run_one()
    return job_id


def _sample(db, job_id: int, seconds_ago: float, rows_done: int) -> None:
    with db.begin() as conn:
        conn.execute(db.sql("""INSERT INTO {s}.job_progress_sample (job_id, at, rows_done)
                               VALUES (:j, clock_timestamp() - make_interval(secs => :ago), :r)"""),
                     {"j": job_id, "ago": seconds_ago, "r": rows_done})


def test_without_samples_the_rate_is_the_lifetime_average(db, job_an_hour_old):
    job = control.status(db, job_an_hour_old)[0]
    assert job["rows_done"] == 10
    assert job["rows_per_sec"] == pytest.approx(10 / 3600, abs=0.05)


def test_rows_per_sec_and_eta_come_from_the_oldest_sample_in_the_window(db, job_an_hour_old):
    job_id = job_an_hour_old
    _sample(db, job_id, 3 * progress.RATE_WINDOW_SECONDS, 0)  # too old: ignored
    _sample(db, job_id, 20, 0)  # the 10 rows were done in the last 20 s
    _sample(db, job_id, 10, 5)
    job = control.status(db, job_id)[0]
    assert job["rows_per_sec"] == pytest.approx(10 / 20, rel=0.1)
    assert job["eta_seconds"] == pytest.approx(20 / (10 / 20), rel=0.1)


def test_the_owner_keeps_one_sample_every_few_seconds_and_drops_old_ones(db, job_an_hour_old):
    job_id = job_an_hour_old
    _sample(db, job_id, 3 * progress.RATE_WINDOW_SECONDS, 0)
    for _ in range(3):  # three owner ticks in a row
        with db.begin() as conn:
            shown = progress.live_jobs_progress(db, conn, [])
            progress.record_samples(db, conn, shown)
    samples = scalar(db.engine, f"SELECT array_agg(rows_done) FROM {db.schema}"
                                ".job_progress_sample WHERE job_id = :j", j=job_id)
    assert samples == [10]
