"""Jobs of several steps under faults, with real ``reorg worker`` processes
and the worked example ``test-fill-verify`` (tests/support/fill.py): a kill -9
of a worker in step 2 resumes from ``curr_key``; an owner killed between two
steps leaves the job in the step it was in, and its successor moves it on
once (DESIGN 4, 7, 10)."""

from __future__ import annotations

import signal

import pytest
from support import fill, held_by, job_of, make_items, rows, scalar, wait_state, wait_until

from framework import control
from framework.submit import submit

pytestmark = pytest.mark.fault

ROWS = 4_000


def _step_rows(db, job_id: int, step: int) -> list[tuple]:
    """(ordinal, start_key, end_key, row_count, attempts, exec_id) of a step's
    subtasks, live and moved."""
    select = ("SELECT ordinal, start_key, end_key, row_count, attempts, exec_id FROM {s}.%s "
              "WHERE job_id = :j AND step = :step")
    # One statement, one snapshot: a history move meanwhile cannot show a row twice.
    return sorted(rows(db, select % "background_subtask" + " UNION ALL "
                       + select % "background_subtask_history", j=job_id, step=step))


def test_kill_9_of_a_worker_in_step_2_resumes_from_curr_key(db, workers):
    make_items(db, ROWS)
    # Throttled, so the verify step lasts seconds: long enough to be caught in.
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=1_000, batch_rows=100,
                             max_rows_per_sec=1_500)).job_id
    victim = workers.start("victim", slots=2)

    def verifying():
        if job_of(db, job_id)["step"] != 2:
            return None
        progressed = [r for r in held_by(db, "victim") if r.curr_key > r.start_key]
        return progressed or None

    caught = wait_until(verifying, 90, "the victim part-way through a verify subtask")
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    sub_id, checkpointed = caught[0].id, caught[0].curr_key
    workers.start("heir", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded", done["error"]
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    resumed = rows(db, "SELECT curr_key, attempts, exec_id, step FROM {s}.background_subtask "
                       "WHERE id = :i UNION ALL SELECT curr_key, attempts, exec_id, step "
                       "FROM {s}.background_subtask_history WHERE id = :i", i=sub_id)
    (curr_key, attempts, exec_id, step), = resumed
    assert step == 2 and attempts == 2 and exec_id == "heir" and curr_key > checkpointed
    # Exactly once per step: each step counted every row once, none twice.
    for step in (1, 2):
        assert sum(r[3] for r in _step_rows(db, job_id, step)) == ROWS


def test_an_owner_killed_between_two_steps_leaves_the_job_in_its_step_for_its_heir(
        db, workers):
    make_items(db, ROWS)
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=1_000,
                             batch_rows=500)).job_id
    # The victim dies (as kill -9) inside the transaction that enters step 2:
    # the verify subtasks inserted, the job's step not yet committed.
    victim = workers.start("victim", slots=2, faults="owner.after_next_step=exit")
    victim.proc.wait(90)
    assert victim.proc.returncode == 137
    job = job_of(db, job_id)
    assert job["state"] == "running" and job["step"] == 1
    assert _step_rows(db, job_id, 2) == []  # rolled back with the step
    workers.start("heir", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded", done["error"]
    verify = _step_rows(db, job_id, 2)
    assert [r[0] for r in verify] == [0, 1, 2, 3]  # inserted once, by the heir
    assert sum(r[3] for r in verify) == ROWS
    entered = [e for e in control.events(db, job_id) if "step 2/3 verify" in (e["detail"] or "")]
    assert len(entered) == 1 and "heir" in entered[0]["actor"]
