"""One batch of a ranged UPDATE (``sql-update``, ``add-column``): where it
ends, the statement, and what it scanned; ``framework.subtask`` commits it
with its fenced checkpoint (DESIGN 3).

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

Overwriting a column keeps a before-image of every old value that is not
NULL. A batch whose old values are all NULL needs none: it runs the bare
UPDATE, guarded (``UpdateSql.only_null_old``), and the first old value falls
back to the image statement for the batch's rows not yet written. On fixed
bounds the guard is the bare UPDATE of the NULL rows alone, with no probe
(``without_probe``): a range of a unique integer key holds at most
``hi - lo`` rows, so a batch that wrote that many is done, and any other
falls back the same way. After a batch that kept images the next one goes
straight to the image statement (a column full of values would pay the
guard's read on every batch), and back to the guard after one that kept
none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.batch_bounds import next_bound
from backfill.ranged_update import UpdateSql
from framework.keys import END, Key, KeySpec
from framework.privileges import as_role, run_as
from framework.subtask import Batch, SubtaskContext

# Below this share of key values holding a row, a batch of ``n`` key values
# would write too few rows: the next batch scans for its ``n`` keys instead.
DENSE_SHARE = 0.5
_SPARSE = "update_batch.sparse"  # ctx.batch_state: the last batch's range was sparse
_KEPT = "update_batch.kept"  # ctx.batch_state: the last batch kept before-images


def write_update_batch(ctx: SubtaskContext, conn: Connection,
                       sql_for: Callable[[bool], UpdateSql], *, filtered: bool,
                       after_write: Callable[[Connection, Key, Key], None] | None = None) -> Batch:
    """Write the batch from ``ctx.curr_key`` with ``sql_for(bounded)``'s
    statement as the job's submitter. ``filtered``: the statement has a
    predicate (``--where``), so the rows it writes are not the keys it passed
    over. ``after_write(conn, lo, hi)``: the job type's own statements after
    the write, on the batch's range, in its transaction."""
    job, curr, end, n = ctx.job, ctx.curr_key, ctx.end_key, ctx.job.batch_rows
    guarded = sql_for(True).images is not None and not ctx.batch_state.get(_KEPT)
    # A single integer key in a bounded range: bounds by arithmetic, no scan.
    integer_range = job.key.arithmetic and end is not END
    if not integer_range:
        upper, scanned = next_bound(conn, job.target_table, job.key, curr, end, n)
        sql = replace(sql_for(upper is not END), only_null_old=guarded)
        bounds = {"lo": job.key.bind(curr), "hi": job.key.bind(upper)}
        row = _write(ctx, conn, sql, bounds)
    else:
        upper = min(curr + n, end)  # the bound if on fixed bounds
        fixed_bounds = _on_fixed_bounds(ctx, filtered)
        sql = replace(sql_for(True), scanning=not fixed_bounds, only_null_old=guarded,
                      without_probe=guarded and fixed_bounds)
        row = _write(ctx, conn, sql, {"lo": curr, "hi": upper, "end": end, "n": n})
        if sql.scanning:
            upper, scanned = int(row["hi"]), int(row["scanned"])
        bounds = {"lo": curr, "hi": upper}
    if sql.images is not None:
        fixed = replace(sql, scanning=False, only_null_old=False, without_probe=False)
        if sql.without_probe:
            row = _after_bare_guard(ctx, conn, fixed, int(row["written"]), upper - curr, bounds)
        ctx.batch_state[_KEPT] = row["kept"] > 0
        if guarded and not sql.without_probe and row["written"] < row["seen"]:
            # Old values in the range (or rows changed under the guard): the
            # image statement for the rows the guard did not write.
            row = _write(ctx, conn, replace(fixed, skip_written=True), bounds)
        if row["written"] < row["seen"]:
            # Rows changed under the statement: locked, on fixed bounds now.
            with as_role(conn, run_as(job)):  # the user's SQL, their privileges only
                conn.execute(text(fixed.update_locked()), bounds)
    if integer_range:
        if not sql.scanning:
            scanned = int(row["seen"] if sql.images is not None else row["written"])
        ctx.batch_state[_SPARSE] = scanned < DENSE_SHARE * (upper - curr)
    if after_write is not None:
        after_write(conn, curr, upper)
    if sql.batches:
        conn.execute(text(sql.record_batch()), {**bounds, "subtask": ctx.subtask_id})
    return Batch(upper, scanned)


def _after_bare_guard(ctx: SubtaskContext, conn: Connection, fixed: UpdateSql, written: int,
                      keys: int, bounds: dict[str, Key]) -> dict[str, Any]:
    """After the guard without its probe (``UpdateSql.without_probe``) wrote
    ``written`` rows of a range of a unique integer key that holds at most
    ``keys`` rows: done if it wrote that many, else the image statement for
    the rows it did not write (old values, rows changed under it; on keys
    that hold no row it finds nothing). Returns ``seen``, ``written`` and
    ``kept`` over both, as the image statement alone returns them."""
    if written == keys:
        return {"seen": written, "written": written, "kept": 0}
    rest = _write(ctx, conn, replace(fixed, skip_written=True), bounds)
    return {"seen": written + int(rest["seen"]), "written": written + int(rest["written"]),
            "kept": int(rest["kept"])}


def fixed_bounds_possible(key: KeySpec, filtered: bool) -> bool:
    """Whether a job's batches can run on fixed bounds ``[curr, curr + n)``
    at all: a single integer key and no predicate (also what ``--dry-run``
    shows the batches running)."""
    return key.arithmetic and not filtered


def _on_fixed_bounds(ctx: SubtaskContext, filtered: bool) -> bool:
    """Whether the batch is ``[curr, curr + n)`` with no key scan: fixed
    bounds possible, a bounded range, and the last range dense."""
    return (fixed_bounds_possible(ctx.job.key, filtered) and ctx.end_key is not END
            and not ctx.batch_state.get(_SPARSE))


def _write(ctx: SubtaskContext, conn: Connection, sql: UpdateSql,
           bounds: dict[str, Key]) -> dict[str, Any]:
    """The batch's statement, as the submitter: what it returned (``hi``,
    ``scanned``, ``seen``, ``written``, as it has them)."""
    with as_role(conn, run_as(ctx.job)):  # the user's SQL, their privileges only
        result = conn.execute(text(sql.update()), bounds)
        if not result.returns_rows:  # the bare UPDATE
            return {"written": int(result.rowcount)}
        return dict(result.mappings().one())
