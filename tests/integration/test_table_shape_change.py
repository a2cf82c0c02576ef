"""A change of a table's shape (a column's type, by a reorg job or by anyone
with a plain ALTER TABLE) never fails the next batch of a job on that table.

A worker's pooled connections keep the statements psycopg prepared on them
(``prepare_threshold``); PostgreSQL refuses to run a prepared statement whose
result type the change altered ("cached plan must not change result type").
The job must re-plan on fresh connections and go on."""

from __future__ import annotations

import psycopg
import pytest
from support import rows, scalar, wait_history, wait_state

from framework import faults
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 3_000


def _make_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE o (id serial PRIMARY KEY, b text NOT NULL, n int);
            INSERT INTO o (b, n) SELECT 'v' || g, g FROM generate_series(1, {ROWS}) g;
            ANALYZE o""")


def _alter(column: str, type_: str) -> SubmitRequest:
    return SubmitRequest("alter-type", {"table": "o", "column": column, "type": type_},
                         rows_per_subtask=1000, batch_rows=100)


def _succeeded(db, job_id: int) -> None:
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", f"job {job_id}: {done['state']}: {done['error']}"


def _column_types(db) -> dict[str, str]:
    return dict(rows(db.engine, "SELECT attname, format_type(atttypid, atttypmod) "
                                "FROM pg_attribute WHERE attrelid = 'o'::regclass "
                                "AND attnum > 0 AND NOT attisdropped"))


def test_three_alter_types_in_a_row_on_the_same_workers_all_succeed(db, settings, start_node):
    _make_table(settings.database_url)
    before = rows(db.engine, "SELECT id, b, n FROM o ORDER BY id")
    start_node("n1", slots=2)
    for column, type_ in (("n", "bigint"), ("id", "bigint"), ("b", "varchar(200)")):
        _succeeded(db, submit(db, _alter(column, type_)).job_id)
    assert _column_types(db) == {"id": "bigint", "b": "character varying(200)", "n": "bigint"}
    assert rows(db.engine, "SELECT id, b, n FROM o ORDER BY id") == before


def test_a_plain_alter_table_by_someone_else_between_batches_does_not_fail_the_job(
        db, settings, start_node):
    _make_table(settings.database_url)
    before = rows(db.engine, "SELECT id, b, n FROM o ORDER BY id")
    # Held after its 8th batch: the slot's connection has run the batch's
    # statements more often than psycopg's prepare threshold (5).
    faults.arm("worker.after_batch", "block@8")
    job_id = submit(db, _alter("b", "varchar(200)")).job_id
    start_node("n1", slots=1)
    faults.wait_blocked("worker.after_batch")
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE o ALTER COLUMN id TYPE bigint")  # the application's team
    faults.release("worker.after_batch")
    _succeeded(db, job_id)
    assert _column_types(db) == {"id": "bigint", "b": "character varying(200)", "n": "integer"}
    assert rows(db.engine, "SELECT id, b, n FROM o ORDER BY id") == before
    # Nothing failed on the way: no attempt was spent on the shape change
    # (read once the subtasks are in the history, or it would count none).
    wait_history(db, job_id)
    assert scalar(db.engine, "SELECT count(*) FROM reorg.background_subtask_history "
                             "WHERE job_id = :j AND attempts > 1", j=job_id) == 0
