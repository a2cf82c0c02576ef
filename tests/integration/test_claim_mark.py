"""The owner's claim mark (``steps.mark_claim_from``): claims scan a job
step's claimable index from the first pending or running ordinal, past the
dead entries of finished subtasks, and never miss a claimable subtask."""

from __future__ import annotations

import pytest
from support import job_of, started_fill

from framework import owner as owner_module
from framework.owner import Owner
from framework.store import steps, subtasks

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def _mark(db, job_id: int) -> tuple[int | None, int | None]:
    with db.begin() as conn:
        row = conn.execute(db.sql("SELECT claim_from_step, claim_from FROM {s}.jobs "
                                  "WHERE id = :id"), {"id": job_id}).one()
    return row[0], row[1]


def _ordinals(db, job_id: int) -> list[int]:
    with db.begin() as conn:
        return list(conn.execute(db.sql(
            "SELECT ordinal FROM {s}.background_subtask WHERE job_id = :id ORDER BY ordinal"),
            {"id": job_id}).scalars())


def _finish(db, claim) -> None:
    with db.begin() as conn:
        assert subtasks.checkpoint_one(db, conn, claim, claim.end_key, 10).state == "succeeded"


def test_the_mark_follows_the_first_claimable_subtask_and_claims_start_there(db):
    job_id, term = started_fill(db, 5)
    ords = _ordinals(db, job_id)
    with db.begin() as conn:
        first_two = subtasks.claim(db, conn, "w1", limit=2)
    for claim in first_two:
        _finish(db, claim)
    with db.begin() as conn:
        steps.mark_claim_from(db, conn, term, job_id, 1)
    assert _mark(db, job_id) == (1, ords[2])
    # The claim starts at the mark: moved on by hand past the third range, it
    # claims the fourth (the third waits for the owner's next mark).
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET claim_from = :o WHERE id = :id"),
                     {"o": ords[3], "id": job_id})
        fourth, = subtasks.claim(db, conn, "w1")
    assert fourth.start_key == 31
    with db.begin() as conn:
        steps.mark_claim_from(db, conn, term, job_id, 1)
        third, = subtasks.claim(db, conn, "w1")
    assert third.start_key == 21
    # A mark of another step is stale: the claim scans from the start.
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET claim_from_step = 7, claim_from = :o "
                            "WHERE id = :id"), {"o": ords[4] + 1, "id": job_id})
        fifth, = subtasks.claim(db, conn, "w1")
    assert fifth.start_key == 41


def test_a_running_subtask_at_the_mark_is_claimed_again_once_its_lease_expires(db):
    job_id, term = started_fill(db, 3)
    with db.begin() as conn:
        held, = subtasks.claim(db, conn, "w1")
        steps.mark_claim_from(db, conn, term, job_id, 1)
    assert _mark(db, job_id) == (1, _ordinals(db, job_id)[0])
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.background_subtask SET exec_expired = "
                            "clock_timestamp() - interval '1s' WHERE id = :id"), {"id": held.id})
        again = subtasks.claim(db, conn, "w2", limit=3)
    assert [c.start_key for c in again] == [1, 11, 21]
    assert again[0].id == held.id and again[0].epoch == held.epoch + 1


def test_a_retried_failed_subtask_below_the_mark_is_claimable_at_once(db):
    job_id, term = started_fill(db, 3)
    with db.begin() as conn:
        first, = subtasks.claim(db, conn, "w1")
        assert subtasks.fail_if_held(db, conn, first, "boom")
        steps.mark_claim_from(db, conn, term, job_id, 1)
    assert _mark(db, job_id)[1] == _ordinals(db, job_id)[1]
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET state = 'paused' WHERE id = :id"),
                     {"id": job_id})
        assert steps.requeue_failed(db, conn, job_id) == 1
        # The owner leaves the mark of a job that is not running alone.
        steps.mark_claim_from(db, conn, term, job_id, 1)
        conn.execute(db.sql("UPDATE {s}.jobs SET state = 'running' WHERE id = :id"),
                     {"id": job_id})
    assert _mark(db, job_id) == (None, _ordinals(db, job_id)[1])
    with db.begin() as conn:
        retried, = subtasks.claim(db, conn, "w2")
    assert retried.id == first.id


def test_the_owners_quick_look_starts_at_the_mark_but_only_a_full_read_advances(db):
    """The tick's step snapshot probes pending and running subtasks from the
    mark. A mark past a pending subtask (never written so, forced here) could
    only make the quick look say done, and the advance would re-read the
    whole step (DESIGN 7); the tick puts the mark right before it looks, and
    the job stays running."""
    job_id, term = started_fill(db, 3)
    ords = _ordinals(db, job_id)
    with db.begin() as conn:
        first, = subtasks.claim(db, conn, "w1")
    _finish(db, first)
    with db.begin() as conn:
        steps.mark_claim_from(db, conn, term, job_id, 1)
    assert _mark(db, job_id) == (1, ords[1])
    with db.begin() as conn:
        snap = steps.step_snapshot(db, conn, job_id, 1, from_mark=True)
        assert snap.pending and not snap.all_succeeded
        # Past the last ordinal: the quick look finds nothing pending...
        conn.execute(db.sql("UPDATE {s}.jobs SET claim_from = :o WHERE id = :id"),
                     {"o": ords[-1] + 1, "id": job_id})
        assert not steps.step_snapshot(db, conn, job_id, 1, from_mark=True).pending
        assert steps.step_snapshot(db, conn, job_id, 1).pending  # ...the full read does
    owner = Owner(db, "owner-a")
    owner.term = term
    owner.keep_term()
    owner.tick()
    assert job_of(db, job_id)["state"] == "running"  # the advance's full read saw them
    assert _mark(db, job_id) == (1, ords[1])  # and the tick put the mark right


def test_the_owner_marks_from_its_last_mark_and_from_the_start_every_few_seconds(db):
    """Most ticks probe for the next mark from the current one (not through
    every finished subtask's dead entries); one every HOUSEKEEPING_SECONDS
    probes from the step's start, so a wrong mark (forced here) is put right."""
    job_id, term = started_fill(db, 3)
    ords = _ordinals(db, job_id)
    now = [1000.0]
    owner = Owner(db, "owner-a", clock=lambda: now[0])
    owner.term = term
    owner.keep_term()
    owner.tick()  # the first probe is from the start
    assert _mark(db, job_id) == (1, ords[0])
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET claim_from = :o WHERE id = :id"),
                     {"o": ords[2], "id": job_id})
    now[0] += 0.5
    owner.keep_term()
    owner.tick()
    assert _mark(db, job_id) == (1, ords[2])  # from the mark: it stays
    now[0] += owner_module.HOUSEKEEPING_SECONDS
    owner.keep_term()
    owner.tick()
    assert _mark(db, job_id) == (1, ords[0])  # from the start: put right
    assert job_of(db, job_id)["state"] == "running"
