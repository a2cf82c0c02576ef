"""Disk full in a batch, with a real ``reorg worker``: the target table's
heap lies on a tablespace of a tiny tmpfs (support.small_disk) filled to the
last byte, so every batch's UPDATE fails with ``could not extend file ...:
No space left on device`` (SQLSTATE 53100; the server's WAL and the system
tables have room). Disk full is retried (space may come back: a vacuum, an
operator), then: by default the job fails and is reverted, the table exactly
as before; with ``--on-failure pause`` it pauses, and ``reorg retry`` once
space is freed finishes it with every row applied once. The worker and
PostgreSQL keep running throughout (docs/reliability.md)."""

from __future__ import annotations

import subprocess
import time

import pytest
from support import scalar, table_rows, wait_state
from support.oracle import assert_exactly_once, counted_fill, make_counted_items, report, work_done
from support.processes import REORG, clean_env

from framework.submit import submit

pytestmark = pytest.mark.fault

ROWS = 4_000


def _disk_full(error: str | None) -> bool:
    """The server's own words for a batch that ran out of disk."""
    text = error or ""
    return "could not extend file" in text and "No space left on device" in text


def _attempts(db, job_id: int) -> list[tuple[str, int]]:
    """(state, attempts) of the job's forward subtasks, live and moved."""
    found = []
    for table in ("background_subtask", "background_subtask_history"):
        with db.begin() as conn:
            found += [tuple(r) for r in conn.execute(db.sql(
                f"SELECT state, attempts FROM {{s}}.{table} WHERE job_id = :j AND step = 1"),
                {"j": job_id})]
    return sorted(found)


def _still_running(db, worker) -> None:
    assert worker.alive(), worker.log()[-2000:]
    assert scalar(db, "SELECT 1") == 1  # the server too


def test_disk_full_in_every_batch_is_retried_then_the_job_fails_and_is_reverted(
        db, workers, small_disk):
    make_counted_items(db, ROWS)
    small_disk.take("items")
    before = table_rows(db)
    small_disk.fill()
    job_id = submit(db, counted_fill(rows_per_subtask=1_000, batch_rows=250)).job_id
    started = time.monotonic()
    worker = workers.start("w", slots=2, REORG_MAX_ATTEMPTS="3")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "reverted", done
    assert "attempt 3" in done["error"] and _disk_full(done["error"]), done["error"]
    assert ("failed", 3) in _attempts(db, job_id)  # retried to the last attempt
    assert table_rows(db) == before  # the job's column gone, every row as it was
    _still_running(db, worker)
    report("disk full in every batch", job="test-fill",
           job_done_s=round(time.monotonic() - started, 2), result="reverted after 3 attempts",
           rows_redone=work_done(db))  # nothing committed: every row computed was undone


def test_disk_full_pauses_the_job_and_retry_after_freeing_space_finishes_it(
        db, workers, small_disk, migrated_db):
    make_counted_items(db, ROWS)
    small_disk.take("items")
    small_disk.fill()
    job_id = submit(db, counted_fill(rows_per_subtask=1_000, batch_rows=250,
                                     on_failure="pause")).job_id
    worker = workers.start("w", slots=2, REORG_MAX_ATTEMPTS="2")
    paused = wait_state(db, job_id, states={"paused"}, timeout=120)
    assert _disk_full(paused["error"]), paused["error"]
    assert ("failed", 2) in _attempts(db, job_id)
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS NOT NULL") == 0  # nothing landed
    _still_running(db, worker)

    small_disk.free()
    freed = time.monotonic()
    retried = subprocess.run([REORG, "--db", migrated_db, "retry", str(job_id)],  # type: ignore[list-item]
                             capture_output=True, text=True, env=clean_env(), timeout=60)
    assert retried.returncode == 0 and "re-queued" in retried.stdout, retried.stderr
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done
    settled = assert_exactly_once(db)
    _still_running(db, worker)
    report("disk full, --on-failure pause, space freed, reorg retry", job="test-fill",
           job_done_s=round(time.monotonic() - freed, 2), rows_redone=settled.redone,
           rows=settled.rows)
