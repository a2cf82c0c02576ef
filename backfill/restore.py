"""The revert step's batch loop, shared by the job types that restore data
range by range (DESIGN 13): a revert subtask restores ``[curr_key, end_key)``
a batch at a time, each batch's statements and its fenced checkpoint in one
transaction (DESIGN 3), so a killed worker's successor resumes from
``curr_key`` and no restore batch applies twice.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.batch_bounds import next_bound
from framework import faults
from framework.keys import END, KeySpec
from framework.subtask import Batch, SubtaskContext


def restore_in_batches(ctx: SubtaskContext, *, paced_by: tuple[str, KeySpec],
                       statements: Callable[[bool], list[str]]) -> None:
    """Run ``statements(bounded)`` (each binds ``lo`` and ``hi`` as
    ``KeySpec.param`` does; ``bounded`` False: the batch ends at ``END``, no
    ``hi``) over ctx's range in batches of at most ``batch_rows`` keys of
    ``paced_by`` (a quoted relation and its key): bounded statements however
    large the range."""
    relation, key = paced_by

    def restore(conn: Connection) -> Batch:
        upper, _ = next_bound(conn, relation, key, ctx.curr_key, ctx.end_key, ctx.job.batch_rows)
        bounds = {"lo": key.bind(ctx.curr_key), "hi": key.bind(upper)}
        restored = sum(conn.execute(text(stmt), bounds).rowcount
                       for stmt in statements(upper is not END))
        faults.hit("worker.in_restore_batch")
        return Batch(upper, restored)

    ctx.run_batches(restore)


def index_before_restoring(ctx: SubtaskContext, *, table: str, built: str,
                           statements: list[str]) -> None:
    """Before a revert subtask's first restore batch: build the indexes its
    batches look up by (``statements``, CREATE INDEX IF NOT EXISTS on the
    job's own work table ``table`` and its kin) unless ``built`` (a query of
    one boolean) says they exist. A worker's job, not the owner's: the build
    reads every row the job kept, which must not stall the owner's tick
    (backfill.before_images says why they are not built up front).

    The first revert subtask of the job to get here builds them; the others
    queue behind its lock on ``table`` (SHARE ROW EXCLUSIVE conflicts with
    itself, not with the readers of a restore batch), then find them built.
    A plain CREATE INDEX, not CONCURRENTLY: nothing writes a job's work
    tables while it reverts, and in one transaction a builder that is killed
    or stopped leaves nothing behind; the next one starts over. No
    statement or lock timeout: the build and the wait take as long as the
    table is big, and the lease bounds them instead (a lost lease or a stop
    cancels the statement)."""
    with ctx.engine.begin() as conn:
        if conn.execute(text(built)).scalar():
            return
    with ctx.engine.begin() as conn, ctx.cancel_on_stop(conn):
        conn.execute(text("SET LOCAL statement_timeout = 0"))
        conn.execute(text("SET LOCAL lock_timeout = 0"))
        conn.execute(text(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"))
        for stmt in statements:
            conn.execute(text(stmt))
        faults.hit("worker.in_restore_index")

