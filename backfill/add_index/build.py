"""The concurrent build of ``add-index``'s index, on a worker.

``CREATE INDEX CONCURRENTLY`` cannot run in a transaction, so the build is
not exactly-once (DESIGN 3) and is made safe to repeat instead:

- its session is a long statement's (``framework.long_statements``): a
  worker killed with -9, or a zombie whose lease expired, leaves its backend
  running the build; the backend notices a dead client by itself, the next
  lease holder ends it before building, and the owner before its DDL;
- an interrupted build leaves an INVALID index; the next attempt drops it
  (``DROP INDEX CONCURRENTLY``) and builds again; a valid index of that name
  is this job's only if an attempt of this subtask said (fenced, in its
  meta) that it started the build: else it belongs to someone else and the
  job fails rather than adopt it;
- the finished index gets a comment naming the job, which is what lets the
  rollback tell it from an index of the same name made by someone else.

The pool renews the lease meanwhile; a thread reads the build's phase from
``pg_stat_progress_create_index`` and checkpoints it as the subtask's
progress (0-99 of ``FIXED_SUBTASK_UNITS``), never backwards (DESIGN 6).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework import long_statements
from framework.errors import LeaseLost
from framework.subtask import Batch, SubtaskContext

# How often the progress thread reads the build's phase.
PROGRESS_SECONDS = 0.5
# Each phase of a concurrent build (pg_stat_progress_create_index), and the
# span of the subtask's percent it covers: (first, last).
_PHASES: dict[str, tuple[int, int]] = {
    "initializing": (0, 1),
    "waiting for writers before build": (1, 3),
    "building index: scanning table": (3, 50),
    "building index: sorting live tuples": (50, 55),
    "building index: loading tuples in tree": (55, 65),
    "waiting for writers before validation": (65, 67),
    "index validation: scanning index": (67, 75),
    "index validation: sorting tuples": (75, 80),
    "index validation: scanning table": (80, 95),
    "waiting for old snapshots": (95, 97),
    "waiting for readers before marking dead": (97, 99),
}


def marker(job_id: int) -> str:
    """The comment a finished index carries."""
    return f"built by reorg job {job_id}"


def index_state(conn: Connection, index: str, job_id: int) -> str:
    """``absent``, ``invalid``, ``ours`` (valid, with the job's comment) or
    ``valid`` (valid, no comment of the job's)."""
    row = conn.execute(text(
        "SELECT i.indisvalid, obj_description(i.indexrelid, 'pg_class') FROM pg_index i "
        "WHERE i.indexrelid = to_regclass(:name)"), {"name": index}).first()
    if row is None:
        return "absent"
    if not row[0]:
        return "invalid"
    return "ours" if row[1] == marker(job_id) else "valid"


def percent_of(phase: str | None, done: int | None, total: int | None) -> int:
    """A build's phase and its counter as a percent of the whole build."""
    first, last = _PHASES.get(phase or "", (0, 0))
    if total and done is not None and total > 0:
        return first + (last - first) * min(done, total) // total
    return first


def build_index(ctx: SubtaskContext, create: str, index: str) -> None:
    """Run the build subtask: ``create`` is the CREATE INDEX CONCURRENTLY
    statement of ``index`` (schema-qualified, quoted)."""
    job = ctx.job
    with long_statements.session(ctx) as conn:
        # The build waits for every open write transaction on the table,
        # however long the application keeps one: no lock wait limit. Its
        # SHARE UPDATE EXCLUSIVE lock never blocks the application's reads
        # and writes, only other DDL, so waiting costs the application nothing.
        conn.execute(text("SET lock_timeout = 0"))
        state = index_state(conn, index, job.id)
        started_before = bool(ctx.meta.get("build_started"))
        if state == "valid" and not started_before:
            raise ValueError(f"an index named {index} was created meanwhile by someone else; "
                             "drop it or submit with another --name")
        if state == "invalid":
            conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {index}"))
        if state in ("absent", "invalid"):
            _say_build_started(ctx)
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            with _progress(ctx, int(pid or 0)):
                conn.execute(text(create))
        if state != "ours":
            conn.execute(text(f"COMMENT ON INDEX {index} IS '{marker(job.id)}'"))
    ctx.commit(lambda conn: Batch(ctx.end_key, 0, {**ctx.meta, "build_started": True}))


def _say_build_started(ctx: SubtaskContext) -> None:
    """Record, fenced, that this subtask starts a build: from now on an index
    of that name is the job's, even before its comment."""
    if ctx.meta.get("build_started"):
        return
    started = {**ctx.meta, "build_started": True}
    ctx.commit(lambda conn: Batch(max(ctx.curr_key, ctx.start_key), 0, started))


def _progressed(percent: int, conn: Connection) -> Batch:
    """The build's progress as a batch that writes nothing."""
    return Batch(percent, 0)


@contextlib.contextmanager
def _progress(ctx: SubtaskContext, pid: int) -> Any:
    """While the block runs, checkpoint the build's percent as it grows."""
    stop = threading.Event()

    def follow() -> None:
        shown = ctx.curr_key
        while not stop.wait(PROGRESS_SECONDS):
            try:
                with ctx.engine.begin() as conn:
                    row = conn.execute(text(
                        "SELECT phase, coalesce(nullif(blocks_total, 0), tuples_total), "
                        "CASE WHEN blocks_total > 0 THEN blocks_done ELSE tuples_done END "
                        "FROM pg_stat_progress_create_index WHERE pid = :pid"),
                        {"pid": pid}).first()
                    if row is None:
                        continue
                percent = min(percent_of(row[0], row[2], row[1]), ctx.end_key - 1)
                if percent > shown:
                    ctx.commit(functools.partial(_progressed, percent))
                    shown = percent
            except LeaseLost:
                return  # the pool stops the subtask; the build is cancelled with it
            except Exception:  # noqa: S112 - progress is best effort; the build goes on
                continue

    thread = threading.Thread(target=follow, name=f"index-progress-{ctx.subtask_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
