"""A claim's size belongs to one job: a slot sized by one job's quick
subtasks claims one subtask of any other job, however many it would take of
the first (``subtasks.claim(..., sized_job=)``, ``worker.ClaimSize``)."""

from __future__ import annotations

import pytest
from support import started_fill

from framework.store import subtasks
from framework.worker import ClaimSize, WorkerPool

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def _states(db, job_id: int) -> list[str]:
    with db.begin() as conn:
        return list(conn.execute(db.sql(
            "SELECT state FROM {s}.background_subtask WHERE job_id = :id ORDER BY ordinal"),
            {"id": job_id}).scalars())


def test_a_limit_sized_by_another_job_claims_one_subtask(db):
    job_id, _ = started_fill(db, 6)
    with db.begin() as conn:
        assert len(subtasks.claim(db, conn, "w1", limit=4, sized_job=job_id + 1)) == 1
        assert len(subtasks.claim(db, conn, "w1", limit=4, sized_job=job_id)) == 4
        assert len(subtasks.claim(db, conn, "w1", limit=4)) == 1  # unsized: any job, the last one


def test_a_slot_fresh_from_quick_subtasks_takes_one_of_the_next_job(db):
    quick, term = started_fill(db, 1, prepared=True)
    pool = WorkerPool(db, "w1", slots=1)
    size = ClaimSize(limit=8)
    assert pool.run_claimed(size)  # the quick job's one subtask, timed
    assert size.job_id == quick
    size.seconds = 0.0001  # as quick as a no-op: 8 of that job a claim
    nxt, _ = started_fill(db, 5, term=term, table="items2", prepared=True)
    assert pool.run_claimed(size)
    assert _states(db, nxt) == ["succeeded"] + ["pending"] * 4
    assert size.job_id == nxt
