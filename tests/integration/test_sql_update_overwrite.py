"""sql-update overwriting a column takes its before-images without row locks
(``UpdateSql.update``): a row an application changes while a batch's
statement runs is skipped by it and done by the locked fallback, so its value
is computed from the application's version (DESIGN 9) and its image is that
version, which a rollback puts back (DESIGN 8)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import TERMINAL, wait_state, wait_until

from framework import faults
from framework.submit import SubmitRequest, submit

ROW = 5  # in the first batch of the first subtask
APP_VALUE = 1000


def run(db, sql, **params):
    with db.begin() as conn:
        return conn.execute(sa.text(sql), params)


def batch_waits_on_row_lock(db) -> bool:
    """A backend runs the batch's lock-free statement and waits for a row lock."""
    return bool(run(db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%reorg_read%'").scalar())


@pytest.mark.parametrize("outcome", ["succeeded", "reverted"])
def test_a_row_changed_while_the_batch_statement_runs_is_computed_and_imaged_from_the_new_version(
        db, start_node, outcome):
    run(db, "CREATE TABLE g (id bigint PRIMARY KEY, v bigint)")
    run(db, "INSERT INTO g SELECT i, i FROM generate_series(1, 3000) i")
    if outcome == "reverted":
        faults.arm("worker.before_checkpoint", "raise@4")  # fails the job after batch 3
    app = db.engine.connect()
    try:
        app_tx = app.begin()
        # The application holds the row (uncommitted) when the batch reads it:
        # the statement's snapshot has the old version, its update must wait.
        app.execute(sa.text("UPDATE g SET v = :v WHERE id = :id"), {"v": APP_VALUE, "id": ROW})
        job_id = submit(db, SubmitRequest("sql-update", {"table": "g", "set": "v=v*2"},
                                          rows_per_subtask=1_000, batch_rows=100)).job_id
        start_node("n1", slots=1)
        wait_until(lambda: batch_waits_on_row_lock(db), 60, "the batch waiting on the app's row")
        app_tx.commit()
    finally:
        app.close()
    assert wait_state(db, job_id, TERMINAL, 60)["state"] == outcome
    values = dict(run(db, "SELECT id, v FROM g").all())
    if outcome == "succeeded":
        # DESIGN 9: computed from the application's value, not from the
        # version the statement's snapshot saw (ROW * 2).
        assert values.pop(ROW) == APP_VALUE * 2
        assert values == {i: i * 2 for i in range(1, 3001) if i != ROW}
    else:
        # DESIGN 8: the image is the application's value, not the stale ROW.
        assert values.pop(ROW) == APP_VALUE
        assert values == {i: i for i in range(1, 3001) if i != ROW}
