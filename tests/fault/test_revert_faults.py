"""Rollback resumes (DESIGN 13) under faults, with real ``reorg worker``
processes: a worker killed inside a restore batch, owners killed while they
plan the revert and while revert subtasks run, a worker killed while it builds
the indexes the restore needs. Every test checks the table
against its pre-job contents afterwards, and that each restore batch counted
exactly once (DESIGN 3)."""

from __future__ import annotations

import signal

import pytest
import sqlalchemy as sa
from support import job_of, rows, table_rows, wait_state, wait_until
from test_spark_faults import _java_children

from framework import control
from framework.records import STEP_REVERT
from framework.store import owner_lease
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault
HOLD = "worker.after_batch=block"


def _items_with_old_values(db, count: int) -> list[tuple]:
    """``items`` whose ``c`` the job overwrites: text, and NULL for every 5th
    key (restored through the batch records, not an image)."""
    with db.begin() as conn:
        conn.execute(sa.text(f"""
            CREATE TABLE items (id bigint PRIMARY KEY, a int, b text, c text);
            INSERT INTO items SELECT g, g % 7, 'b' || g,
                                     CASE WHEN g % 5 = 0 THEN NULL ELSE 'orig-' || g END
            FROM generate_series(1, {count}) g"""))
    return table_rows(db)


def _overwrite(db, **knobs) -> int:
    return submit(db, SubmitRequest("sql-update", {"table": "items",
                                                   "set": "c=coalesce(upper(c), 'NEW')"},
                                    **knobs)).job_id


def _revert_subtasks(db, job_id: int) -> list[tuple]:
    """(id, start_key, end_key, curr_key, row_count, attempts, exec_id, state)
    of the job's revert subtasks, live or moved to history."""
    select = ("SELECT id, start_key, end_key, curr_key, row_count, attempts, exec_id, state "
              "FROM {s}.%s WHERE job_id = :j AND step = :step")
    return sorted(rows(db, select % "background_subtask", j=job_id, step=STEP_REVERT)
                  + rows(db, select % "background_subtask_history", j=job_id, step=STEP_REVERT))


def _owner(db) -> dict:
    with db.begin() as conn:
        return owner_lease.current(db, conn)


def test_kill_9_of_a_worker_mid_restore_batch_resumes_from_curr_key(db, workers, start_node):
    before = _items_with_old_values(db, 4_000)
    # The owner (in this process, no slots) outlives every worker process killed here.
    start_node("owner", slots=0)
    wait_until(lambda: _owner(db)["owner_id"] == "owner", 30, "the test's node to own")
    job_id = _overwrite(db, rows_per_subtask=1_000, batch_rows=100)
    forward = workers.start("forward", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 60, count=2)  # two ranges wrote a batch
    changed = job_of(db, job_id)["rows_done"]
    assert changed == 200
    # Restore batches of 20 keys: several per revert subtask.
    control.alter(db, job_id, batch_rows=20)
    control.cancel(db, job_id)
    forward.signal(signal.SIGKILL)
    forward.proc.wait(10)
    # The victim commits its first restore batch and is held inside its second.
    victim = workers.start("victim", slots=1, faults="worker.in_restore_batch=block@2")
    workers.gates.wait_blocked("worker.in_restore_batch", 90)
    held = [r for r in _revert_subtasks(db, job_id) if r[6] == "victim" and r[7] == "running"]
    assert len(held) == 1
    sub_id, start, end, curr = held[0][:4]
    assert start < curr < end, "one restore batch committed, the range not done"
    status = job_of(db, job_id)
    assert status["state"] == "reverting" and status["step"] == STEP_REVERT
    assert status["revert_total"] == 2 and status["revert_percent"] < 100
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    assert table_rows(db) != before  # half restored: the victim's batch rolled back
    workers.start("heir")
    assert wait_state(db, job_id)["state"] == "cancelled"
    assert table_rows(db) == before
    reverts = _revert_subtasks(db, job_id)
    assert [(r[1], r[2]) for r in reverts] == [(1, 101), (1001, 1101)]
    (resumed,) = [r for r in reverts if r[0] == sub_id]
    assert resumed[5] == 2 and resumed[6] == "heir"  # the heir's claim was its 2nd attempt
    # Exactly once: every changed row restored once, no batch counted twice.
    assert sum(r[4] for r in reverts) == changed
    assert all(r[7] == "succeeded" for r in reverts)


def test_kill_9_of_the_worker_building_the_restore_indexes_leaves_none_and_the_heir_builds(
        db, workers, start_node):
    """The before-images' indexes are built by a revert subtask in one
    transaction (issue 12.3): a builder killed inside it leaves no index, the
    lock it held goes with its session, and the heir builds them."""
    before = _items_with_old_values(db, 3_000)
    start_node("owner", slots=0)
    wait_until(lambda: _owner(db)["owner_id"] == "owner", 30, "the test's node to own")
    job_id = _overwrite(db, rows_per_subtask=1_000, batch_rows=100)
    forward = workers.start("forward", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 60, count=2)
    control.cancel(db, job_id)
    forward.signal(signal.SIGKILL)
    forward.proc.wait(10)
    builder = workers.start("builder", slots=1, faults="worker.in_restore_index=block")
    workers.gates.wait_blocked("worker.in_restore_index", 90)
    (held,) = [r for r in _revert_subtasks(db, job_id) if r[6] == "builder"]
    assert held[1] == held[3]  # no restore batch before the indexes
    builder.signal(signal.SIGKILL)
    builder.proc.wait(10)
    images_index = f"{db.schema}.sql_update_{job_id}_images_k"
    assert rows(db, "SELECT to_regclass(:n)", n=images_index) == [(None,)]
    workers.start("heir")
    assert wait_state(db, job_id)["state"] == "cancelled"
    assert table_rows(db) == before
    reverts = _revert_subtasks(db, job_id)
    assert all(r[7] == "succeeded" for r in reverts) and len(reverts) == 2
    (rebuilt,) = [r for r in reverts if r[0] == held[0]]
    assert rebuilt[5] == 2 and rebuilt[6] == "heir"  # the heir's claim was its 2nd attempt


def test_owners_killed_while_planning_and_while_reverting_hand_the_revert_on(db, workers):
    before = _items_with_old_values(db, 3_000)
    job_id = _overwrite(db, rows_per_subtask=500, batch_rows=50)
    # o1 owns and works; it dies (like kill -9) inside the fenced transaction
    # that inserts the revert subtasks: nothing of it may commit.
    o1 = workers.start("o1", faults=f"{HOLD},owner.after_revert_plan=exit")
    workers.gates.wait_blocked("worker.after_batch", 60, count=2)
    assert _owner(db)["owner_id"] == "o1"
    control.alter(db, job_id, batch_rows=10)
    control.cancel(db, job_id)
    workers.gates.release("worker.after_batch")
    assert o1.proc.wait(60) == 137
    assert _revert_subtasks(db, job_id) == []
    # o2 takes over, plans the revert, and is killed inside a restore batch.
    o2 = workers.start("o2", slots=1, faults="worker.in_restore_batch=block@2")
    workers.gates.wait_blocked("worker.in_restore_batch", 90)
    o2_term = _owner(db)
    assert o2_term["owner_id"] == "o2"
    planned = _revert_subtasks(db, job_id)
    assert planned and any(r[1] < r[3] for r in planned)  # a restore batch committed
    o2.signal(signal.SIGKILL)
    o2.proc.wait(10)
    workers.start("o3")
    done = wait_state(db, job_id)
    assert done["state"] == "cancelled"
    assert table_rows(db) == before
    events = control.events(db, job_id)
    plans = [e for e in events if (e["detail"] or "").startswith("revert step: ")]
    assert [e["actor"] for e in plans] == [f"owner o2 rev {o2_term['revision']}"]
    assert events[-1]["to_state"] == "cancelled" and events[-1]["actor"].startswith("owner o3")
    reverts = _revert_subtasks(db, job_id)
    assert [r[:3] for r in reverts] == [r[:3] for r in planned]  # planned once, never redone
    assert sum(r[4] for r in reverts) == done["rows_done"]


@pytest.mark.spark
@pytest.mark.matrix
def test_kill_9_mid_restore_of_a_spark_backfill_resumes_without_spark(db, workers, start_node):
    """The backfill's forward batches run on Spark; its restore is PostgreSQL
    alone: the workers that revert never start Spark.

    Long form (matrix). Short forms in CI: the same kill -9 mid restore batch,
    ::test_kill_9_of_a_worker_mid_restore_batch_resumes_from_curr_key above;
    a revert subtask never warms its type up (starts Spark),
    tests/unit/test_run_step.py."""
    before = _items_with_old_values(db, 6_000)
    start_node("owner", slots=0)
    wait_until(lambda: _owner(db)["owner_id"] == "owner", 30, "the test's node to own")
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=upper(b)"},
                                      rows_per_subtask=2_000, batch_rows=500)).job_id
    forward = workers.start("spark", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 180, count=2)
    control.alter(db, job_id, batch_rows=100)
    control.cancel(db, job_id)
    forward.signal(signal.SIGKILL)
    forward.proc.wait(10)
    no_spark = {"REORG_SPARK_WARMUP": "false"}
    victim = workers.start("victim", slots=1, faults="worker.in_restore_batch=block@2",
                           **no_spark)
    workers.gates.wait_blocked("worker.in_restore_batch", 90)
    (held,) = [r for r in _revert_subtasks(db, job_id) if r[6] == "victim" and r[7] == "running"]
    assert held[1] < held[3] < held[2]
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    heir = workers.start("heir", **no_spark)
    assert wait_state(db, job_id, timeout=120)["state"] == "cancelled"
    assert table_rows(db) == before
    (resumed,) = [r for r in _revert_subtasks(db, job_id) if r[0] == held[0]]
    assert resumed[5] == 2 and resumed[6] == "heir" and resumed[7] == "succeeded"
    assert heir.alive() and _java_children(heir.pid) == []  # no JVM: no Spark started


@pytest.mark.parametrize("outcome", ["succeeded", "cancelled"])
def test_kill_9_inside_a_batch_over_null_old_values_then_the_job_ends_exact(
        db, workers, start_node, outcome):
    """Old values all NULL up to key 2,000 (batches run the guarded bare
    UPDATE and keep no image), then a value in all but every 5th row. A
    worker dies like kill -9 inside its 3rd batch, written and not yet
    checkpointed; the heir redoes it from ``curr_key``. Every row ends as the
    expression computes it once, or, cancelled, as it was before the job."""
    with db.begin() as conn:
        conn.execute(sa.text("""
            CREATE TABLE items (id bigint PRIMARY KEY, a int, b text, c text);
            INSERT INTO items SELECT g, g % 7, 'b' || g,
                   CASE WHEN g <= 2000 OR g % 5 = 0 THEN NULL ELSE 'orig-' || g END
            FROM generate_series(1, 4000) g"""))
    before = table_rows(db)
    start_node("owner", slots=0)
    wait_until(lambda: _owner(db)["owner_id"] == "owner", 30, "the test's node to own")
    job_id = _overwrite(db, rows_per_subtask=1_000, batch_rows=100)
    victim = workers.start("victim", faults="worker.before_checkpoint=exit@3")
    assert victim.proc.wait(60) == 137
    if outcome == "succeeded":
        workers.start("heir")
        assert wait_state(db, job_id)["state"] == "succeeded"
        assert table_rows(db) == [(i, a, b, c.upper() if c else "NEW") for i, a, b, c in before]
        return
    workers.start("heir", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 90, count=2)
    control.cancel(db, job_id)
    workers.gates.release("worker.after_batch")
    assert wait_state(db, job_id)["state"] == "cancelled"
    assert table_rows(db) == before
