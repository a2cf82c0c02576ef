"""The workers' side of ``alter-type``: one batch of the backfill or verify
step, and the fixed subtasks of the build-indexes step.

A backfill batch is one ``UPDATE`` of a keyset page of the table's key, of
any type (``backfill.batch_bounds``: the next ``batch_rows`` keys from
``curr_key``), committed with its fenced checkpoint (DESIGN 3). PostgreSQL
evaluates the expression on the row version it locks, and the trigger sets
the shadow column on every application write, so a concurrent write is
never overwritten from an older read (DESIGN 9). A value that does not convert raises in the UPDATE: the
subtask fails and so does the job, whose rollback drops what it added.

The batch's statements carry the user's ``--using``, so they go to the
driver as they are, without bind parameters (``backfill.schema.sql``): the
batch's bounds are written into them (``KeySpec.between``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.alter_type.plan import expression
from backfill.batch_bounds import next_bound
from backfill.schema.sql import run
from backfill.tables import quote
from framework import faults, long_statements
from framework.keys import Key, decode, shown
from framework.privileges import as_role, run_as
from framework.subtask import Batch, SubtaskContext


def backfill_batch(ctx: SubtaskContext, conn: Connection) -> Batch:
    """Fill the shadow column for the batch from ``ctx.curr_key``."""
    job, p = ctx.job, ctx.job.params
    t, shadow = job.target_table, quote(p["shadow"])
    upper, count = next_bound(conn, t, job.key, ctx.curr_key, ctx.end_key, job.batch_rows)
    value = expression(p)
    try:
        changed = (f"{shadow}::text IS DISTINCT FROM ({value})::text" if p.get("verify_as_text")
                   else f"{shadow} IS DISTINCT FROM {value}")
        with as_role(conn, run_as(job)):  # the user's --using, as the submitter
            run(conn, f"UPDATE {t} SET {shadow} = {value} "
                      f"WHERE {job.key.between(ctx.curr_key, upper)} AND {changed}")
    # IntegrityError: e.g. NULL from the USING of a NOT NULL column.
    except (sa.exc.DataError, sa.exc.IntegrityError) as exc:
        first = (_first_not_converting(ctx, upper, count)
                 if isinstance(exc, sa.exc.DataError) else None)
        raise ValueError(_does_not_convert(ctx, upper, exc, first)) from None
    return Batch(upper, count)


def _does_not_convert(ctx: SubtaskContext, upper: Key, exc: Exception,
                      first: Key | None) -> str:
    p = ctx.job.params
    reason = str(getattr(exc, "orig", exc)).splitlines()[0]
    where = (f"in the row of key {shown(first)}" if first is not None
             else f"(keys [{shown(ctx.curr_key)}, {shown(upper)}))")
    return f"a value of column {p['column']} does not convert to {p['type']} {where}: {reason}"


def _first_not_converting(ctx: SubtaskContext, upper: Key, rows: int) -> Key | None:
    """The key of the first row of the batch ``[ctx.curr_key, upper)`` (of
    ``rows`` keys) whose value does not convert; None if
    none is found (the row changed since). The batch's transaction is
    aborted: halves of the range are converted on a connection of their own
    (a read: no lock the batch holds is waited for), the lower half first,
    down to one row, in about log2(rows) short statements."""
    job = ctx.job
    t, key, value = job.target_table, job.key, expression(job.params)

    with ctx.engine.connect() as conn:
        def fails(lo: Key, hi: Key) -> bool:
            try:
                with conn.begin(), as_role(conn, run_as(job)):  # the user's --using
                    run(conn, f"SELECT count({value}) FROM {t} WHERE {key.between(lo, hi)}")
            except sa.exc.DataError:
                return True
            return False

        lo, hi = ctx.curr_key, upper
        if not fails(lo, hi):
            return None
        while rows > 1:
            with conn.begin():
                mid, half = next_bound(conn, t, key, lo, hi, rows // 2)
            if half == 0 or mid == hi:
                break
            if fails(lo, mid):
                hi, rows = mid, half
            else:
                lo, rows = mid, rows - half
        with conn.begin():
            found = run(conn, f"SELECT {key.read()} FROM {t} WHERE {key.between(lo, hi)} "
                              f"ORDER BY {key.order_by()} LIMIT 1")
        return decode(found[0][0]) if found and rows == 1 else None


def verify_batch(ctx: SubtaskContext, conn: Connection) -> Batch:
    """Check that every row of the batch holds the converted value in the shadow column."""
    job, p = ctx.job, ctx.job.params
    t, shadow, key = job.target_table, quote(p["shadow"]), job.key
    stored, wanted = shadow, expression(p)
    if p.get("verify_as_text"):  # a type without = (json): the same text is the same value
        stored, wanted = f"{shadow}::text", f"({wanted})::text"
    upper, count = next_bound(conn, t, key, ctx.curr_key, ctx.end_key, job.batch_rows)
    wrong = run(conn, (
        f"SELECT {key.read()} FROM {t} "
        f"WHERE {key.between(ctx.curr_key, upper)} "
        f"AND NOT ({stored} IS NOT DISTINCT FROM {wanted}) "
        f"ORDER BY {key.order_by()} LIMIT 1"))
    if wrong:
        raise ValueError(f"verify: the row of key {shown(decode(wrong[0][0]))} does not "
                         f"hold its converted value in {p['shadow']}")
    return Batch(upper, count)


def build_index(ctx: SubtaskContext) -> None:
    """CREATE INDEX CONCURRENTLY of one index on the shadow column. It cannot
    run in a transaction, so it is not exactly-once: a retry (after a kill)
    drops the invalid index an interrupted build left, and builds again. Its
    session is a long statement's (``framework.long_statements``): a build
    its worker left behind is ended, never waited for."""
    faults.hit("alter_type.before_build")
    schema = ctx.job.target_table.split(".")[0]
    name = f"{schema}.{quote(ctx.meta['build'])}"
    with long_statements.session(ctx) as conn:
        invalid = conn.execute(text(
            "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)"),
            {"n": name}).scalar()
        # CREATE INDEX CONCURRENTLY waits for every older transaction to end,
        # as lock waits: the worker's lock_timeout would fail a build that
        # only waits for a long application transaction.
        conn.execute(text("SET lock_timeout = 0"))
        if invalid:
            conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
        run(conn, ctx.meta["statement"])
    _finish(ctx)


def validate_constraints(ctx: SubtaskContext) -> None:
    """VALIDATE the shadow column's NOT VALID constraints (a scan that blocks
    no write), then ANALYZE it: its statistics survive the rename, so plans
    are good from the first statement after the cut-over. Long statements,
    on their own session (``framework.long_statements``)."""
    faults.hit("alter_type.before_build")
    t = ctx.job.target_table
    with long_statements.session(ctx) as conn:
        for name in ctx.meta.get("validate", []):
            conn.execute(text(f"ALTER TABLE {t} VALIDATE CONSTRAINT {quote(name)}"))
        conn.execute(text(f"ANALYZE {t} ({quote(ctx.job.params['shadow'])})"))
    _finish(ctx)


def _finish(ctx: SubtaskContext) -> None:
    ctx.commit(lambda conn: Batch(ctx.end_key, 0))
