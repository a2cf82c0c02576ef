"""PostgreSQL crashed (``pg_ctl -m immediate``) and restarted in the middle of
a big split (issue 12). The owner inserts a split's ranges a chunk per tick,
and those commits do not wait for the disk (``owner_lease.hold(durable=False)``):
a crash may lose the last chunk, but only whole, with the plan's cursor in
the same statement, so the next tick inserts it again. (Whether this crash
lost it depends on whether a durable commit of the busy slots flushed it
first; the report says which.) Afterwards every key
range of the plan is in the job exactly once (no gap, overlap or repeat) and
every row is written."""

from __future__ import annotations

import signal
import time

import pytest
from support import job_of, make_items, scalar, subtask_ranges, wait_state
from support.oracle import report

from framework import owner as owner_module
from framework.keyset_split import plan_split
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault

ROWS_PER_SUBTASK = 4
# Three chunks of the owner's split: the first goes in with the job's start,
# the crash comes right after the second.
ROWS = 3 * owner_module.SPLIT_CHUNK * ROWS_PER_SUBTASK
HOLD = "owner.after_split_chunk"


def test_postgres_crash_and_restart_mid_split(cluster):
    db = cluster.db
    make_items(db, ROWS)
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=ROWS_PER_SUBTASK,
                                      batch_rows=100)).job_id
    worker = cluster.start("a", faults=f"{HOLD}=block")
    cluster.workers.gates.wait_blocked(HOLD, 120)
    in_before = len(subtask_ranges(db, job_id))  # committed: the start's chunk and the second
    assert in_before == 2 * owner_module.SPLIT_CHUNK
    cluster.net.crash_postgres()
    crashed = time.monotonic()
    cluster.net.start_postgres()
    cluster.db.engine.dispose()  # the test's pool holds connections of the dead server
    in_after = len(subtask_ranges(db, job_id))  # the second chunk, unless the crash lost it
    cluster.workers.gates.release(HOLD)
    done = wait_state(db, job_id, timeout=180)
    job_done = round(time.monotonic() - crashed, 2)
    assert done["state"] == "succeeded", job_of(db, job_id)
    with db.begin(isolation_level="REPEATABLE READ") as conn:
        plan = plan_split(conn, '"public"."items"', '"id"', ROWS_PER_SUBTASK)
    ranges = subtask_ranges(db, job_id)
    assert [(lo, hi) for _, lo, hi in ranges] == plan.ranges  # no gap, overlap or repeat
    assert [o for o, _, _ in ranges] == list(range(len(plan.ranges)))
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    report("PostgreSQL crash (immediate) and restart mid-split", job="sql-update",
           ranges=len(plan.ranges), chunk=owner_module.SPLIT_CHUNK,
           ranges_in_before_crash=in_before, ranges_in_after_restart=in_after,
           job_done_s=job_done)
