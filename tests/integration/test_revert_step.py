"""The revert step (DESIGN 13) on in-process nodes: a restore batch that keeps
failing leaves the job reverting with the error shown and is retried until it
passes; status counts forward and revert subtasks apart; a cancel of a job of
20,000 subtasks completes and restores the table."""

from __future__ import annotations

import time

import sqlalchemy as sa
from support import fill, job_of, make_items, rows, scalar, table_rows, wait_state, wait_until

from cli.progress import status_table
from framework import control, faults
from framework import owner as owner_module
from framework.records import STEP_REVERT
from framework.submit import SubmitRequest, submit


def _revert_rows(db, job_id: int) -> list[tuple]:
    """(state, attempts, row_count) of the job's revert subtasks, live and moved,
    in one statement: one snapshot, so a subtask the owner moves to history
    between two reads is never counted in both."""
    select = "SELECT state, attempts, row_count FROM {s}.%s WHERE job_id = :j AND step = :step"
    return rows(db, select % "background_subtask" + " UNION ALL "
                + select % "background_subtask_history", j=job_id, step=STEP_REVERT)


def test_a_failing_restore_batch_keeps_the_job_reverting_and_is_retried_until_it_passes(
        db, start_node, settings):
    make_items(db, 2_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = CASE WHEN id % 4 = 0 THEN NULL "
                             "ELSE 'old-' || id END"))
    before = table_rows(db)
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=500, batch_rows=100)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 30, count=2)
    # Every restore batch fails, with an error no forward batch would retry.
    faults.arm("worker.in_restore_batch", "raise")
    control.cancel(db, job_id)
    faults.release("worker.after_batch")

    def failing_past_its_attempts():
        job = job_of(db, job_id)
        attempts = max((a for _, a, _ in _revert_rows(db, job_id)), default=0)
        return ("revert retrying" in (job["error"] or "")
                and attempts >= settings.max_attempts and job)

    job = wait_until(failing_past_its_attempts, 60, "revert subtasks to use their attempts")
    assert job["state"] == "reverting" and job["step"] == STEP_REVERT
    assert "fault worker.in_restore_batch" in job["error"]
    assert {state for state, _, _ in _revert_rows(db, job_id)} <= {"pending", "running"}
    assert table_rows(db) != before  # never marked done half restored
    # The owner gives the exhausted subtasks a new round; now the batches pass.
    faults.disarm_all()
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "cancelled"
    assert done["error"] is None  # the retry note went with the retries
    assert table_rows(db) == before
    reverted = _revert_rows(db, job_id)
    assert len(reverted) == 2 and all(state == "succeeded" for state, _, _ in reverted)
    assert sum(n for _, _, n in reverted) == done["rows_done"]  # each row restored once


def test_status_shows_revert_progress_apart_from_the_forward_counts(db, start_node, monkeypatch):
    # One revert range per forward range that made progress (of 100 rows).
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 100)
    make_items(db, 1_000)
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, fill("md5(b)", revert_ranges=True, rows_per_subtask=100,
                             batch_rows=10)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 30, count=2)
    faults.arm("worker.in_restore_batch", "block")
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    faults.wait_blocked("worker.in_restore_batch", 30)
    job = job_of(db, job_id)
    assert job["state"] == "reverting" and job["step"] == STEP_REVERT
    # The forward figures stay as the job stopped (10 subtasks, none pending or
    # running any more); the revert's own are apart: one range per forward
    # range that made progress, none restored yet.
    assert (job["pending"], job["running"]) == (0, 0)
    assert job["succeeded"] + job["cancelled"] == 10
    progressed = scalar(db, "SELECT count(*) FROM {s}.background_subtask WHERE job_id = :j "
                            "AND step = 1 AND curr_key > start_key", j=job_id)
    assert job["revert_total"] == progressed >= 2
    assert (job["revert_done"], job["revert_percent"]) == (0, 0.0)
    shown = status_table([job])
    assert f"revert 0/{progressed} (0.0%)" in shown and "reverting" in shown
    forward = {k: job[k] for k in ("succeeded", "cancelled", "failed", "rows_done")}
    faults.release("worker.in_restore_batch")
    done = wait_state(db, job_id)
    assert done["state"] == "cancelled"
    assert (done["revert_done"], done["revert_percent"]) == (progressed, 100.0)
    wait_until(lambda: job_of(db, job_id)["history_done"], 30, "the history move")
    moved = job_of(db, job_id)
    assert {k: moved[k] for k in forward} == forward  # never counted twice
    assert moved["revert_done"] == progressed
    assert scalar(db, "SELECT count(*) FROM information_schema.columns "
                      "WHERE table_name = 'items' AND column_name = 'd'") == 0


def test_cancel_of_a_job_of_20000_subtasks_completes_and_restores(db, start_node):
    make_items(db, 20_000)
    before = table_rows(db)
    job_id = submit(db, fill("md5(b)", revert_ranges=True, rows_per_subtask=1,
                             batch_rows=100)).job_id
    start_node("n1", slots=2), start_node("n2", slots=2)
    wait_until(lambda: job_of(db, job_id)["succeeded"] >= 1_000, 120,
               "1,000 subtasks to succeed")
    started = time.monotonic()
    control.cancel(db, job_id)
    done = wait_state(db, job_id, timeout=300)
    took = time.monotonic() - started
    assert done["state"] == "cancelled"
    assert table_rows(db) == before
    total = done["revert_total"]
    # Revert ranges by rows to restore, not one per forward subtask: the
    # done subtasks' touching ranges restore together, a gap (a subtask
    # claimed but not begun) starting another.
    assert 1 <= total <= 50 and done["revert_done"] == total
    assert done["succeeded"] + done["cancelled"] == 20_000
    print(f"\ncancel of 20,000 subtasks ({done['succeeded']} done, {total} ranges to "
          f"restore): {took:.1f}s")


def test_a_cancel_restores_ranges_whose_history_rows_are_past_retention(
        db, start_node, monkeypatch):
    """The revert plan finds the ranges to restore in the subtask rows, live and
    moved to history (DESIGN 13); a job that runs (or sits paused) longer than
    the history retention must keep those rows until it ends, or the ranges
    they name are never restored and their before-images are dropped."""
    from framework import owner

    make_items(db, 2_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old-' || id"))
    before = table_rows(db)
    # The owner moves succeeded subtasks of a running job to history at once
    # (as it does past 5,000 of them), and retention is as good as immediate
    # (as it is for the first ranges of a job that runs 30 days).
    monkeypatch.setattr(owner, "LIVE_SUCCEEDED_KEPT", 0)
    # One batch per range; rate-limited jobs run each subtask alone, in order.
    faults.arm("worker.after_batch", "block@2")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=500, batch_rows=1_000,
                                      max_rows_per_sec=10**9)).job_id
    start_node("n1", slots=1, history_retention_days=1e-9)
    faults.wait_blocked("worker.after_batch", 30)

    def succeeded_ranges_gone():
        left = scalar(db, "SELECT count(*) FROM {s}.background_subtask WHERE job_id = :j "
                          "AND state = 'succeeded'", j=job_id)
        return left == 0 and job_of(db, job_id)["succeeded"] == 2

    # The tick that moved them ends with housekeeping (retention), before any
    # later tick plans the revert.
    wait_until(succeeded_ranges_gone, 30, "the succeeded ranges to move to history")
    assert table_rows(db) != before  # two ranges were overwritten
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "cancelled"
    assert table_rows(db) == before
