"""Guarantees under faults, with real ``reorg worker`` processes: kill -9,
SIGSTOP past the lease, owner death. Every test checks the data against an
oracle afterwards (DESIGN invariants 2, 3, 4, 6, 8)."""

from __future__ import annotations

import signal

import pytest
import sqlalchemy as sa
from support import fill, held_by, job_of, make_items, rows, table_rows, wait_state, wait_until
from support.processes import proc_state

from framework import control
from framework.store import owner_lease
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault
# Each slot of a process armed with it stops after its first committed batch
# and waits there (holding its lease) until the test releases it.
HOLD = "worker.after_batch=block"


def q(db, sql, **params):
    return rows(db, sql, **params)


def test_kill_9_mid_subtask_resumes_from_curr_key_and_matches_the_oracle(db, workers):
    make_items(db, 12_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=3_000, batch_rows=200)).job_id
    victim = workers.start("victim", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 60)
    progressed = [r for r in held_by(db, "victim") if r.curr_key > r.start_key]
    assert progressed, "victim checkpointed part of a subtask"
    sub_id = progressed[0].id
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    checkpointed = q(db, "SELECT curr_key FROM {s}.background_subtask WHERE id = :i", i=sub_id)[0][0]
    workers.start("heir")
    assert wait_state(db, job_id)["state"] == "succeeded"
    assert q(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)")[0][0] == 0
    (start, row_count, attempts, exec_id), = q(
        db, "SELECT start_key, row_count, attempts, exec_id FROM {s}.background_subtask_history "
            "WHERE id = :i", i=sub_id) or q(
        db, "SELECT start_key, row_count, attempts, exec_id FROM {s}.background_subtask "
            "WHERE id = :i", i=sub_id)
    assert checkpointed > start and attempts == 2 and exec_id == "heir"
    # Exactly once: rows were counted once per committed batch, never twice.
    total = q(db, "SELECT sum(row_count) FROM (SELECT row_count FROM {s}.background_subtask "
                  "UNION ALL SELECT row_count FROM {s}.background_subtask_history) x")[0][0]
    assert total == 12_000 and row_count == 3_000


def test_sigstop_past_the_lease_mid_batch_then_sigcont_lands_nothing(db, workers):
    make_items(db, 4_000)
    # Each write carries its transaction id, so a zombie's commit would show.
    job_id = submit(db, fill("md5(b) || ':' || txid_current()", rows_per_subtask=2_000,
                             batch_rows=250)).job_id
    # The victim stops itself after writing its 2nd batch, before the checkpoint:
    # paused inside an open transaction that holds the batch's row locks.
    zombie = workers.start("zombie", slots=1, faults="worker.before_checkpoint=stop@2")
    wait_until(lambda: zombie.proc.poll() is None and "T" in proc_state(zombie.pid), 60,
               "zombie to stop itself mid-batch")
    zombie_sub = held_by(db, "zombie") or held_by(db, "zombie", live=False)
    workers.start("heir", slots=2)
    assert wait_state(db, job_id)["state"] == "succeeded"
    assert q(db, "SELECT count(*) FROM items WHERE d NOT LIKE md5(b) || ':%'")[0][0] == 0
    snapshot = table_rows(db)
    zombie.signal(signal.SIGCONT)
    wait_until(lambda: f"subtask {zombie_sub[0].id} " in zombie.log()
               and ": lost" in zombie.log(), 30, "zombie to notice it lost the subtask")
    assert table_rows(db) == snapshot  # none of the zombie's writes landed
    owners = q(db, "SELECT exec_id FROM {s}.background_subtask WHERE id = :i UNION ALL "
                   "SELECT exec_id FROM {s}.background_subtask_history WHERE id = :i",
               i=zombie_sub[0].id)
    assert owners == [("heir",)]


def test_kill_9_of_the_owner_hands_the_job_to_a_new_owner_with_a_higher_revision(db, workers):
    make_items(db, 12_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=2_000, batch_rows=200)).job_id
    first = workers.start("a", faults=HOLD)
    wait_until(lambda: job_of(db, job_id)["state"] == "running", 60, "a to start the job")
    second = workers.start("b", faults=HOLD)
    with db.begin() as conn:
        lease = owner_lease.current(db, conn)
    assert lease["owner_id"] == "a"
    b_pid = second.pid
    wait_until(lambda: b_pid in workers.gates.blocked("worker.after_batch"), 60,
               "b to work too (a batch committed)")
    assert held_by(db, "b")
    first.signal(signal.SIGKILL)
    first.proc.wait(10)

    def new_owner():
        with db.begin() as conn:
            now = owner_lease.current(db, conn)
        return now["owner_id"] == "b" and now["live"] and now

    taken = wait_until(new_owner, 30, "b to become owner")
    assert taken["revision"] > lease["revision"]
    workers.gates.release("worker.after_batch")
    assert wait_state(db, job_id)["state"] == "succeeded"
    assert q(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)")[0][0] == 0
    actor = q(db, "SELECT actor FROM {s}.job_events WHERE job_id = :j AND to_state = 'succeeded'",
              j=job_id)[0][0]
    assert actor == f"owner b rev {taken['revision']}"
    assert second.alive()


def test_owner_paused_inside_its_prepare_transaction_is_deposed_and_cannot_commit(db, workers):
    make_items(db, 3_000)
    before = table_rows(db)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=1_000)).job_id
    stale = workers.start("stale", faults="owner.after_prepare=stop")
    wait_until(lambda: "T" in proc_state(stale.pid), 30, "owner to stop inside prepare")
    workers.start("fresh")
    assert wait_state(db, job_id)["state"] == "succeeded"
    stale.signal(signal.SIGCONT)
    wait_until(lambda: "owner tick failed" in stale.log() or "term" in stale.log(), 30,
               "stale owner to fail its commit")
    started = q(db, "SELECT actor FROM {s}.job_events WHERE job_id = :j AND to_state = 'running'",
                j=job_id)
    assert [a for (a,) in started] and all(a.startswith("owner fresh") for (a,) in started)
    rows = table_rows(db)
    assert [r[:4] for r in rows] == before and all(len(r) == 5 for r in rows)  # one column added


def test_cancel_with_worker_processes_restores_the_table_exactly(db, workers):
    make_items(db, 10_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'orig-' || (id * 7)"))
    before = table_rows(db)
    # sql-update: restoring overwritten values is its part of the rollback.
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=upper(c)"},
                                      rows_per_subtask=1_000, batch_rows=100)).job_id
    workers.start("w1", faults=HOLD), workers.start("w2", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 60, count=4)  # every slot wrote a batch
    assert job_of(db, job_id)["rows_done"] >= 400
    control.cancel(db, job_id)
    workers.gates.release("worker.after_batch")
    assert wait_state(db, job_id)["state"] == "cancelled"
    assert table_rows(db) == before


@pytest.mark.parametrize("max_attempts,outcome", [(1, "reverted"), (2, "succeeded")])
def test_a_holder_restarted_under_its_own_id_never_leaves_its_subtasks_stuck(
        db, workers, max_attempts, outcome):
    """Issue 11 defect 2: the restart handed the crashed incarnation's subtasks
    back as pending with their attempt used; on the last attempt no claim would
    take them and nothing failed them, and the job sat at 20 % for ever. Now the
    crash counts as an attempt: the owner fails an exhausted one (the job rolls
    back), and one with attempts left is resumed."""
    make_items(db, 4_000)
    before = table_rows(db)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=100)).job_id
    attempts = {"REORG_MAX_ATTEMPTS": str(max_attempts)}
    # Dies like kill -9 at its 3rd checkpoint, both slots mid-subtask.
    victim = workers.start("victim", faults="worker.before_checkpoint=exit@3", **attempts)
    assert victim.proc.wait(60) == 137
    held = q(db, "SELECT count(*) FROM {s}.background_subtask "
                 "WHERE exec_id = 'victim' AND state = 'running'")[0][0]
    assert held == 2
    workers.start("victim", **attempts)
    done = wait_state(db, job_id)
    assert done["state"] == outcome
    if outcome == "reverted":
        assert table_rows(db) == before  # column gone, every row as before
        assert "holder restarted on attempt 1 of 1" in done["error"]
    else:
        assert q(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)")[0][0] == 0
