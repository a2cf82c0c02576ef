"""The framework's hot statements at scale: with 100,000 subtasks in one job
and 100,000 in history, every statement a worker runs per subtask, the owner
runs per tick, and ``reorg status`` runs, plans without a sequential scan of
the subtask tables (issue 12). The statements are the real ones, captured as
the store functions run them, then EXPLAINed with the same parameters."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import statements_sent

from backfill.before_images import BeforeImages
from framework.keys import KeySpec
from framework.records import STEP_REVERT
from framework.store import history, owner_lease, progress, steps, subtasks
from framework.store.subtasks import Claim

JOB = 42


@pytest.fixture
def big_job(db):
    with db.begin() as conn:
        conn.execute(db.sql("""
            INSERT INTO {s}.jobs (id, type, params, target_table, key_column, state, step,
                                  subtasks_total, concurrency)
            OVERRIDING SYSTEM VALUE
            SELECT g, 't', '{}', 'x' || g, 'id',
                   CASE WHEN g = 42 THEN 'running' ELSE 'succeeded' END, 1,
                   CASE WHEN g = 42 THEN 100000 ELSE 1000 END, 16
            FROM generate_series(1, 100) g"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask
                (job_id, step, ordinal, state, start_key, end_key, curr_key, exec_id,
                 exec_expired, epoch, attempts)
            SELECT 42, 1, g, CASE WHEN g <= 2000 THEN 'succeeded'
                                  WHEN g <= 2016 THEN 'running' ELSE 'pending' END,
                   to_jsonb(g * 10), to_jsonb(g * 10 + 10),
                   to_jsonb(CASE WHEN g <= 2000 THEN g * 10 + 10 ELSE g * 10 END),
                   CASE WHEN g BETWEEN 2001 AND 2016 THEN 'w' || g % 4 END,
                   CASE WHEN g BETWEEN 2001 AND 2016
                        THEN clock_timestamp() + interval '30s' END,
                   CASE WHEN g <= 2016 THEN 1 ELSE 0 END, CASE WHEN g <= 2016 THEN 1 ELSE 0 END
            FROM generate_series(1, 100000) g"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask_history
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key)
            SELECT g, 1 + g % 100, 1, g, 'succeeded', to_jsonb(g * 10), to_jsonb(g * 10 + 10),
                   to_jsonb(g * 10 + 10)
            FROM generate_series(1000001, 1100000) g"""))
        # The rest of a big split, a chunk of which the owner inserts per tick.
        conn.execute(db.sql("""
            INSERT INTO {s}.job_split_pending (job_id, step, los, his, inserted, meta)
            SELECT 42, 1, array_agg(to_jsonb(g * 10) ORDER BY g),
                   array_agg(to_jsonb(g * 10 + 10) ORDER BY g),
                   100001, '{}'
            FROM generate_series(0, 100010) g"""))
        for table in ("jobs", "background_subtask", "background_subtask_history"):
            conn.execute(db.sql(f"ANALYZE {{s}}.{table}"))
    return db


def _plans(db, statements) -> list[str]:
    plans = []
    with db.connect() as conn:
        raw = conn.connection.driver_connection
        for statement, parameters in statements:
            with raw.cursor() as cur:
                cur.execute(f"EXPLAIN {statement}", parameters)
                plans.append("\n".join(r[0] for r in cur.fetchall()))
        raw.rollback()
    return plans


def test_no_hot_statement_scans_the_subtask_tables(big_job):
    db = big_job
    with db.begin() as conn:
        term = owner_lease.campaign(db, conn, "o")
    held = Claim(id=2001, job_id=JOB, start_key=20010, end_key=20020, curr_key=20010, epoch=1,
                 attempts=1, meta={}, exec_id="w1", job=None)  # type: ignore[arg-type]

    def hot(conn):
        subtasks.claim(db, conn, "w9", limit=4)
        subtasks.renew(db, conn, [held])
        subtasks.checkpoint(db, conn, [subtasks.BatchDone(held, 20015, 5)], count_running=True)
        steps.step_snapshot(db, conn, JOB, 1)
        steps.step_snapshot(db, conn, JOB, 1, from_mark=True)
        steps.mark_claim_from(db, conn, term, JOB, 1)
        steps.mark_claim_from(db, conn, term, JOB, 1, from_mark=True)
        steps.fail_exhausted(db, conn, term, JOB, 5)
        steps.insert_split_chunk(db, conn, term, JOB, 10_000)
        steps.split_pending(db, conn, JOB)
        # The owner's tick over a reverting job (DESIGN 13).
        steps.step_snapshot(db, conn, JOB, STEP_REVERT)
        steps.retry_exhausted_reverts(db, conn, term, JOB, 5, 30.0)
        steps.revert_error(db, conn, JOB)
        steps.last_range(db, conn, JOB, 1)
        steps.succeeded_beyond(db, conn, JOB, 5_000)
        history.move_finished(db, conn, term, JOB, 1000, only_succeeded=True)
        history.jobs_awaiting_history(db, conn, 10)
        history.delete_older_than(db, conn, term, 30, 1000)
        progress.jobs_progress(db, conn, JOB)
        progress.jobs_progress(db, conn)
        progress.record_samples(db, conn, progress.live_jobs_progress(db, conn, []))

    statements = statements_sent(db, hot)
    assert len(statements) >= 13
    for (statement, _), plan in zip(statements, _plans(db, statements), strict=True):
        for table in ("background_subtask", "background_subtask_history"):
            assert f"Seq Scan on {table} " not in plan + " ", f"{statement}\n{plan}"


def test_status_counts_a_100k_subtask_job_without_reading_its_pending_subtasks(big_job):
    db = big_job
    with db.begin() as conn:
        job = progress.jobs_progress(db, conn, JOB)[0]
    assert (job["pending"], job["running"], job["succeeded"]) == (97_984, 16, 2_000)
    assert job["rows_done"] == 0  # the rows were written without row counts


def test_a_restore_batch_reads_the_images_and_the_table_through_indexes(db):
    """A revert subtask's restore batch (DESIGN 13) at 100,000 images: index
    probes of the images, the batch records and the table, never a scan of
    any of them (the revert plan's indexes)."""
    kept = BeforeImages('"public"."imgs"', '"public"."bats"', KeySpec(("id",), ("bigint",)))
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items (id bigint PRIMARY KEY, c text)"))
        conn.execute(sa.text("INSERT INTO items SELECT g, 'new' FROM generate_series(1, 100000) g"))
        for stmt in kept.create("text"):
            conn.execute(sa.text(stmt))
        conn.execute(sa.text("INSERT INTO imgs SELECT g, 'old', '100'::xid8 "
                             "FROM generate_series(1, 100000) g WHERE g % 3 <> 0"))
        conn.execute(sa.text("INSERT INTO bats SELECT g / 100, g, g + 100, '100'::xid8 "
                             "FROM generate_series(1, 100000, 100) g"))
        for stmt in kept.index_for_restore():
            conn.execute(sa.text(stmt))
        for table in ("items", "imgs", "bats"):
            conn.execute(sa.text(f"ANALYZE {table}"))
    # In the driver's placeholder style, as ``statements_sent`` would hand them over.
    statements = [(stmt.replace(":lo", "%(lo)s").replace(":hi", "%(hi)s"),
                   {"lo": 50_050, "hi": 50_550})
                  for stmt in kept.restore_range('"public"."items" t', "t", "c")]
    for (statement, _), plan in zip(statements, _plans(db, statements), strict=True):
        for table in ("items", "imgs", "bats"):
            assert f"Seq Scan on {table} " not in plan + " ", f"{statement}\n{plan}"
