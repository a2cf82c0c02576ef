"""The throttles' statements on a real PostgreSQL: the job's shared rate
schedule (``jobs.reserve_rate``), the health reading (``health.read``), and
the "throttled" note as ``reorg status`` shows it."""

from __future__ import annotations

import psycopg
import pytest
from support import execute, fill, make_items

from framework import control
from framework.store import health, jobs
from framework.submit import submit


def _job(db, table: str = "items", **knobs) -> int:  # type: ignore[no-untyped-def]
    make_items(db, 10, table=table)
    return submit(db, fill("md5(b)", table=table, **knobs)).job_id


def _book(db, job_id: int, rows: int, took: float = 0.0) -> float | None:  # type: ignore[no-untyped-def]
    with db.connect(isolation_level="AUTOCOMMIT") as conn:
        return jobs.reserve_rate(db, conn, job_id, rows, took)


def test_batches_booked_at_once_take_turns_on_the_jobs_schedule(db, migrated_db):
    """Four slots (on any nodes) booking 100 rows each at 1,000 rows/s wait
    0.1, 0.2, 0.3, 0.4 s: together they deliver the job's limit."""
    job_id = _job(db, max_rows_per_sec=1_000)
    waits = [_book(db, job_id, 100) for _ in range(4)]
    for i, wait in enumerate(waits, start=1):
        assert wait == pytest.approx(0.1 * i, abs=0.05)
    # A batch's own time counts: booked from when it started, so a slot that
    # took its whole share already has nothing left to wait for its turn
    # beyond the others'.
    job_b = _job(db, "items_b", max_rows_per_sec=1_000)
    assert _book(db, job_b, 100, took=0.1) == pytest.approx(0.0, abs=0.05)
    # No credit saved for a burst: a schedule in the past starts from now.
    execute(migrated_db,
            f"UPDATE reorg.jobs SET rate_due_at = now() - interval '1 hour' WHERE id = {job_b}")
    assert _book(db, job_b, 100) == pytest.approx(0.1, abs=0.05)
    # A booking given back (a first batch booked ahead and not used) moves
    # the schedule back, but never before now: no credit for a burst.
    assert _book(db, job_b, 300) == pytest.approx(0.4, abs=0.05)
    assert _book(db, job_b, -200) == pytest.approx(0.2, abs=0.05)
    assert _book(db, job_b, -10_000) == pytest.approx(0.0, abs=0.05)
    assert _book(db, job_b, 100) == pytest.approx(0.1, abs=0.05)
    # A job without a limit (or whose limit `reorg alter` lifted) books nothing.
    assert _book(db, _job(db, "items_c"), 100) is None
    control.alter(db, job_id, max_rows_per_sec=0, actor="t")
    assert _book(db, job_id, 100) is None


def test_a_new_limit_re_times_what_was_booked_at_the_old_one(db, migrated_db):
    """``reorg alter --max-rows-per-sec``: the rows booked and not yet due
    are due as if booked at the new limit; lifted, nothing is left to wait.
    (Seconds of schedule, so the statements' own time hardly counts.)"""
    job_id = _job(db, max_rows_per_sec=100)
    assert [_book(db, job_id, 1_000) for _ in range(4)][-1] == pytest.approx(40, abs=1)
    control.alter(db, job_id, max_rows_per_sec=400, actor="t")
    assert _book(db, job_id, 0) == pytest.approx(10, abs=1)
    control.alter(db, job_id, max_rows_per_sec=100, actor="t")  # lowered: longer again
    assert _book(db, job_id, 0) == pytest.approx(40, abs=1)
    control.alter(db, job_id, batch_rows=50, actor="t")  # another knob: the schedule stays
    assert _book(db, job_id, 0) == pytest.approx(40, abs=1)
    control.alter(db, job_id, max_rows_per_sec=0, actor="t")
    control.alter(db, job_id, max_rows_per_sec=100, actor="t")  # a fresh schedule
    assert _book(db, job_id, 100) == pytest.approx(1, abs=0.5)


def test_a_batch_nobody_gave_follows_the_limit_at_alter_as_at_submit(db, migrated_db):
    """Submitted without --batch-rows, a job's batch is its type's default, at
    most one second of its rate limit; ``reorg alter --max-rows-per-sec``
    resizes it by the same rule (lifted: the default again) and says so, in
    its answer and in the job's events, until a batch size is given, which is
    kept from then on, as one given at submit is."""
    job_id = _job(db)

    def batch(job: int = job_id) -> int:
        return control.status(db, job)[0]["batch_rows"]

    assert batch() == 10_000
    assert control.alter(db, job_id, max_rows_per_sec=30, actor="t") == (
        "max_rows_per_sec=30, batch_rows=30 (none given: the type's default, at most one "
        "second of the limit)")
    assert batch() == 30
    for limit, rows in ((50_000, 10_000), (40, 40), (0, 10_000), (25, 25)):
        control.alter(db, job_id, max_rows_per_sec=limit, actor="t")
        assert batch() == rows, limit
    assert control.alter(db, job_id, batch_rows=500, actor="t") == "batch_rows=500"
    assert control.alter(db, job_id, max_rows_per_sec=20, actor="t") == "max_rows_per_sec=20"
    assert batch() == 500  # given: kept
    assert [e["detail"] for e in control.events(db, job_id) if e["detail"]][-3:] == [
        "altered: max_rows_per_sec=25, batch_rows=25", "altered: batch_rows=500",
        "altered: max_rows_per_sec=20"]
    given = _job(db, "items_b", batch_rows=700)
    control.alter(db, given, max_rows_per_sec=10, actor="t")
    assert batch(given) == 700


def test_the_health_reading_leaves_reorgs_own_sessions_out(db, migrated_db):
    with db.begin() as conn:
        first = health.read(conn)
    assert first.standbys == () and first.wal_pos is not None
    with psycopg.connect(migrated_db, autocommit=True) as app, \
            psycopg.connect(migrated_db + "?application_name=reorg-worker",
                            autocommit=True) as ours:
        for conn in (app, ours):  # both busy with a statement of their own, not idle
            conn.execute("SELECT pg_sleep(0)")
        app_pid = app.info.backend_pid
        with db.begin() as conn:
            seen = conn.execute(db.sql(
                "SELECT state, application_name FROM pg_stat_activity WHERE pid = :p"),
                {"p": app_pid}).one()
            assert seen.state == "idle"  # idle sessions never count
            assert health.read(conn).active_sessions == first.active_sessions


def test_status_shows_a_fresh_throttled_note_of_a_running_job_only(db, migrated_db):
    job_id = _job(db, max_active_sessions=1)
    with db.begin() as conn:
        jobs.note_throttled(db, conn, job_id, "active sessions 3 > 1")
    assert control.status(db, job_id)[0]["throttled"] is None  # still queued
    execute(migrated_db,
            f"UPDATE reorg.jobs SET state = 'running' WHERE id = {job_id}")
    job = control.status(db, job_id)[0]
    assert (job["throttled"], job["max_active_sessions"]) == ("active sessions 3 > 1", 1)
    execute(migrated_db,
            f"UPDATE reorg.jobs SET throttled_at = now() - interval '1 hour' WHERE id = {job_id}")
    assert control.status(db, job_id)[0]["throttled"] is None  # no worker refreshed it: stale
    with db.begin() as conn:
        jobs.note_throttled(db, conn, job_id, None)
    assert execute(migrated_db,
                   f"SELECT throttled, throttled_at FROM reorg.jobs WHERE id = {job_id}"
                   ) == [(None, None)]
