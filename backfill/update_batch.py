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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.batch_bounds import next_bound
from backfill.ranged_update import UpdateSql
from framework.jobtype import SubtaskContext
from framework.keys import END, Key
from framework.privileges import as_role, run_as

# Below this share of key values holding a row, a batch of ``n`` key values
# would write too few rows: the next batch scans for its ``n`` keys instead.
DENSE_SHARE = 0.5
_SPARSE = "update_batch.sparse"  # ctx.batch_state: the last batch's range was sparse


def run_update_batch(ctx: SubtaskContext, conn: Connection,
                     sql_for: Callable[[bool], UpdateSql], *, filtered: bool) -> int:
    """Write the batch from ``ctx.curr_key`` with ``sql_for(bounded)``'s
    statement as the job's submitter and checkpoint it (not committed);
    return the keys it scanned. ``filtered``: the statement has a predicate
    (``--where``), so the rows it writes are not the keys it passed over."""
    job, curr, end, n = ctx.job, ctx.curr_key, ctx.end_key, ctx.job.batch_rows
    integer = job.key.integer and end is not END
    with ctx.cancel_on_stop(conn):
        if integer and not filtered and not ctx.batch_state.get(_SPARSE):
            upper = min(curr + n, end)
            bounds = {"lo": curr, "hi": upper}
            sql = sql_for(True)
            scanned = _write(ctx, conn, sql, bounds)
        elif integer:
            sql = replace(sql_for(True), scanning=True)
            with as_role(conn, run_as(job)):  # the user's SQL, their privileges only
                row = conn.execute(text(sql.update()), {"lo": curr, "end": end, "n": n}).one()
                upper, scanned = int(row.hi), int(row.scanned)
                bounds = {"lo": curr, "hi": upper}
                sql = replace(sql, scanning=False)
                if sql.images is not None and row.written < row.seen:
                    conn.execute(text(sql.update_locked()), bounds)  # rows changed under it
        else:
            upper, scanned = next_bound(conn, job.target_table, job.key, curr, end, n)
            sql = sql_for(upper is not END)
            bounds = {"lo": job.key.bind(curr), "hi": job.key.bind(upper)}
            _write(ctx, conn, sql, bounds)
        if integer:
            ctx.batch_state[_SPARSE] = scanned < DENSE_SHARE * (upper - curr)
        if sql.batches:
            conn.execute(text(sql.record_batch()), {**bounds, "subtask": ctx.subtask_id})
        ctx.checkpoint(conn, upper, scanned)
    return scanned


def _write(ctx: SubtaskContext, conn: Connection, sql: UpdateSql,
           bounds: dict[str, Key]) -> int:
    """The batch's statement on fixed bounds; the rows of the range it saw
    (overwrite mode: with the locked fallback for rows changed under it) or
    wrote."""
    with as_role(conn, run_as(ctx.job)):  # the user's SQL, their privileges only
        result = conn.execute(text(sql.update()), bounds)
        if sql.images is None:
            return int(result.rowcount)
        seen, written = result.one()
        if written < seen:  # rows changed under the batch
            conn.execute(text(sql.update_locked()), bounds)
        return int(seen)
