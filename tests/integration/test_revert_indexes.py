"""The before-images' indexes a rollback needs (issue 12.3): the owner's
fenced transaction that plans the revert builds none of them; the first
revert subtask builds them in a transaction of its own while the others wait
for it, and a build that fails leaves nothing behind and is done again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from support import job_of, make_items, table_rows, wait_state, wait_until

from framework import control, faults
from framework.records import STEP_REVERT
from framework.store import owner_lease
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def _items_with_old_values(db) -> list[tuple]:
    make_items(db, 2_000)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = CASE WHEN id % 4 = 0 THEN NULL "
                             "ELSE 'old-' || id END"))
    return table_rows(db)


def _overwrite_held_after_a_batch_a_slot(db, start_node, **settings):
    """An sql-update overwriting ``c`` on a node of two slots, each slot held
    after its first committed batch: two ranges to restore."""
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=500, batch_rows=100,
                                      concurrency=2)).job_id
    node = start_node("n1", slots=2, **settings)
    faults.wait_blocked("worker.after_batch", 30, count=2)
    return job_id, node


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)


def _images(db, job_id: int) -> str:
    return f"{db.schema}.sql_update_{job_id}_images"


def _owner_id(db) -> str | None:
    with db.begin() as conn:
        return owner_lease.current(db, conn)["owner_id"]


def _exists(db, name: str) -> bool:
    with db.begin() as conn:
        return bool(conn.execute(sa.text("SELECT to_regclass(:n) IS NOT NULL"),
                                 {"n": name}).scalar())


def _waiting_for_images_lock(db, job_id: int) -> int:
    """Sessions queued for a lock on the job's images table."""
    with db.begin() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE NOT granted "
            "AND relation = to_regclass(:t)"),
            {"t": _images(db, job_id)}).scalar_one())


def test_the_revert_plan_builds_no_index_and_one_revert_subtask_builds_them(db, start_node):
    before = _items_with_old_values(db)
    owner = start_node("owner", slots=0)
    wait_until(lambda: _owner_id(db) == "owner", 30, "the owner node to own")
    job_id, forward = _overwrite_held_after_a_batch_a_slot(db, start_node)
    faults.arm("worker.in_restore_index", "block")
    with _statements(owner.owner_db.engine) as planned_by_owner:
        control.cancel(db, job_id)
        faults.release("worker.after_batch")
        forward.drain()
        # A node of fresh slots, one revert subtask each (a slot that ran quick
        # subtasks claims several at once). Its lease is long enough that the
        # held build's transaction outlives the checks below (a worker's
        # idle-in-transaction timeout is a third of it).
        reverting = start_node("rev", slots=2, lease_seconds=30)
        with _statements(reverting.worker_db.engine) as slots:
            # One revert subtask is inside its build transaction; the other
            # waits behind its lock on the images table.
            faults.wait_blocked("worker.in_restore_index", 30)
            job = job_of(db, job_id)
            assert job["state"] == "reverting" and job["step"] == STEP_REVERT
            assert job["revert_total"] == 2
            wait_until(lambda: _waiting_for_images_lock(db, job_id) == 1, 30,
                       "the second revert subtask to queue behind the build")
            assert not _exists(db, _images(db, job_id) + "_k")  # not committed yet
            assert table_rows(db) != before  # no restore batch before the indexes
            faults.release("worker.in_restore_index")
            done = wait_state(db, job_id)
    assert done["state"] == "cancelled", done["error"]
    assert table_rows(db) == before
    assert done["revert_done"] == 2
    # The owner planned the revert (its event is there) without an index build.
    events = [(e["actor"], e["from_state"], e["to_state"]) for e in control.events(db, job_id)
              if (e["detail"] or "").startswith("revert step: ")]
    assert [e[1:] for e in events] == [("step run", "step revert")]
    assert events[0][0].startswith("owner owner ")
    assert not [s for s in planned_by_owner if "CREATE INDEX" in s], planned_by_owner
    # Both subtasks ran the build's statements; the second found them built.
    assert sum("LOCK TABLE" in s for s in slots) == 2
    assert len([s for s in slots if "CREATE INDEX" in s]) == 4


def test_a_failed_build_leaves_no_index_and_a_retry_builds_them(db, start_node):
    before = _items_with_old_values(db)
    job_id, node = _overwrite_held_after_a_batch_a_slot(db, start_node)
    # The first build fails after both CREATE INDEX ran, before its commit.
    faults.arm("worker.in_restore_index", "raise@1")
    with _statements(node.worker_db.engine) as slots:
        control.cancel(db, job_id)
        faults.release("worker.after_batch")
        done = wait_state(db, job_id, timeout=90)
    assert done["state"] == "cancelled", done["error"]
    assert table_rows(db) == before
    assert sum("LOCK TABLE" in s for s in slots) >= 2  # built again after the failure
    # The revert DDL dropped the images and their index with them.
    assert not _exists(db, _images(db, job_id) + "_k")
    assert not _exists(db, _images(db, job_id))
