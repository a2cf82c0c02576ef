"""Undoing a ``backfill`` through the real framework (DESIGN 8): a cancel puts
back every overwritten value exactly, whatever Spark would make of it, and a
failed job never drops a column it did not create."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from helpers import wait_until
from spark_helpers import TERMINAL, job_of, rows, scalar, wait_state

from backfill.backfill_job import register
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
