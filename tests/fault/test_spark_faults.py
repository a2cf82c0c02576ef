"""The Spark data plane under faults, with real ``reorg worker`` processes
running ``backfill`` subtasks on their own SparkSessions (DESIGN 2, 3, 8).

CI runs the JVM's kill -9; the others are long forms (``matrix``) of faults
whose short forms CI runs, named in each docstring."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa
from support import held_by, job_of, make_items, table_rows, wait_state, wait_until
from support.processes import proc_state
from test_process_faults import HOLD, q

from framework import control
from framework.submit import SubmitRequest, submit

pytestmark = [pytest.mark.fault, pytest.mark.spark]


def versions(db) -> list[tuple]:
    """(id, xmin, c) of every row: any committed write changes a row's xmin."""
    with db.begin() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT id, xmin::text, c FROM items ORDER BY id"))]


@pytest.mark.matrix
def test_kill_9_in_the_middle_of_a_spark_batch_resumes_and_matches_the_oracle(db, workers):
    """Long form (matrix). Short forms in CI: a worker killed mid-subtask
    resumes from ``curr_key`` with every batch counted once,
    test_process_faults.py::test_kill_9_mid_subtask_resumes_from_curr_key_and_matches_the_oracle;
    a Spark batch cut off mid-flight is retried from its checkpoint, counted once,
    ::test_kill_9_of_the_workers_jvm_restarts_spark_and_the_job_succeeds below."""
    make_items(db, 40_000)
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=10_000, batch_rows=1_000)).job_id
    victim = workers.start("victim", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 120)  # a Spark batch committed
    progressed = [r for r in held_by(db, "victim") if r.curr_key > r.start_key]
    assert progressed
    victim.signal(signal.SIGKILL)  # a Spark read of the next batch is in flight (pipelined)
    victim.proc.wait(10)
    workers.start("heir")
    assert wait_state(db, job_id, timeout=180)["state"] == "succeeded"
    assert q(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)")[0][0] == 0
    total = q(db, "SELECT sum(row_count) FROM (SELECT row_count FROM {s}.background_subtask "
                  "UNION ALL SELECT row_count FROM {s}.background_subtask_history) x")[0][0]
    assert total == 40_000  # no committed batch applied twice
    attempts = q(db, "SELECT attempts FROM {s}.background_subtask WHERE id = :i UNION ALL "
                     "SELECT attempts FROM {s}.background_subtask_history WHERE id = :i",
                 i=progressed[0].id)
    assert attempts == [(2,)]


@pytest.mark.matrix
def test_sigstop_mid_merge_past_the_lease_never_commits(db, workers):
    """Long form (matrix). Short forms in CI: a worker process frozen inside
    its batch's transaction past the lease lands nothing after SIGCONT,
    test_process_faults.py::test_sigstop_past_the_lease_mid_batch_then_sigcont_lands_nothing;
    a Spark subtask whose lease is taken mid-run commits nothing more,
    tests/integration/test_spark_backfill.py::test_lost_lease_mid_run_leaves_the_batch_uncommitted."""
    make_items(db, 12_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old'"))
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=6_000, batch_rows=1_000)).job_id
    # Stops itself inside its 2nd merge transaction, after the merge statement,
    # before the checkpoint: the batch's rows are written and locked, uncommitted.
    zombie = workers.start("zombie", slots=1, faults="worker.before_checkpoint=stop@2")
    wait_until(lambda: proc_state(zombie.pid) == "T", 120, "zombie to stop itself mid-merge")
    (sub_id, _, _), = q(db, "SELECT id, start_key, curr_key FROM {s}.background_subtask "
                            "WHERE exec_id = 'zombie'")
    workers.start("heir")
    assert wait_state(db, job_id, timeout=180)["state"] == "succeeded"
    assert q(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)")[0][0] == 0
    settled = versions(db)
    zombie.signal(signal.SIGCONT)
    wait_until(lambda: f"subtask {sub_id} " in zombie.log() and ": lost" in zombie.log(), 60,
               "zombie to notice it lost the subtask")
    assert versions(db) == settled  # not one row written by the zombie after resuming


@pytest.mark.matrix
def test_cancel_of_a_spark_backfill_restores_the_table_exactly(db, workers):
    """Long form (matrix). Short forms in CI: a cancel with worker processes,
    test_process_faults.py::test_cancel_with_worker_processes_restores_the_table_exactly;
    of a Spark backfill on in-process nodes,
    tests/integration/test_spark_framework.py::test_cancel_mid_run_restores_the_table."""
    make_items(db, 30_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'orig-' || id WHERE id % 3 <> 0"))
    before = table_rows(db)
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=upper(b)"},
                                      rows_per_subtask=5_000, batch_rows=1_000)).job_id
    workers.start("w1", faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 120, count=2)  # both slots wrote a batch
    assert job_of(db, job_id)["rows_done"] >= 2_000
    control.cancel(db, job_id)
    workers.gates.release("worker.after_batch")
    assert wait_state(db, job_id, timeout=120)["state"] == "cancelled"
    assert table_rows(db) == before



def _java_children(pid: int) -> list[int]:
    """Direct children of ``pid`` that run java (the JVM PySpark launched),
    whichever of its threads started them."""
    children = {int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()}
    return sorted(c for c in children if Path(f"/proc/{c}/exe").resolve().name == "java")


def test_kill_9_of_the_workers_jvm_restarts_spark_and_the_job_succeeds(db, workers):
    """Only the JVM dies (as under the OOM killer) while both slots run Spark
    batches: the worker notices, starts a new SparkSession and retries both
    subtasks from their checkpoints; the job succeeds on the same worker and
    every row equals the oracle."""
    make_items(db, 40_000)
    job_id = submit(db, SubmitRequest("backfill", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=10_000, batch_rows=1_000)).job_id
    worker = workers.start("lone", slots=2, faults=HOLD)
    workers.gates.wait_blocked("worker.after_batch", 120, count=2)  # both slots committed one
    assert len([r for r in held_by(db, "lone") if r.curr_key > r.start_key]) == 2
    (jvm,) = wait_until(lambda: _java_children(worker.pid), 10, "the worker's JVM")
    os.kill(jvm, signal.SIGKILL)
    workers.gates.release("worker.after_batch")  # each slot's next batch meets the dead JVM
    wait_until(lambda: "starting a new session" in worker.log(), 60, "the worker to restart Spark")
    assert wait_state(db, job_id, timeout=180)["state"] == "succeeded", worker.log()[-3000:]
    assert worker.alive()
    assert q(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)")[0][0] == 0
    total = q(db, "SELECT sum(row_count) FROM (SELECT row_count FROM {s}.background_subtask "
                  "UNION ALL SELECT row_count FROM {s}.background_subtask_history) x")[0][0]
    assert total == 40_000  # no committed batch applied twice
