"""``add-index`` and ``add-column`` under faults, with real ``reorg worker``
processes and an application writing the whole time (support.app_model): a kill -9
of a worker in the middle of a concurrent index build (its backend still
building, an INVALID index left) and in the middle of a backfill; an owner
killed inside the cut-over's transaction. Each resumes on the heir and ends
with the table the oracle expects."""

from __future__ import annotations

import signal

import psycopg
import pytest
from support import held_by, job_of, make_items, rows, scalar, wait_state, wait_until
from support.app_model import Application, data, shape

from framework import control, long_statements
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault


def _build_backend(db, job_id: int) -> int | None:
    """The pid of the job's build session, once it is building."""
    return scalar(db, "SELECT pid FROM pg_stat_progress_create_index JOIN pg_stat_activity "
                      f"USING (pid) WHERE {long_statements.tagged_sql(job_id)}")


def _subtask(db, job_id: int, step: int) -> tuple:
    select = ("SELECT attempts, exec_id, curr_key, state FROM {s}.%s "
              "WHERE job_id = :j AND step = :step")
    found = rows(db, select % "background_subtask" + " UNION ALL "
                 + select % "background_subtask_history", j=job_id, step=step)
    assert len(found) == 1, found
    return found[0]


def test_kill_9_of_a_worker_mid_build_the_heir_ends_its_build_and_builds_again(
        db, workers, migrated_db):
    make_items(db, 3_000)
    with Application(db.engine) as app, psycopg.connect(migrated_db) as writer:
        # An open write transaction holds the build at its wait for writers:
        # the index is in the catalogue, INVALID, when the victim dies.
        writer.execute("UPDATE items SET a = a WHERE id = 1")
        job_id = submit(db, SubmitRequest("add-index", {
            "table": "items", "columns": "b", "unique": True, "name": "items_b_key"})).job_id
        victim = workers.start("victim", slots=2)
        orphan = wait_until(lambda: _build_backend(db, job_id), 90, "the victim's build")
        assert scalar(db, "SELECT indisvalid FROM pg_index "
                          "WHERE indexrelid = to_regclass('items_b_key')") is False
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        workers.start("heir", slots=2)
        # The heir holds the build; the dead worker's backend (still
        # building) is ended, the heir's own session waits for the writer to
        # drop the INVALID index concurrently and build again.
        wait_until(lambda: _subtask(db, job_id, 2)[:2] == (2, "heir"), 60,
                   "the heir to claim the build")
        wait_until(lambda: not scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = :p",
                                      p=orphan), 30, "the dead worker's build to end")
        writer.rollback()
        done = wait_state(db, job_id)
        app.wait_writes(10)
    assert done["state"] == "succeeded", done["error"]
    attempts, exec_id, curr_key, state = _subtask(db, job_id, 2)
    assert (attempts, exec_id, curr_key, state) == (2, "heir", 100, "succeeded")
    indexes = shape(db.engine)["indexes"]
    assert [(name, valid) for name, valid, _ in indexes] == [("items_b_key", True),
                                                              ("items_pkey", True)]
    assert not app.errors and data(db.engine) == app.expected()


VALUE = "md5(b || '/' || a)"


@pytest.mark.matrix  # the resume itself is the framework's (test_step_faults); long
def test_kill_9_of_a_worker_mid_backfill_resumes_from_curr_key(db, workers):
    make_items(db, 4_000)
    with Application(db.engine) as app:
        # Throttled, so the backfill lasts seconds: long enough to be caught in.
        job_id = submit(db, SubmitRequest(
            "add-column", {"table": "items", "column": "d:text", "value": VALUE,
                           "default": "'x'", "not_null": True}, rows_per_subtask=1_000,
            batch_rows=100,
            max_rows_per_sec=1_500)).job_id
        victim = workers.start("victim", slots=2)
        caught = wait_until(lambda: [r for r in held_by(db, "victim") if r.curr_key > r.start_key],
                            90, "the victim part-way through a backfill subtask")
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        workers.start("heir", slots=2)
        done = wait_state(db, job_id)
        app.wait_writes(10)
    assert done["state"] == "succeeded", done["error"]
    resumed = rows(db, "SELECT curr_key, attempts, exec_id FROM {s}.background_subtask "
                       "WHERE id = :i UNION ALL SELECT curr_key, attempts, exec_id "
                       "FROM {s}.background_subtask_history WHERE id = :i", i=caught[0].id)
    assert resumed[0][1:] == (2, "heir") and resumed[0][0] > caught[0].curr_key
    cut_over = "(SELECT finished_at FROM {s}.jobs WHERE id = :j)"
    assert scalar(db, f"SELECT count(*) FROM items WHERE d IS DISTINCT FROM {VALUE} "
                      f"AND (c IS NULL OR c::timestamptz < {cut_over})", j=job_id) == 0
    assert ("d", "text", True, "'x'::text") in shape(db.engine)["columns"]
    assert shape(db.engine)["triggers"] == []
    assert not app.errors and data(db.engine) == app.expected()


@pytest.mark.matrix
def test_an_owner_killed_inside_the_cut_over_leaves_it_to_its_heir(db, workers):
    make_items(db, 1_000)
    before_columns = shape(db.engine)["columns"]
    with Application(db.engine) as app:
        job_id = submit(db, SubmitRequest(
            "add-column", {"table": "items", "column": "d:text", "value": VALUE,
                           "default": "'x'", "not_null": True}, rows_per_subtask=250)).job_id
        # The victim dies (as kill -9) after the cut-over's DDL, before its commit.
        victim = workers.start("victim", slots=2, faults="owner.after_advance_step=exit")
        victim.proc.wait(90)
        assert victim.proc.returncode == 137
        job = job_of(db, job_id)
        assert job["state"] == "running" and job["step_name"] == "not-null"
        # Rolled back: the job's triggers still there.
        assert {t for (t,) in shape(db.engine)["triggers"]} == {
            f"~reorg_{job_id}_add_column_{role}" for role in (
                "1_written", "2_changed", "2_deleted", "2_given", "3_fill", "3_fill_new")}
        assert shape(db.engine)["columns"] == [*before_columns, ("d", "text", False, None)]
        workers.start("heir", slots=2)
        done = wait_state(db, job_id)
        app.wait_writes(10)
    assert done["state"] == "succeeded", done["error"]
    assert ("d", "text", True, "'x'::text") in shape(db.engine)["columns"]
    assert shape(db.engine)["triggers"] == [] and shape(db.engine)["functions"] == []
    assert not app.errors and data(db.engine) == app.expected()


@pytest.mark.matrix
def test_cancel_after_a_kill_9_mid_build_ends_the_orphan_build_and_drops_its_index(
        db, workers, migrated_db):
    make_items(db, 2_000)
    before, table = shape(db.engine), data(db.engine)
    with psycopg.connect(migrated_db) as writer:
        writer.execute("UPDATE items SET a = a WHERE id = 1")  # holds the build
        job_id = submit(db, SubmitRequest("add-index", {
            "table": "items", "columns": "b", "name": "items_b_idx"})).job_id
        victim = workers.start("victim", slots=2)
        orphan = wait_until(lambda: _build_backend(db, job_id), 90, "the victim's build")
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        control.cancel(db, job_id)
        workers.start("heir", slots=2)
        wait_until(lambda: not scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = :p",
                                      p=orphan), 60, "the orphan build to be ended")
        writer.rollback()
    done = wait_state(db, job_id)
    assert done["state"] == "cancelled", done["error"]
    assert shape(db.engine) == before and data(db.engine) == table
