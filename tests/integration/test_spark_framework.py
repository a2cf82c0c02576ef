"""``backfill`` through the real framework: submit, in-process nodes with
worker slots running subtasks on the shared SparkSession, advance, cancel and
rollback, pause and resume."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import (
    TERMINAL,
    job_of,
    make_items,
    scalar,
    table_rows,
    wait_history,
    wait_state,
    wait_until,
)

from backfill.spark.jdbc import SPARK_APPLICATION_NAME
from backfill.spark_backfill.job import register
from framework import control, faults
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _registered():
    register()



def test_backfill_job_succeeds_on_two_slots_and_drops_its_work_tables(spark, db, start_node):
    make_items(db, 20_000, step=3)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old' WHERE id % 4 = 0"))
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=5_000, batch_rows=1_000)).job_id
    start_node("n1", slots=2)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
    assert scalar(db, "SELECT to_regclass(:t)", t=f"reorg.backfill_{job_id}_images") is None
    wait_history(db, job_id)
    assert scalar(db, "SELECT sum(row_count) FROM {s}.background_subtask_history "
                      "WHERE job_id = :j", j=job_id) == 20_000


def test_cancel_mid_run_restores_the_table(spark, db, start_node):
    make_items(db, 20_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old-' || id WHERE id % 2 = 0"))
    before = table_rows(db)
    faults.arm("worker.after_batch", "block")  # each slot stops after its first batch
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=2_000, batch_rows=200,
                                      concurrency=2)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 60, count=2)
    assert job_of(db, job_id)["rows_done"] > 0
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    assert wait_state(db, job_id, TERMINAL)["state"] == "cancelled"
    assert table_rows(db) == before


def test_add_column_job_pauses_resumes_and_finishes(spark, db, start_node):
    make_items(db, 10_000)
    faults.enable_signals()
    faults.arm("worker.after_batch", "block")  # each slot stops after its first batch
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "d=a * 2",
                                                   "add_column": "d:bigint"},
                                      rows_per_subtask=2_000, batch_rows=200,
                                      concurrency=2)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 60, count=2)
    assert job_of(db, job_id)["rows_done"] > 0
    control.pause(db, job_id)
    faults.wait("subtask.stop", 60), faults.wait("subtask.stop", 60)  # both slots told
    faults.release("worker.after_batch")
    wait_state(db, job_id, {"paused"}, 60)
    control.resume(db, job_id)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM a * 2") == 0


def test_dropped_jdbc_connections_mid_read_are_retried_not_failed(spark, db, start_node):
    """The database drops Spark's connections while it reads a batch (as a
    restart or failover would): the subtask is retried from its checkpoint,
    the job succeeds and every row is right, none twice."""
    make_items(db, 6_000)
    # pg_sleep in the pushed-down predicate makes each read last long enough
    # to be caught in flight: 1,000 rows take about 0.5 s.
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=md5(b)",
                                                   "where": "pg_sleep(0.0005) IS NOT NULL"},
                                      rows_per_subtask=3_000, batch_rows=1_000)).job_id
    dropped = 0
    start_node("n1", slots=2, retry_backoff_seconds=0.2)

    def drop_spark_reads() -> bool:
        nonlocal dropped
        dropped += scalar(db, """
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE pid <> pg_backend_pid() AND datname = current_database()
              AND state = 'active' AND query LIKE '%pg_sleep(0.0005)%'
              AND application_name = :spark""", spark=SPARK_APPLICATION_NAME)
        return dropped >= 2

    wait_until(drop_spark_reads, 60, "two Spark reads caught in flight", interval=0.05)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
    wait_history(db, job_id)
    assert scalar(db, "SELECT sum(row_count) FROM {s}.background_subtask_history "
                      "WHERE job_id = :j", j=job_id) == 6_000
    assert scalar(db, "SELECT max(attempts) FROM {s}.background_subtask_history "
                      "WHERE job_id = :j", j=job_id) >= 2
