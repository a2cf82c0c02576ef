"""Undoing a ``backfill`` through the real framework (DESIGN 8): a cancel puts
back every overwritten value exactly, whatever Spark would make of it, and a
failed job never drops a column it did not create."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from support import TERMINAL, make_items, rows, scalar, snapshot, wait_state, wait_until
from support.spark import JobKind

from backfill.spark_backfill.batches import SubtaskRunner
from backfill.spark_backfill.job import BackfillJobType, merge_sql, register, spec_of
from framework import control, faults
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark

ROWS = 1_200


@pytest.fixture(autouse=True)
def _registered_and_no_faults():
    register()
    faults.disarm_all()
    yield
    faults.disarm_all()


# Old values Spark's JDBC types cannot carry exactly: unconstrained numeric is
# decimal(38,18) there (digits cut after 18 places, above 20 integer digits
# the read fails), floats and microsecond timestamps with time zone must stay
# bit- and microsecond-exact.
VALUES = {
    "n": ("numeric", "n=0", """CASE id % 4 WHEN 0 THEN 1/3::numeric + id
                                          WHEN 1 THEN ('0.' || repeat('1234567890', 4) || id)::numeric
                                          WHEN 2 THEN -id / 7::numeric * 1e-25
                                          ELSE NULL END"""),
    "big": ("numeric", "big=0", "CASE WHEN id % 3 = 0 THEN pi()::numeric * 1e30 + id END"),
    "ts": ("timestamp with time zone", "ts=timestamp'2000-01-01 00:00:00'",
           "'2001-02-03 04:05:06.789123+05:30'::timestamptz + id * interval '1.000001 s'"),
    "f": ("double precision", "f=0", "CASE id % 2 WHEN 0 THEN pi() * id / 7 ELSE 4e-320 * id END"),
}


@pytest.mark.parametrize("column", list(VALUES))
def test_cancel_restores_values_spark_cannot_carry_exactly(spark, db, start_node, column):
    pg_type, assignment, value = VALUES[column]
    with db.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE vals (id bigint PRIMARY KEY, {column} {pg_type})"))
        conn.execute(sa.text(f"INSERT INTO vals SELECT g, NULL FROM generate_series(1, {ROWS}) g"))
        conn.execute(sa.text(f"UPDATE vals SET {column} = {value}"))
        conn.execute(sa.text("ANALYZE vals"))
    before = rows(db, f"SELECT id, {column}::text FROM vals ORDER BY id")
    job_id = submit(db, SubmitRequest("backfill", {"table": "vals", "set": assignment},
                                      rows_per_subtask=300, batch_rows=50,
                                      concurrency=2)).job_id
    # Every batch lingers before its commit, so the cancel lands mid-run.
    faults.arm("worker.after_checkpoint", "sleep:0.3")
    start_node("n1", slots=2)
    new = "ts < '2001-01-01'" if column == "ts" else f"{column} = 0"  # never an old value
    wait_until(lambda: scalar(db, f"SELECT count(*) FROM vals WHERE {new}") > 0, 90,
               "a committed batch")
    control.cancel(db, job_id)
    final = wait_state(db, job_id, TERMINAL)
    assert final["state"] == "cancelled", final
    assert 0 < final["rows_done"] < ROWS, final  # caught mid-run
    after = rows(db, f"SELECT id, {column}::text FROM vals ORDER BY id")
    assert [a for a, b in zip(after, before, strict=True) if a != b] == []


def test_a_write_the_merge_waits_for_is_recomputed_and_imaged_as_written(
        spark, target_db, monkeypatch):
    """READ COMMITTED re-check (EvalPlanQual): a writer changes rows after Spark
    read them and commits only once the merge statement waits for its row
    locks. The merge must skip those rows and recompute them, and their
    before-images must be the writer's values (what the job overwrote), so a
    rollback gives the application its write back."""
    make_items(target_db, 1_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'orig ' || id"))
    backfill = JobKind(BackfillJobType(), SubtaskRunner, spec_of)
    job = backfill.submit(target_db, 120, {"table": "items", "set": "c=md5(b)"},
                          batch_rows=10_000)
    writer = sa.create_engine(target_db.url)
    written, done = threading.Event(), threading.Event()

    def write_until_the_merge_waits() -> None:
        with writer.begin() as conn:
            conn.execute(sa.text("UPDATE items SET b = b || '+', c = 'app ' || id "
                                 "WHERE id % 7 = 0"))
            written.set()
            wait_until(lambda: scalar(target_db, """
                SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
                AND query LIKE 'WITH applied AS (UPDATE%'""") > 0, 30, "the merge to wait")
        done.set()

    real_read = SubtaskRunner._read

    def read_then_write(self, lo, n):
        batches = real_read(self, lo, n)
        threading.Thread(target=write_until_the_merge_waits, daemon=True).start()
        assert written.wait(30)  # uncommitted, so the merge's snapshot still sees Spark's read
        return batches

    monkeypatch.setattr(SubtaskRunner, "_read", read_then_write)
    runner = backfill.run_range(target_db, job, 1, 1, 1_001)
    writer.dispose()
    assert done.is_set()
    assert [s.recomputed for s in runner.stats] == [1_000 // 7]
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
    images = rows(target_db, f"SELECT k, old FROM {merge_sql(job).images} WHERE k % 7 = 0 "
                             "ORDER BY k")
    assert images == [(k, f"app {k}") for k in range(7, 1_001, 7)]
    before = snapshot(target_db)
    backfill.rollback(target_db, job)
    assert snapshot(target_db) == [
        (i, a, b, f"app {i}" if i % 7 == 0 else f"orig {i}") for i, a, b, _ in before]


def test_a_column_added_by_hand_after_submit_fails_the_job_and_stays(spark, db, start_node):
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items (id bigint PRIMARY KEY, a int, b text)"))
        conn.execute(sa.text("INSERT INTO items SELECT g, g, 'v' || g FROM generate_series(1, 500) g"))
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "d=a * 2",
                                                   "add_column": "d:bigint"},
                                      rows_per_subtask=200, batch_rows=100)).job_id
    with db.begin() as conn:  # someone adds the column, with data, before the owner prepares
        conn.execute(sa.text("ALTER TABLE items ADD COLUMN d bigint"))
        conn.execute(sa.text("UPDATE items SET d = -id"))
    before = rows(db, "SELECT * FROM items ORDER BY id")
    start_node("n1", slots=2)
    final = wait_state(db, job_id, TERMINAL)
    assert final["state"] in ("failed", "reverted"), final
    assert "d already exists" in (final["error"] or ""), final
    assert "--add-column" in final["error"], final
    assert rows(db, "SELECT * FROM items ORDER BY id") == before
    assert final["rows_done"] == 0
