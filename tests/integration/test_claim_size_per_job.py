"""A claim's size belongs to one job: a slot sized by one job's quick
subtasks claims one subtask of any other job, however many it would take of
the first (``subtasks.claim(..., sized_job=)``, ``worker.ClaimSize``)."""

from __future__ import annotations

from support import execute, fill, make_items

from framework.store import jobs, owner_lease, steps, subtasks
from framework.submit import submit
from framework.worker import ClaimSize, WorkerPool


def _term(db) -> owner_lease.OwnerTerm:
    with db.begin() as conn:
        return owner_lease.campaign(db, conn, "owner-a")


def _running_job(db, term: owner_lease.OwnerTerm, table: str, n_ranges: int) -> int:
    make_items(db, 10 * n_ranges, table=table)
    execute(db, f"ALTER TABLE {table} ADD COLUMN d text")  # the prepare this test skips
    job_id = submit(db, fill("md5(b)", table=table)).job_id
    with db.begin() as conn:
        steps.insert_ranges(db, conn, term, job_id, 1,
                            [(1 + 10 * i, 11 + 10 * i) for i in range(n_ranges)])
        jobs.start(db, conn, term, job_id, actor="t", step=1, row_estimate=10 * n_ranges,
                   run_on_node=None, detail="test")
    return job_id


def _states(db, job_id: int) -> list[str]:
    with db.begin() as conn:
        return list(conn.execute(db.sql(
            "SELECT state FROM {s}.background_subtask WHERE job_id = :id ORDER BY ordinal"),
            {"id": job_id}).scalars())


def test_a_limit_sized_by_another_job_claims_one_subtask(db):
    job_id = _running_job(db, _term(db), "items", 6)
    with db.begin() as conn:
        assert len(subtasks.claim(db, conn, "w1", limit=4, sized_job=job_id + 1)) == 1
        assert len(subtasks.claim(db, conn, "w1", limit=4, sized_job=job_id)) == 4
        assert len(subtasks.claim(db, conn, "w1", limit=4)) == 1  # unsized: any job, the last one


def test_a_slot_fresh_from_quick_subtasks_takes_one_of_the_next_job(db):
    term = _term(db)
    quick = _running_job(db, term, "items", 1)
    pool = WorkerPool(db, "w1", slots=1)
    size = ClaimSize(limit=8)
    assert pool.run_claimed(size)  # the quick job's one subtask, timed
    assert size.job_id == quick
    size.seconds = 0.0001  # as quick as a no-op: 8 of that job a claim
    nxt = _running_job(db, term, "items2", 5)
    assert pool.run_claimed(size)
    assert _states(db, nxt) == ["succeeded"] + ["pending"] * 4
    assert size.job_id == nxt
