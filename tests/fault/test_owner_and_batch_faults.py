"""Faults of the owner and of a batch's statement, with real ``reorg worker``
processes on the test PostgreSQL: candidates racing for the owner lease, the
owner stopped inside its advance transaction, a batch that times out on every
attempt, and a lease expiring while its holder commits the finishing batch.
Each test checks the table afterwards (support.oracle; DESIGN 2, 3, 4, 7, 8)."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from support import execute, fill, held_by, job_of, table_rows, wait_state, wait_until
from support.oracle import (
    assert_exactly_once,
    counted_fill,
    holder,
    make_counted_items,
    report,
    timed_takeover,
)
from support.processes import proc_state

from framework.store import owner_lease
from framework.submit import submit

pytestmark = pytest.mark.fault


def _owner(db):
    with db.begin() as conn:
        return owner_lease.current(db, conn)


def test_candidates_racing_for_the_owner_lease_elect_one_per_term(db):
    """Eight candidates campaign at the same instant, term after term: each
    term has exactly one owner and a revision one higher than the last."""
    candidates, terms = 8, 15
    start = _owner(db)["revision"]
    for term in range(terms):
        # The previous term ends now, as when its owner stops renewing.
        execute(db, "UPDATE reorg.owner_lease SET expires_at = clock_timestamp() WHERE id = 1")
        barrier, won = threading.Barrier(candidates), []

        def run(name: str, barrier=barrier, won=won) -> None:
            barrier.wait()
            with db.begin() as conn:
                if elected := owner_lease.campaign(db, conn, name):
                    won.append(elected)

        threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(candidates)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(won) == 1, f"term {term}: {won}"
        assert won[0].revision == start + term + 1
        assert _owner(db)["owner_id"] == won[0].owner_id


def test_two_workers_started_together_run_the_job_under_one_owner_at_a_time(db, workers):
    make_counted_items(db, 6_000)
    job_id = submit(db, counted_fill(rows_per_subtask=1_000, batch_rows=250)).job_id
    workers.start("x"), workers.start("y")
    assert wait_state(db, job_id)["state"] == "succeeded"
    assert_exactly_once(db)
    actors = {a for (a,) in execute(db, "SELECT DISTINCT actor FROM reorg.job_events "
                                        "WHERE job_id = :j AND actor LIKE 'owner %'",
                                    {"j": job_id})}
    lease = _owner(db)
    # Nobody was deposed (both alive, renewing): one term did all of the owner's work.
    assert actors == {f"owner {lease['owner_id']} rev {lease['revision']}"}


def test_owner_stopped_inside_its_advance_transaction_is_deposed_and_cannot_commit(db, workers):
    make_counted_items(db, 4_000)
    job_id = submit(db, counted_fill(rows_per_subtask=1_000, batch_rows=250)).job_id
    # stale owns the job and stops itself with the advance's fenced transaction open.
    stale = workers.start("stale", faults="owner.after_advance_step=stop")
    wait_until(lambda: proc_state(stale.pid) == "T", 60, "owner to stop inside its advance")
    stopped = time.monotonic()
    assert job_of(db, job_id)["state"] == "running"  # the advance is not committed
    term = _owner(db)
    workers.start("fresh")
    assert wait_state(db, job_id)["state"] == "succeeded"
    done = round(time.monotonic() - stopped, 2)
    lease = _owner(db)
    assert lease["owner_id"] == "fresh" and lease["revision"] > term["revision"]
    settled = assert_exactly_once(db)
    stale.signal(signal.SIGCONT)
    wait_until(lambda: "owner tick failed" in stale.log() or "term" in stale.log(), 30,
               "stale owner to fail its commit")
    finished = execute(db, "SELECT actor FROM reorg.job_events WHERE job_id = :j "
                           "AND to_state = 'succeeded'", {"j": job_id})
    assert finished == [(f"owner fresh rev {lease['revision']}",)]  # advanced once, by fresh
    assert assert_exactly_once(db).table == settled.table
    report("owner SIGSTOP inside its advance transaction", job="test-fill", job_done_s=done,
           rows_redone=settled.redone, rows=settled.rows)


def test_a_batch_timing_out_on_every_attempt_is_retried_then_fails_the_job_cleanly(db, workers):
    """Every attempt of one subtask's batch runs past the statement timeout
    (half the lease): the subtask is retried, fails after the last attempt, and
    the job is rolled back to the table as it was."""
    make_counted_items(db, 4_000)
    before = table_rows(db)
    slow = "CASE WHEN id = 2500 THEN (pg_sleep(10) IS NULL)::int ELSE 0 END"
    job_id = submit(db, fill(f"coalesce(d, 0) + 1 + {slow}", type="int",
                             rows_per_subtask=1_000, batch_rows=250)).job_id
    started = time.monotonic()
    workers.start("w", REORG_MAX_ATTEMPTS="3")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "reverted", done
    assert "attempt 3" in done["error"] and "statement timeout" in done["error"], done["error"]
    assert table_rows(db) == before  # the job's column is gone, every row as it was
    report("statement timeout in a batch on every attempt", job="test-fill",
           job_done_s=round(time.monotonic() - started, 2), result="reverted after 3 attempts")


def test_a_lease_expiring_while_its_holder_commits_the_finishing_batch(db, workers):
    """The holder's last batch has written its rows and the checkpoint that
    finishes the subtask, and the holder stops before COMMIT until its lease
    has expired and a rescuer took the subtask. The open transaction (it holds
    the subtask's row lock, so no claim can take the row meanwhile) is cut off
    by the session's idle timeout, below the lease: the finish never commits
    twice, and each row is applied once."""
    make_counted_items(db, 4_000)
    job_id = submit(db, counted_fill(rows_per_subtask=1_000, batch_rows=250)).job_id
    # One slot: the 4th checkpoint is its first subtask's last batch (the finish).
    slow = workers.start("slow", slots=1, faults="worker.after_checkpoint=stop@4")
    wait_until(lambda: proc_state(slow.pid) == "T", 60, "slow to stop before its finishing COMMIT")
    stalled = time.monotonic()
    (sub_id, _, _), = held_by(db, "slow", live=False)
    workers.start("rescuer")
    takeover = timed_takeover(db, sub_id, "slow", stalled)
    assert wait_state(db, job_id)["state"] == "succeeded"
    settled = assert_exactly_once(db)
    slow.signal(signal.SIGCONT)  # its COMMIT goes out now, on a session the server ended
    wait_until(lambda: f"subtask {sub_id} " in slow.log(), 30, "slow to settle its subtask")
    assert assert_exactly_once(db).table == settled.table
    assert holder(db, sub_id) == "rescuer"
    report("rescue racing completion (holder stopped before its finishing COMMIT)",
           job="test-fill", takeover_s=takeover, rows_redone=settled.redone)
