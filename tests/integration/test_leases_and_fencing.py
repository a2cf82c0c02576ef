"""Leases and fences on a real PostgreSQL (DESIGN invariants 1, 2, 4, 6)."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from support import fill, make_items, started_fill

from framework.records import Job
from framework.states import JobState
from framework.store import history, jobs, owner_lease, steps, subtasks
from framework.submit import submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def _expire_owner(db) -> None:
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.owner_lease SET expires_at = clock_timestamp() - interval '1s'"))


def _expire_leases(db) -> None:
    with db.begin() as conn:
        conn.execute(db.sql(
            "UPDATE {s}.background_subtask SET exec_expired = clock_timestamp() - interval '1s' "
            "WHERE state = 'running'"))


def test_each_owner_term_has_a_higher_revision_and_deposed_writes_hit_nothing(db):
    job_id, term_a = started_fill(db, 3)
    with db.begin() as conn:
        assert owner_lease.campaign(db, conn, "owner-b") is None  # A's term is live
    _expire_owner(db)  # A is paused past its lease
    with db.begin() as conn:
        term_b = owner_lease.campaign(db, conn, "owner-b")
    assert term_b is not None and term_b.revision == term_a.revision + 1
    with db.begin() as conn:
        assert not owner_lease.renew(db, conn, term_a)
        assert not owner_lease.hold(db, conn, term_a)
        assert jobs.fail(db, conn, term_a, job_id, actor="a", error="x", detail="x") is None
        assert steps.insert_ranges(db, conn, term_a, job_id, 1, [(100, 200)]) == 0
        assert steps.cancel_unleased(db, conn, term_a, job_id) == 0
        assert history.move_finished(db, conn, term_a, job_id, 100) == 0
    with db.begin() as conn:
        assert jobs.state(db, conn, job_id) is JobState.RUNNING
        # The new owner's writes go through.
        assert jobs.fail(db, conn, term_b, job_id, actor="b", error="x",
                         detail="x") is JobState.RUNNING


def test_same_node_reelected_after_expiry_gets_a_new_revision(db):
    with db.begin() as conn:
        first = owner_lease.campaign(db, conn, "n1")
    _expire_owner(db)
    with db.begin() as conn:
        again = owner_lease.campaign(db, conn, "n1")
        assert again.revision == first.revision + 1
        assert not owner_lease.hold(db, conn, first)


def test_claims_fence_out_the_previous_holder(db):
    job_id, _ = started_fill(db, 1)
    with db.begin() as conn:
        first, = subtasks.claim(db, conn, "w1")
    assert first.epoch == 1 and first.attempts == 1
    with db.begin() as conn:  # a live lease is not claimable
        assert subtasks.claim(db, conn, "w2") == []
    _expire_leases(db)
    with db.begin() as conn:
        second, = subtasks.claim(db, conn, "w2")
    assert second.id == first.id and second.epoch == 2 and second.attempts == 2
    with db.begin() as conn:
        assert subtasks.renew(db, conn, [first]) == {}
        assert not subtasks.checkpoint_one(db, conn, first, 5, 4)
        assert not subtasks.finish_if_held(db, conn, first)
        assert not subtasks.release_if_held(db, conn, first)
        assert not subtasks.fail_if_held(db, conn, first, "zombie")
        assert subtasks.checkpoint_one(db, conn, second, 5, 4)


def test_expired_lease_cannot_checkpoint_even_before_anyone_reclaims(db):
    started_fill(db, 1)
    with db.begin() as conn:
        claim, = subtasks.claim(db, conn, "w1")
    _expire_leases(db)
    with db.begin() as conn:
        assert not subtasks.checkpoint_one(db, conn, claim, 5, 4)


def test_curr_key_never_moves_backward_and_finish_needs_the_whole_range(db):
    started_fill(db, 1)
    with db.begin() as conn:
        claim, = subtasks.claim(db, conn, "w1")
        assert subtasks.checkpoint_one(db, conn, claim, 6, 5) == subtasks.Checkpointed("running", 1)
        assert not subtasks.checkpoint_one(db, conn, claim, 4, 1)  # backward
        assert not subtasks.checkpoint_one(db, conn, claim, 99, 1)  # past the range
        assert not subtasks.finish_if_held(db, conn, claim)  # range not done
        # The checkpoint that reaches the end finishes the subtask with the batch.
        assert subtasks.checkpoint_one(db, conn, claim, 11, 5).state == "succeeded"
        assert not subtasks.finish_if_held(db, conn, claim)
        row = conn.execute(db.sql("SELECT curr_key, row_count, state FROM {s}.background_subtask")).one()
    assert tuple(row) == (11, 10, "succeeded")


def test_lease_times_come_from_the_database_clock(db, monkeypatch):
    started_fill(db, 1)
    # A worker whose own clock is wildly wrong still gets a lease of exactly
    # ttl on the database clock.
    monkeypatch.setattr(time, "time", lambda: 0.0)
    with db.begin() as conn:
        subtasks.claim(db, conn, "w1")
        ahead = conn.execute(db.sql(
            "SELECT extract(epoch FROM exec_expired - clock_timestamp()) "
            "FROM {s}.background_subtask")).scalar()
        owner_lease.campaign(db, conn, "o")
        owner_ahead = conn.execute(db.sql(
            "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM {s}.owner_lease")).scalar()
    assert db.settings.lease_seconds - 1 < float(ahead) <= db.settings.lease_seconds
    assert db.settings.owner_lease_seconds - 1 < float(owner_ahead) <= db.settings.owner_lease_seconds


def test_a_paused_zombie_in_an_open_transaction_is_cut_off_by_the_session_timeout(settings):
    """A worker session that idles in a transaction (SIGSTOP mid-batch) is
    killed before its lease length passes, releasing its row locks."""
    from framework.db import Database

    worker_db = Database(settings, role="worker")
    with worker_db.engine.connect() as conn:
        timeout = conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar()
        lock_timeout = conn.execute(sa.text("SHOW lock_timeout")).scalar()
    worker_db.dispose()
    assert timeout == "1s" and lock_timeout == "1s"  # lease 3 s -> a third of it


def test_job_key_makes_submit_idempotent_and_one_active_job_per_table(db):
    make_items(db, 10)
    req = fill("md5(b)", job_key="k1")
    first, again = submit(db, req), submit(db, req)
    assert first.created and not again.created and first.job_id == again.job_id
    with pytest.raises(jobs.ActiveJobExists):
        submit(db, fill("b", table="public.items", column="e"))


def test_job_row_round_trips_into_the_job_type_view(db):
    job_id, _ = started_fill(db, 1)
    with db.begin() as conn:
        job = jobs.get(db, conn, job_id)
    assert isinstance(job, Job)
    assert job.target_table == '"public"."items"' and job.key_column == '"id"'
    assert job.params["column"] == "d" and job.params["work_schema"] == "reorg"


def test_one_renewal_of_many_leases_brings_each_its_jobs_knobs_and_running_count(db):
    job_id, _ = started_fill(db, 3)
    with db.begin() as conn:
        claims = subtasks.claim(db, conn, "w1", limit=3)
    with db.begin() as conn:
        jobs.alter(db, conn, job_id, actor="t", batch_rows=77, max_rows_per_sec=None,
                   concurrency=None)
    with db.begin() as conn:
        alive = subtasks.renew(db, conn, claims[:2])
    assert sorted(alive) == sorted(c.id for c in claims[:2])
    assert {(a["job_state"], a["batch_rows"], a["running"]) for a in alive.values()} == {
        ("running", 77, 3)}


def test_a_renewal_that_meets_a_subtask_its_last_commit_just_finished_loses_no_lease(db):
    """A renewal that waited on the row of a finishing commit finds the
    subtask no longer running before its slot knows (the commit has not
    returned to it): a finish, not a lost lease. CI saw one counted as
    ``reorg_leases_lost_total{reason="renewal_refused"}`` by a healthy worker."""
    from prometheus_client import REGISTRY

    from framework import faults
    from framework.worker import ClaimSize, WorkerPool

    def refused() -> float:
        return REGISTRY.get_sample_value("reorg_leases_lost_total",
                                         {"reason": "renewal_refused"}) or 0.0

    job_id = started_fill(db, 1, expr="'x' || b", prepared=True)[0]
    faults.arm("worker.after_commit", "block")  # its one batch finished it
    pool = WorkerPool(db, "w1", slots=1)
    runner = threading.Thread(target=pool.run_claimed, args=(ClaimSize(limit=1),))
    before = refused()
    runner.start()
    try:
        faults.wait_blocked("worker.after_commit", timeout=30)
        with db.begin() as conn:
            state = conn.execute(db.sql("SELECT state FROM {s}.background_subtask "
                                        "WHERE job_id = :j"), {"j": job_id}).scalar_one()
        assert state == "succeeded"  # committed; the slot not yet told
        pool.renew_leases()
        assert refused() == before
    finally:
        faults.release("worker.after_commit")
        runner.join(30)
    assert [(r.outcome, r.rows) for r in pool.results] == [("succeeded", 10)]
