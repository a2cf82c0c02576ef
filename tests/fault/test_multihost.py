"""Faults of the network and of PostgreSQL, with every ``reorg worker`` on a
host of its own (a network namespace reaching PostgreSQL through a bridge,
support.hosts). Each test checks the table afterwards: every row applied
exactly once, the committed batch rows summing to the table (DESIGN 2, 3, 4),
and reports its takeover time and the work redone (docs/reliability.md)."""

from __future__ import annotations

import signal
import time

import pytest
from support import execute, held_by, job_of, scalar, wait_state, wait_until
from support.oracle import (
    COUNTED,
    assert_exactly_once,
    counted_fill,
    holder,
    make_counted_items,
    report,
    timed,
    timed_takeover,
)

from framework.store import owner_lease
from framework.submit import submit

pytestmark = [pytest.mark.fault]
# Each slot of a worker armed with it stops after its first committed batch.
HOLD = "worker.after_batch=block"


def progressed(db, node_id: str):
    """A subtask ``node_id`` holds with at least one committed batch."""
    return next((r for r in held_by(db, node_id, live=False) if r.curr_key > r.start_key), None)


def test_worker_host_partitioned_mid_batch_past_the_lease_then_healed(cluster):
    db = cluster.db
    make_counted_items(db, 8_000)
    job_id = submit(db, counted_fill(rows_per_subtask=2_000, batch_rows=200, concurrency=2)).job_id
    far = cluster.start("far", slots=1, faults=HOLD)
    cluster.workers.gates.wait_blocked("worker.after_batch", 60)
    sub = progressed(db, "far")
    assert sub, "far committed a batch"
    cluster.host("far").partition()
    cut = time.monotonic()
    cluster.workers.gates.release("worker.after_batch")  # far's next batch meets the partition
    cluster.start("near", slots=2)
    takeover = timed_takeover(db, sub.id, "far", cut)
    assert wait_state(db, job_id)["state"] == "succeeded"
    settled = assert_exactly_once(db)
    cluster.host("far").heal()
    # Healed, far learns it lost the subtask; nothing it still had in flight lands.
    wait_until(lambda: f"subtask {sub.id} " in far.log() and ": lost" in far.log(), 60,
               "far to give the subtask up")
    assert assert_exactly_once(db).table == settled.table
    assert holder(db, sub.id) == "near"
    report("worker host partitioned past the lease", job="test-fill", takeover_s=takeover,
           rows_redone=settled.redone, rows=settled.rows)


def test_commit_outcome_unknown_counts_the_batch_once(cluster):
    """The replies from PostgreSQL stop after the worker sent COMMIT: the batch
    is committed but the worker cannot know it. The heir resumes after it."""
    db = cluster.db
    make_counted_items(db, 6_000)
    job_id = submit(db, counted_fill(rows_per_subtask=1_500, batch_rows=250)).job_id
    # Blocks with the checkpoint written and the transaction open; COMMIT is next.
    far = cluster.start("far", slots=1, faults="worker.after_checkpoint=block@2")
    cluster.workers.gates.wait_blocked("worker.after_checkpoint", 60)
    (sub_id, _, before), = held_by(db, "far")
    cluster.host("far").partition("in")  # requests still arrive, replies are lost
    cut = time.monotonic()
    cluster.workers.gates.release("worker.after_checkpoint")
    # PostgreSQL received the COMMIT: the batch's checkpoint is visible.
    wait_until(lambda: scalar(db, "SELECT curr_key FROM {s}.background_subtask WHERE id = :i",
                              i=sub_id) > before, 30, "far's COMMIT to land")
    cluster.start("near", slots=2)
    takeover = timed_takeover(db, sub_id, "far", cut)
    assert wait_state(db, job_id)["state"] == "succeeded"
    settled = assert_exactly_once(db)
    cluster.host("far").heal()
    wait_until(lambda: not far.alive() or f"subtask {sub_id} " in far.log(), 60,
               "far to settle the subtask it lost")
    assert assert_exactly_once(db).table == settled.table
    report("commit outcome unknown (replies dropped after COMMIT)", job="test-fill",
           takeover_s=takeover, rows_redone=settled.redone, rows=settled.rows)


def _owner(db):
    with db.begin() as conn:
        return owner_lease.current(db, conn)


def test_owner_host_partitioned_a_new_owner_finishes_the_job(cluster):
    db = cluster.db
    make_counted_items(db, 8_000)
    job_id = submit(db, counted_fill(rows_per_subtask=1_000, batch_rows=200)).job_id
    cluster.start("a", faults=HOLD)
    wait_until(lambda: _owner(db)["owner_id"] == "a" and job_of(db, job_id)["state"] == "running",
               60, "a to own the job")
    cluster.start("b", faults=HOLD)
    cluster.workers.gates.wait_blocked("worker.after_batch", 60, count=4)  # both worked
    term = _owner(db)
    cluster.host("a").partition()
    cut = time.monotonic()
    cluster.workers.gates.release("worker.after_batch")
    takeover = timed(lambda: (o := _owner(db))["owner_id"] == "b" and o["live"], cut, 60,
                     "b to become owner")
    assert _owner(db)["revision"] > term["revision"]
    assert wait_state(db, job_id)["state"] == "succeeded"
    done = timed(lambda: True, cut, 1, "")
    settled = assert_exactly_once(db)
    cluster.host("a").heal()
    actor = scalar(db, "SELECT actor FROM {s}.job_events WHERE job_id = :j "
                       "AND to_state = 'succeeded'", j=job_id)
    assert actor.startswith("owner b ")
    # Healed, the deposed owner writes nothing: a new term, if any, is a higher revision.
    wait_until(lambda: _owner(db)["revision"] >= term["revision"] + 1, 10, "a term after a's")
    assert assert_exactly_once(db).table == settled.table
    report("owner host partitioned", job="test-fill", takeover_s=takeover,
           job_done_s=done, rows_redone=settled.redone, rows=settled.rows)


@pytest.mark.parametrize("job_type", ["test-fill", "sql-update"])
def test_postgres_crash_and_restart_mid_job(cluster, job_type):
    """pg_ctl -m immediate with workers mid-batch on two hosts; PostgreSQL comes
    back on the same port and the job finishes with every row applied once."""
    db = cluster.db
    make_counted_items(db, 12_000)
    if job_type == "sql-update":
        from framework.submit import SubmitRequest

        execute(db, "ALTER TABLE items ADD COLUMN d int")
        request = SubmitRequest("sql-update", {"table": "items", "set": f"d={COUNTED}"},
                                rows_per_subtask=1_500, batch_rows=250)
    else:
        request = counted_fill(rows_per_subtask=1_500, batch_rows=250)
    job_id = submit(db, request).job_id
    cluster.start("a", faults=HOLD)
    cluster.start("b", faults=HOLD)
    cluster.workers.gates.wait_blocked("worker.after_batch", 90, count=4)
    cluster.workers.gates.release("worker.after_batch")
    cluster.net.crash_postgres()
    crashed = time.monotonic()
    cluster.net.start_postgres()
    db.engine.dispose()  # the test's own pool holds connections of the dead server
    state = wait_state(db, job_id, timeout=120)["state"]
    recovered = round(time.monotonic() - crashed, 1)
    assert state == "succeeded", job_of(db, job_id)
    settled = assert_exactly_once(db)
    for worker in cluster.workers:
        assert worker.alive()
        worker.signal(signal.SIGTERM)
    report("PostgreSQL crash (immediate) and restart", job=job_type, job_done_s=recovered,
           rows_redone=settled.redone, rows=settled.rows)
