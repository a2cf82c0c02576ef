"""One batch of a ranged UPDATE (``sql-update``, ``add-column``): where it
ends, the statement, and what it scanned; the caller checkpoints it in the
same transaction (DESIGN 3).

Where a batch ends costs no statement of its own on a single integer key.
A unique integer key has at most ``n`` rows in ``[curr, curr + n)``, so that
range is a batch that never exceeds ``--batch-rows``; on dense keys (the
usual serial id) it holds exactly ``n`` and needs no key scan at all. Where
the previous batch found the key values under half filled, the statement
finds its bound itself instead: the first ``n`` keys in its own snapshot
(``UpdateSql.scanning``), one statement where a separate scan took a round
trip, its planning and ~5 % of a batch (docs/benchmarks.md). Either way the
batches tile the range: each starts where the last one's checkpoint ended.
Other keys (``framework.keys``) scan first (``batch_bounds.next_bound``).

A batch that is one bare UPDATE on such arithmetic bounds, with nothing to
keep, runs alone where the worker offers it (``run_update_batch_alone``): the
UPDATE and its fenced checkpoint in one autocommit statement, one round trip
instead of BEGIN, UPDATE, checkpoint and COMMIT (``framework.store.subtasks.
fenced_batch``). Every other batch runs in a transaction (``run_update_batch``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.batch_bounds import next_bound
from backfill.ranged_update import UpdateSql
from framework.jobtype import InlineCheckpoint, SubtaskContext
from framework.keys import END, Key
from framework.privileges import as_role, run_as, session_role

# Below this share of key values holding a row, a batch of ``n`` key values
# would write too few rows: the next batch scans for its ``n`` keys instead.
DENSE_SHARE = 0.5
_SPARSE = "update_batch.sparse"  # ctx.batch_state: the last batch's range was sparse
_OTHER_ROLE = "update_batch.other_role"  # ctx.batch_state: no batch of it runs alone


def run_update_batch(ctx: SubtaskContext, conn: Connection,
                     sql_for: Callable[[bool], UpdateSql], *, filtered: bool,
                     after_write: Callable[[Connection, Key, Key], None] | None = None) -> int:
    """Write the batch from ``ctx.curr_key`` with ``sql_for(bounded)``'s
    statement as the job's submitter and checkpoint it (not committed);
    return the keys it scanned. ``filtered``: the statement has a predicate
    (``--where``), so the rows it writes are not the keys it passed over.
    ``after_write(conn, lo, hi)``: the job type's own statements after the
    write, on the batch's range, in its transaction."""
    job, curr, end, n = ctx.job, ctx.curr_key, ctx.end_key, ctx.job.batch_rows
    with ctx.cancel_on_stop(conn):
        if not (job.key.integer and end is not END):
            upper, scanned = next_bound(conn, job.target_table, job.key, curr, end, n)
            sql = sql_for(upper is not END)
            bounds = {"lo": job.key.bind(curr), "hi": job.key.bind(upper)}
            inline = None
            row = _write(ctx, conn, sql, bounds, inline)
        else:
            upper = min(curr + n, end)  # the bound if on fixed bounds
            sql = replace(sql_for(True), scanning=not _on_fixed_bounds(ctx, filtered))
            inline = _inline_checkpoint(ctx, conn, sql)
            row = _write(ctx, conn, sql, {"lo": curr, "hi": upper, "end": end, "n": n,
                                          "subtask": ctx.subtask_id}, inline)
            if sql.scanning:
                upper, scanned = int(row["hi"]), int(row["scanned"])
            else:
                scanned = int(row["seen"] if sql.images is not None else row["written"])
            bounds = {"lo": curr, "hi": upper}
            ctx.batch_state[_SPARSE] = scanned < DENSE_SHARE * (upper - curr)
        if sql.images is not None and row["written"] < row["seen"]:
            # Rows changed under the statement: locked, on fixed bounds now.
            with as_role(conn, run_as(job)):  # the user's SQL, their privileges only
                conn.execute(text(replace(sql, scanning=False).update_locked()), bounds)
        if after_write is not None:
            after_write(conn, curr, upper)
        if sql.batches and inline is None:  # else the statement recorded it
            conn.execute(text(sql.record_batch()), {**bounds, "subtask": ctx.subtask_id})
        if inline is None:
            ctx.checkpoint(conn, upper, scanned)
        else:
            inline.done(conn, upper, scanned, row["checkpoint_state"])
    return scanned


def run_update_batch_alone(ctx: SubtaskContext, engine: Engine,
                           sql_for: Callable[[bool], UpdateSql], *, filtered: bool) -> int | None:
    """The batch from ``ctx.curr_key`` as one statement with its checkpoint,
    committed (``SubtaskContext.fenced_batch``), where it is a bare UPDATE on
    fixed bounds ``[curr, curr + n)`` (dense integer keys, nothing to keep, no
    ``--where``) run as the worker's own role; its rows scanned. None where it
    is not: ``run_update_batch`` then runs it in a transaction."""
    curr, end, n = ctx.curr_key, ctx.end_key, ctx.job.batch_rows
    if (ctx.fenced_batch is None or ctx.batch_state.get(_OTHER_ROLE)
            or not _on_fixed_bounds(ctx, filtered)):
        return None
    sql = sql_for(True)
    if sql.images is not None:
        return None
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not _as_worker(ctx, conn):
            ctx.batch_state[_OTHER_ROLE] = True  # the job's SQL runs as its submitter
            return None
        fenced = ctx.fenced_batch()
        if fenced is None:
            return None
        upper = min(curr + n, end)
        with ctx.cancel_on_stop(conn):
            written = fenced.run(conn, sql.update_by_position(), curr, upper)
    ctx.batch_state[_SPARSE] = written < DENSE_SHARE * (upper - curr)
    return written


def _inline_checkpoint(ctx: SubtaskContext, conn: Connection,
                       sql: UpdateSql) -> InlineCheckpoint | None:
    """The batch's checkpoint as part of its statement, where the worker
    offers one and the statement runs as the worker itself (the submitter
    is the worker's role): the checkpoint is never the submitter's to write.
    A separate statement otherwise."""
    end = sql.batch_end()
    if ctx.inline_checkpoint is None or end is None or not _as_worker(ctx, conn):
        return None
    return ctx.inline_checkpoint(*end)


def _on_fixed_bounds(ctx: SubtaskContext, filtered: bool) -> bool:
    """Whether the batch is ``[curr, curr + n)`` with no key scan: a single
    integer key, a bounded range, no predicate, and the last range dense."""
    return (ctx.job.key.integer and ctx.end_key is not END and not filtered
            and not ctx.batch_state.get(_SPARSE))


def _as_worker(ctx: SubtaskContext, conn: Connection) -> bool:
    """Whether the job's SQL runs as the worker's own role (its submitter is
    the worker's role, or unrecorded): only then may a statement of it write
    the worker's checkpoint."""
    role = run_as(ctx.job)
    return role is None or role == session_role(conn)


def _write(ctx: SubtaskContext, conn: Connection, sql: UpdateSql, bounds: dict[str, Key],
           inline: InlineCheckpoint | None) -> dict[str, Any]:
    """The batch's statement, as the submitter: what it returned (``hi``,
    ``scanned``, ``seen``, ``written``, ``checkpoint_state``, as it has them)."""
    statement = sql.update(None if inline is None else inline.sql)
    params = {**bounds, **(inline.params if inline else {})}
    with as_role(conn, run_as(ctx.job)):  # the user's SQL, their privileges only
        result = conn.execute(text(statement), params)
        if not result.returns_rows:  # the bare UPDATE
            return {"written": int(result.rowcount)}
        return dict(result.mappings().one())
