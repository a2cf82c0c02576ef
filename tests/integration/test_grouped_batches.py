"""Quick subtasks claimed together run their batches in one transaction
(``WorkerPool._run_grouped``), checkpointed by one fenced statement. Each
subtask's write still commits only with its own fenced checkpoint (DESIGN 2,
3): a subtask fenced out mid-way rolls the group back, its write never
commits, and the others' batches are written again without it."""

from __future__ import annotations

import threading

import sqlalchemy as sa
from support import TERMINAL, rows, started_fill, wait_state

from framework import control, faults
from framework.store import subtasks
from framework.submit import SubmitRequest, submit
from framework.worker import ClaimSize, WorkerPool


def _job_of_three_ranges(db) -> int:
    return started_fill(db, 3, expr="'x' || b", prepared=True)[0]


def _claims_three() -> ClaimSize:
    size = ClaimSize(limit=3)
    size.seconds = 0.001  # recent subtasks were quick: claim several (of any job)
    return size


def _subtasks(db, job_id: int) -> list[tuple]:
    return rows(db.engine, f"""SELECT start_key, state, curr_key, row_count, exec_id, epoch
                               FROM {db.schema}.background_subtask WHERE job_id = :j
                               ORDER BY start_key""", j=job_id)


def _filled(db) -> list[int]:
    return [r[0] for r in rows(db.engine, "SELECT id FROM items WHERE d IS NOT NULL ORDER BY id")]


def test_a_claims_quick_subtasks_commit_with_one_fenced_checkpoint_statement(db):
    job_id = _job_of_three_ranges(db)
    checkpoints: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "background_subtask st SET" in statement and "curr_key = b.curr_key" in statement:
            checkpoints.append(statement)

    pool = WorkerPool(db, "w1", slots=1)
    sa.event.listen(db.engine, "before_cursor_execute", capture)
    try:
        assert pool.run_claimed(_claims_three())
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", capture)
    assert [(r.outcome, r.rows, r.batches) for r in pool.results] == [("succeeded", 10, 1)] * 3
    assert len(checkpoints) == 1
    assert [(s[1], s[2], s[3]) for s in _subtasks(db, job_id)] == [
        ("succeeded", 11, 10), ("succeeded", 21, 10), ("succeeded", 31, 10)]
    assert _filled(db) == list(range(1, 31))


def test_a_subtask_fenced_out_mid_group_commits_nothing_and_the_others_commit_once(db):
    """The second subtask's lease is taken over by another worker after its
    batch wrote its rows, before the group's checkpoint: its rows must stay
    unwritten, the other two commit, each counted once."""
    job_id = _job_of_three_ranges(db)
    faults.arm("worker.before_checkpoint", "block@2")  # the 2nd subtask, its write done
    pool = WorkerPool(db, "w1", slots=1)
    runner = threading.Thread(target=pool.run_claimed, args=(_claims_three(),))
    runner.start()
    try:
        faults.wait_blocked("worker.before_checkpoint", timeout=30)
        with db.begin() as conn:  # its lease runs out; another worker claims it
            conn.execute(db.sql("""UPDATE {s}.background_subtask
                                   SET exec_expired = clock_timestamp() - interval '1s'
                                   WHERE job_id = :j AND start_key = '11'"""), {"j": job_id})
        with db.begin() as conn:
            taken = subtasks.claim(db, conn, "w2")
        assert [c.start_key for c in taken] == [11]
        faults.release("worker.before_checkpoint")
        runner.join(30)
        assert not runner.is_alive()
    finally:
        faults.disarm_all()
    outcomes = {r.subtask_id: r.outcome for r in pool.results}
    assert sorted(outcomes.values()) == ["lost", "succeeded", "succeeded"]
    assert outcomes[taken[0].id] == "lost"
    assert _subtasks(db, job_id) == [
        (1, "succeeded", 11, 10, "w1", 1),
        (11, "running", 11, 0, "w2", 2),  # the zombie's write and checkpoint never landed
        (21, "succeeded", 31, 10, "w1", 1)]
    assert _filled(db) == list(range(1, 11)) + list(range(21, 31))


def test_a_failing_batch_in_a_group_sends_each_subtask_down_its_own_path(db):
    """A batch error does not say whose batch broke: the group rolls back and
    each subtask runs alone (retry, fail or succeed on its own), rows counted once."""
    job_id = _job_of_three_ranges(db)
    faults.arm("worker.before_checkpoint", "raise@2")
    try:
        pool = WorkerPool(db, "w1", slots=1)
        assert pool.run_claimed(_claims_three())
    finally:
        faults.disarm_all()
    assert [r.outcome for r in pool.results] == ["succeeded"] * 3
    assert [(s[1], s[3]) for s in _subtasks(db, job_id)] == [("succeeded", 10)] * 3
    assert _filled(db) == list(range(1, 31))


def test_sql_update_in_groups_cancelled_mid_run_restores_the_table_exactly(db, start_node):
    """sql-update's quick subtasks write their batches (and before-images)
    several to a transaction; a cancel then restores every row by row
    version all the same (DESIGN 8)."""
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE g (id bigint PRIMARY KEY, v bigint)"))
        conn.execute(sa.text("INSERT INTO g SELECT i, i FROM generate_series(1, 2000) i"))
    before = rows(db.engine, "SELECT id, v FROM g ORDER BY id")
    grouped: list[int] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "curr_key = b.curr_key" in statement:
            grouped.append(len(parameters["ids"]))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", capture)
    try:
        job_id = submit(db, SubmitRequest("sql-update", {"table": "g", "set": "v=v*2"},
                                          rows_per_subtask=5, batch_rows=100)).job_id
        faults.arm("worker.after_batch", "block@150")  # 150 batches committed
        start_node("n1", slots=1)
        faults.wait_blocked("worker.after_batch", 60)
        control.cancel(db, job_id)
        faults.release("worker.after_batch")
        assert wait_state(db, job_id, TERMINAL, 60)["state"] == "cancelled"
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", capture)
    assert max(grouped) > 1  # batches of several subtasks did share a transaction
    assert rows(db.engine, "SELECT id, v FROM g ORDER BY id") == before


def test_a_finished_subtask_is_freed_without_the_garbage_collector(db):
    """A subtask's context and its slot's record of it form no reference
    cycle (no callback of the context refers to the record): they are freed as the
    slot lets go of them, not left for the collector, whose sweeps were a
    fifth of a busy worker's CPU (issue 9)."""
    import gc

    from framework.worker import _Held

    job_id = _job_of_three_ranges(db)
    pool = WorkerPool(db, "w1", slots=1)
    gc.collect()
    gc.disable()
    try:
        assert pool.run_claimed(_claims_three())
        left = [o for o in gc.get_objects() if isinstance(o, _Held)]
    finally:
        gc.enable()
    assert [r.outcome for r in pool.results] == ["succeeded"] * 3
    assert left == []
    wait_state(db, job_id, "running")  # untouched by the pool: only the owner advances it


def test_a_subtask_stopped_before_a_group_fenced_out_is_handed_back_at_once(db):
    """The first subtask of the claim is asked to stop (a pause reaching it
    first: the renewal stops a node's subtasks one after another) before the
    group's first pass; the second is fenced out in that pass, so the group
    runs a second pass. The stopped subtask must still be handed back at
    once (pending, its attempt given back), not left running under a lease
    nobody renews until it expires."""
    job_id = _job_of_three_ranges(db)
    pool = WorkerPool(db, "w1", slots=1)
    hold = pool._hold

    def hold_and_stop_the_first(claim, renewed_at):
        held = hold(claim, renewed_at)
        if claim.start_key == 1:
            held.ctx.stop("job pausing", hard=False)
        return held

    pool._hold = hold_and_stop_the_first  # type: ignore[method-assign]
    faults.arm("worker.before_checkpoint", "block@1")  # the 2nd subtask's write, 1st pass
    runner = threading.Thread(target=pool.run_claimed, args=(_claims_three(),))
    runner.start()
    try:
        faults.wait_blocked("worker.before_checkpoint", timeout=30)
        with db.begin() as conn:  # its lease runs out; another worker claims it
            conn.execute(db.sql("""UPDATE {s}.background_subtask
                                   SET exec_expired = clock_timestamp() - interval '1s'
                                   WHERE job_id = :j AND start_key = '11'"""), {"j": job_id})
        with db.begin() as conn:
            taken = subtasks.claim(db, conn, "w2")
        assert [c.start_key for c in taken] == [11]
        faults.release("worker.before_checkpoint")
        runner.join(30)
        assert not runner.is_alive()
    finally:
        faults.disarm_all()
    assert [s[:5] for s in _subtasks(db, job_id)] == [
        (1, "pending", 1, 0, None),  # handed back: any worker may take it now
        (11, "running", 11, 0, "w2"),
        (21, "succeeded", 31, 10, "w1")]
    assert sorted(r.outcome for r in pool.results) == ["lost", "released", "succeeded"]
