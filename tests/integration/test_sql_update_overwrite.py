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


# --- batches whose old values are all NULL (UpdateSql.only_null_old) ---------

def _statements_run(captured: list[tuple[str, object]]):
    """A listener recording (kind, lo) of every batch statement the worker
    sends: 'guard' (the bare UPDATE of the rows whose old value is NULL, with
    or without a probe first), 'images' (the statement keeping before-images),
    'locked' (the locked fallback)."""
    def before(conn, cursor, statement, parameters, context, executemany):
        bare_guard = statement.startswith("UPDATE") and "num_nulls(" in statement
        kind = ("guard" if "reorg_probe" in statement or bare_guard else
                "images" if "reorg_tid" in statement else
                "locked" if "FOR UPDATE OF" in statement and "reorg_locked" in statement else None)
        if kind:
            lo = parameters.get("lo") if isinstance(parameters, dict) else None
            captured.append((kind, lo))
    return before


@pytest.mark.parametrize("outcome", ["succeeded", "reverted"])
def test_a_batch_of_null_old_values_runs_the_guarded_bare_update_and_a_rollback_restores_all(
        db, start_node, outcome):
    """Keys 1-1000 hold NULL (no image needed: the guarded bare UPDATE),
    1001-2000 a value each (the image statement), 2001-3000 NULL on even keys
    (the guard finds a value and falls back to the image statement for the
    batch). The rollback puts back every value and every NULL exactly."""
    run(db, "CREATE TABLE g (id bigint PRIMARY KEY, v bigint)")
    run(db, "INSERT INTO g SELECT i, CASE WHEN i <= 1000 OR (i > 2000 AND i % 2 = 0) "
            "THEN NULL ELSE -i END FROM generate_series(1, 3000) i")
    before = dict(run(db, "SELECT id, v FROM g").all())
    if outcome == "reverted":
        faults.arm("worker.before_checkpoint", "raise@30")  # the last batch fails the job
    captured: list[tuple[str, object]] = []
    listener = _statements_run(captured)
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", listener)
    try:
        job_id = submit(db, SubmitRequest("sql-update", {"table": "g", "set": "v=coalesce(v, 0) + id"},
                                          rows_per_subtask=1_000, batch_rows=100)).job_id
        start_node("n1", slots=1)
        assert wait_state(db, job_id, TERMINAL, 60)["state"] == outcome
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", listener)
    null_range = [kind for kind, lo in captured if lo is not None and lo <= 1000]
    assert null_range and set(null_range) == {"guard"}, captured  # no image statement there
    assert {lo for kind, lo in captured if kind == "images"} >= set(range(1001, 3000, 100))
    values = dict(run(db, "SELECT id, v FROM g").all())
    if outcome == "succeeded":
        assert values == {i: (before[i] or 0) + i for i in range(1, 3001)}
    else:
        assert values == before  # DESIGN 8: every old value, NULL or not


@pytest.mark.parametrize("outcome", ["succeeded", "reverted"])
def test_a_null_old_value_an_application_sets_under_the_guard_is_computed_and_imaged_from_it(
        db, start_node, outcome):
    """The guard's snapshot sees ROW's old value NULL; the application gives
    it a value and commits while the guarded UPDATE waits for the row: the
    re-check skips it and the image statement does it from the application's
    version (DESIGN 9), keeping that value as its image (DESIGN 8)."""
    run(db, "CREATE TABLE g (id bigint PRIMARY KEY, v bigint)")
    run(db, "INSERT INTO g SELECT i, NULL FROM generate_series(1, 3000) i")
    if outcome == "reverted":
        faults.arm("worker.before_checkpoint", "raise@4")  # fails the job after batch 3
    app = db.engine.connect()
    try:
        app_tx = app.begin()
        app.execute(sa.text("UPDATE g SET v = :v WHERE id = :id"), {"v": APP_VALUE, "id": ROW})
        job_id = submit(db, SubmitRequest("sql-update", {"table": "g", "set": "v=coalesce(v, 0) + id"},
                                          rows_per_subtask=1_000, batch_rows=100)).job_id
        start_node("n1", slots=1)
        wait_until(lambda: bool(run(
            db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'UPDATE %num_nulls(%'").scalar()), 60, "the guard waiting on the row")
        app_tx.commit()
    finally:
        app.close()
    assert wait_state(db, job_id, TERMINAL, 60)["state"] == outcome
    values = dict(run(db, "SELECT id, v FROM g").all())
    if outcome == "succeeded":
        assert values.pop(ROW) == APP_VALUE + ROW
        assert values == {i: i for i in range(1, 3001) if i != ROW}
    else:
        assert values.pop(ROW) == APP_VALUE
        assert values == {i: None for i in range(1, 3001) if i != ROW}
