"""Jobs end to end with in-process nodes on a real PostgreSQL: advance,
cancel, pause, failure, retries, local mode, history (DESIGN 5-10)."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
import sqlalchemy as sa
from support import TERMINAL, fill, job_of, make_items, scalar, table_rows, wait_state, wait_until

from framework import control, faults
from framework.states import JobState
from framework.submit import SubmitRequest, submit


def test_backfill_runs_on_two_nodes_to_the_oracle_and_moves_history(db, start_node):
    make_items(db, 20_000, step=7)  # gappy keys
    job_id = submit(db, fill("md5(b) || a", rows_per_subtask=2_000, batch_rows=500)).job_id
    start_node("n1"), start_node("n2")
    seen = []

    def progress_sample():
        job = job_of(db, job_id)
        seen.append(job["percent"])
        return job["state"] == "succeeded"

    wait_until(progress_sample, 60, "job to succeed")
    assert seen == sorted(seen), "progress went backward"  # DESIGN 6
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b) || a") == 0
    wait_until(lambda: scalar(db, "SELECT count(*) FROM {s}.background_subtask") == 0, 10,
               "history move")
    hist = scalar(db, "SELECT count(*) FROM {s}.background_subtask_history WHERE job_id = :j", j=job_id)
    assert hist == 10
    # Coverage (DESIGN 5): the finished ranges tile the key space exactly.
    with db.begin() as conn:
        ranges = conn.execute(db.sql(
            "SELECT start_key, end_key, curr_key, row_count FROM {s}.background_subtask_history "
            "WHERE job_id = :j ORDER BY ordinal"), {"j": job_id}).all()
    assert ranges[0][0] == 1 and ranges[-1][1] == 1 + 19_999 * 7 + 1
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(r.curr_key == r.end_key for r in ranges) and sum(r.row_count for r in ranges) == 20_000
    events = [(e["from_state"], e["to_state"]) for e in control.events(db, job_id)]
    assert events == [(None, "queued"), ("queued", "running"), ("running", "succeeded")]


def _held_job(db, request):
    """Submit a job whose batches stop at worker.after_batch (each slot after
    its first committed batch) until the test releases them."""
    faults.arm("worker.after_batch", "block")
    return submit(db, dataclasses.replace(request, rows_per_subtask=1_000, batch_rows=100,
                                          concurrency=2)).job_id


def _held_on_both_slots(db, job_id):
    faults.wait_blocked("worker.after_batch", 30, count=2)
    assert job_of(db, job_id)["rows_done"] >= 200  # some progress, visible


def test_cancel_mid_run_drops_the_added_column(db, start_node):
    make_items(db, 6_000)
    before = table_rows(db)
    job_id = _held_job(db, fill("md5(b)"))
    start_node("n1")
    _held_on_both_slots(db, job_id)
    assert control.cancel(db, job_id) is JobState.CANCELLING
    faults.release("worker.after_batch")
    job = wait_state(db, job_id, TERMINAL)
    assert job["state"] == "cancelled"
    assert table_rows(db) == before  # DESIGN 8: column gone, every row as before
    with pytest.raises(Exception, match="nothing to cancel"):
        control.cancel(db, job_id)


def test_cancel_mid_run_restores_overwritten_values_but_keeps_later_app_writes(db, start_node):
    make_items(db, 6_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old-' || id"))
    before = {r[0]: r for r in table_rows(db)}
    job_id = _held_job(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"}))
    start_node("n1")
    _held_on_both_slots(db, job_id)  # subtasks 1 and 2 are claimed first
    with db.begin() as conn:  # the application writes row 1 after the job did
        assert conn.execute(sa.text("SELECT c FROM items WHERE id = 1")).scalar() != "old-1"
        conn.execute(sa.text("UPDATE items SET c = 'app' WHERE id = 1"))
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    assert wait_state(db, job_id, TERMINAL)["state"] == "cancelled"
    after = {r[0]: r for r in table_rows(db)}
    assert after[1][3] == "app"  # DESIGN 9: the later write wins over the restore
    del after[1], before[1]
    assert after == before  # DESIGN 8
    assert scalar(db, "SELECT count(*) FROM pg_tables WHERE schemaname = :s AND tablename "
                      "LIKE 'sql_update_' || :j || '_%'", s=db.schema, j=str(job_id)) == 0


def test_pause_stops_all_work_and_resume_finishes(db, start_node):
    make_items(db, 6_000)
    faults.enable_signals()
    job_id = _held_job(db, fill("md5(b)"))
    start_node("n1")
    _held_on_both_slots(db, job_id)
    control.pause(db, job_id)
    faults.wait("subtask.stop", 30), faults.wait("subtask.stop", 30)  # both slots told
    faults.release("worker.after_batch")  # ... so each commits no more than its batch
    paused = wait_state(db, job_id, {"paused"}, 30)
    assert paused["running"] == 0  # every subtask handed back
    done = paused["rows_done"]
    wait_until(lambda: scalar(db, "SELECT count(*) FROM {s}.background_subtask WHERE state = 'running'") == 0,
               5, "no running subtask")
    assert job_of(db, job_id)["rows_done"] == done
    control.resume(db, job_id)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    states = [e["to_state"] for e in control.events(db, job_id)]
    assert states == ["queued", "running", "pausing", "paused", "resuming", "running",
                      "succeeded"]


def test_a_non_retryable_error_fails_the_job_and_rolls_it_back(db, start_node):
    make_items(db, 3_000)
    before = table_rows(db)
    faults.arm("worker.before_checkpoint", "raise@4")
    job_id = submit(db, fill("a*2", type="int", rows_per_subtask=1_000, batch_rows=200)).job_id
    start_node("n1", slots=1)
    job = wait_state(db, job_id, TERMINAL)
    assert job["state"] == "reverted"  # DESIGN 7: never counted as success
    assert "fault worker.before_checkpoint" in job["error"]
    assert table_rows(db) == before


def test_retryable_errors_are_retried_with_backoff_and_the_job_succeeds(db, start_node):
    make_items(db, 2_000)
    faults.arm("worker.before_checkpoint", "retryable@2")
    job_id = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=250)).job_id
    start_node("n1", slots=1)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    # The owner moves a finished job's subtasks to history after it marked
    # the job succeeded (its housekeeping, later in the same tick).
    wait_until(lambda: scalar(db, "SELECT max(attempts) FROM {s}.background_subtask_history")
               is not None, 10, "the subtasks moved to history")
    assert scalar(db, "SELECT max(attempts) FROM {s}.background_subtask_history") == 2


def test_a_small_job_runs_only_on_the_owners_node(db, start_node, settings):
    make_items(db, 2_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=100)).job_id
    owner = start_node("n1", local_job_max_subtasks=10)
    wait_until(lambda: owner.owner.term is not None, 10, "n1 elected")
    other = start_node("n2", local_job_max_subtasks=10)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT run_on_node FROM {s}.jobs WHERE id = :j", j=job_id) == "n1"
    assert not other.pool.results and len(owner.pool.results) == 2


def test_drain_hands_subtasks_back_at_once_and_another_node_finishes(db, start_node):
    make_items(db, 4_000)
    faults.enable_signals()
    job_id = _held_job(db, fill("md5(b)"))
    first = start_node("n1")
    _held_on_both_slots(db, job_id)
    assert first.pool.busy() == 2
    draining = threading.Thread(target=first.drain, kwargs={"timeout": 10})
    draining.start()
    faults.wait("subtask.stop", 30), faults.wait("subtask.stop", 30)  # both slots told
    faults.release("worker.after_batch")
    draining.join(15)
    assert not draining.is_alive()
    with_lease = scalar(db, "SELECT count(*) FROM {s}.background_subtask WHERE exec_id = 'n1'")
    assert with_lease == 0  # released, not left to expire
    assert scalar(db, "SELECT count(*) FROM {s}.nodes WHERE node_id = 'n1'") == 0
    start_node("n2")
    assert wait_state(db, job_id, TERMINAL, 30)["state"] == "succeeded"


def test_a_node_restarting_with_the_same_id_releases_what_it_held(db, start_node, settings):
    from framework.node import Node
    from framework.store import subtasks

    make_items(db, 2_000)
    submit(db, fill("md5(b)", rows_per_subtask=1_000))
    with db.begin() as conn:  # the job is running and "n1" died holding a subtask
        from framework.owner import Owner
        Owner(db, "o").tick()
        held, = subtasks.claim(db, conn, "n1")
    restarted = Node(settings, node_id="n1", slots=1)
    try:
        restarted.start()
        with db.begin() as conn:
            assert not subtasks.checkpoint_one(db, conn, held, held.start_key + 1, 1)
    finally:
        restarted.drain(10)


def test_history_move_is_exact_when_the_owner_dies_between_batches(db, settings):
    from framework.config import Settings
    from framework.db import Database
    from framework.owner import Owner

    make_items(db, 100)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=10)).job_id
    small = Database(Settings(**{**settings.__dict__, "history_batch": 3}))
    owner = Owner(small, "o")
    owner.tick()  # start
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.background_subtask SET state = 'succeeded', curr_key = end_key"))
    faults.arm("owner.after_history_batch", "raise@2")
    with pytest.raises(RuntimeError):
        owner.tick()  # advance, move a batch of 3, move a second one, then die
    def ids(table):
        with small.begin() as conn:
            return set(conn.execute(small.sql(f"SELECT id FROM {{s}}.{table}")).scalars())

    live, hist = ids("background_subtask"), ids("background_subtask_history")
    assert len(hist) == 6 and len(live) == 4 and not (live & hist)  # DESIGN 10
    faults.disarm_all()
    wait_until(lambda: owner.tick() and not ids("background_subtask"), 10, "move to finish")
    assert len(ids("background_subtask_history")) == 10
    assert job_of(db, job_id)["succeeded"] == 10
    small.dispose()


def test_app_writes_during_a_job_are_never_overwritten_by_stale_values(db, start_node):
    make_items(db, 8_000)
    stop = threading.Event()
    writes = []

    def writer():
        eng = sa.create_engine(db.engine.url)
        while not stop.is_set():
            k = random.randint(1, 8_000)
            with eng.begin() as conn:
                conn.execute(sa.text("UPDATE items SET b = b || 'x', c = md5(b || 'x') WHERE id = :k"),
                             {"k": k})
            writes.append(k)
        eng.dispose()

    t = threading.Thread(target=writer)
    t.start()
    try:
        job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                          rows_per_subtask=1_000, batch_rows=200)).job_id
        start_node("n1"), start_node("n2")
        assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    finally:
        stop.set()
        t.join()
    assert len(writes) > 50
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
