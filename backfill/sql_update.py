"""``sql-update``: set a column from a PostgreSQL expression, range by range.

    reorg submit sql-update --table T --set COL=EXPR [--where PRED] [--add-column COL:TYPE]

Each batch is one ``UPDATE t SET col = (expr) WHERE key in [lo, hi) AND pred``
committed with its fenced checkpoint (DESIGN 3). PostgreSQL evaluates EXPR on
the row version it locks, so a concurrent application write is never
overwritten by a value computed from an older read (DESIGN 9).

Rollback (DESIGN 8): a column the job added is dropped; when the job overwrote
an existing column, each row's before-image (old and new value) was recorded in
the same statement as the update, and rollback restores the old value wherever
the row still holds the value the job wrote (later application writes win).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.tables import (
    explain_or_fail,
    inspect_table,
    parse_assignment,
    parse_column_spec,
    quote,
    resolve_type,
)
from framework import jobtype
from framework.jobtype import InvalidParams, Job, SubtaskContext, Target

DDL_LOCK_TIMEOUT = "5s"


class SqlUpdate:
    name = "sql-update"

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        table = inspect_table(conn, params.get("table", ""))
        column, expr = parse_assignment(params.get("set", ""))
        where = (params.get("where") or "").strip() or None
        if column == table.key:
            raise InvalidParams(f"column {column} is the primary key; reorg never rewrites keys")
        add = params.get("add_column")
        if add:
            added, type_ = parse_column_spec(add)
            if added != column:
                raise InvalidParams(
                    f"--add-column names {added} but --set writes {column}; use the same column"
                )
            if column in table.columns:
                raise InvalidParams(
                    f"column {column} already exists in {table.display}; drop --add-column "
                    "to overwrite it (its old values are kept for rollback)"
                )
            type_ = resolve_type(conn, type_)
        elif column not in table.columns:
            raise InvalidParams(
                f"column {column} does not exist in {table.display}; pass "
                f"--add-column {column}:TYPE to create it"
            )
        else:
            type_ = table.columns[column]
        self._check_expression(conn, table.qualified, table.display, expr, where, type_)
        return Target(table.qualified, table.key_sql, {
            **params, "column": column, "expr": expr, "where": where, "column_type": type_,
            "overwrite": not add,
        })

    @staticmethod
    def _check_expression(conn: Connection, table: str, display: str, expr: str,
                          where: str | None, type_: str) -> None:
        # The predicate first, on its own, so an error names the right option.
        if where:
            explain_or_fail(conn, f"SELECT 1 FROM {table} WHERE ({where})", "--where", display)
        explain_or_fail(conn, f"SELECT CAST(({expr}) AS {type_}) FROM {table}", "--set", display)

    def prepare(self, conn: Connection, job: Job) -> None:
        p = job.params
        conn.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
        if p["overwrite"]:
            conn.execute(text(
                f"CREATE TABLE IF NOT EXISTS {_images(job)} "
                f"(reorg_k bigint PRIMARY KEY, reorg_old {p['column_type']}, "
                f"reorg_new {p['column_type']})"))
        else:
            conn.execute(text(
                f"ALTER TABLE {job.target_table} ADD COLUMN {quote(p['column'])} "
                f"{p['column_type']}"))

    def run_subtask(self, ctx: SubtaskContext, engine: Engine) -> None:
        curr = ctx.curr_key
        while curr < ctx.end_key:
            ctx.raise_if_stopped()
            started = time.monotonic()
            with engine.begin() as conn:
                # A hard stop (lease lost, cancel) cancels the running statement,
                # so the open batch rolls back at once.
                driver = conn.connection.driver_connection
                assert driver is not None
                unregister = ctx.on_stop(driver.cancel)
                try:
                    upper, scanned = _next_batch(conn, ctx.job, curr, ctx.end_key)
                    conn.execute(text(_update_sql(ctx.job)), {"lo": curr, "hi": upper})
                    ctx.checkpoint(conn, upper, scanned)
                finally:
                    unregister()
            curr = upper
            ctx.throttle(scanned, time.monotonic() - started)

    def advance(self, conn: Connection, job: Job) -> None:
        conn.execute(text(f"DROP TABLE IF EXISTS {_images(job)}"))

    def rollback(self, conn: Connection, job: Job) -> None:
        p = job.params
        conn.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
        if p["overwrite"]:
            col = quote(p["column"])
            conn.execute(text(
                f"UPDATE {job.target_table} t SET {col} = bi.reorg_old FROM {_images(job)} bi "
                f"WHERE t.{job.key_column} = bi.reorg_k "
                f"AND t.{col} IS NOT DISTINCT FROM bi.reorg_new"))
            conn.execute(text(f"DROP TABLE IF EXISTS {_images(job)}"))
        else:
            conn.execute(text(
                f"ALTER TABLE {job.target_table} DROP COLUMN IF EXISTS {quote(p['column'])}"))


def _images(job: Job) -> str:
    return f'{quote(job.params["work_schema"])}."before_image_{job.id}"'


def _next_batch(conn: Connection, job: Job, curr: int, end: int) -> tuple[int, int]:
    """The batch's exclusive upper key and how many rows it spans: at most
    ``batch_rows`` rows in key order, so gappy keys still give even batches."""
    last, count = conn.execute(
        text(f"""
            SELECT max(k), count(*) FROM (
                SELECT {job.key_column} AS k FROM {job.target_table}
                WHERE {job.key_column} >= :curr AND {job.key_column} < :end
                ORDER BY {job.key_column} LIMIT :n) batch"""),
        {"curr": curr, "end": end, "n": job.batch_rows},
    ).one()
    if count < job.batch_rows or last is None:
        return end, count
    return last + 1, count


def _update_sql(job: Job) -> str:
    p, t, k = job.params, job.target_table, job.key_column
    col, where = quote(p["column"]), p["where"] or "TRUE"
    in_range = f"{k} >= :lo AND {k} < :hi AND ({where})"
    if not p["overwrite"]:
        return f"UPDATE {t} SET {col} = ({p['expr']}) WHERE {in_range}"
    # Lock the rows, remember their old values, update them from the locked
    # versions and record the new values, all in one statement.
    return f"""
        WITH locked AS (
            SELECT {k} AS reorg_k, {col} AS reorg_old FROM {t} WHERE {in_range} FOR UPDATE),
        updated AS (
            UPDATE {t} SET {col} = ({p['expr']}) FROM locked WHERE {t}.{k} = locked.reorg_k
            RETURNING locked.reorg_k, locked.reorg_old, {t}.{col} AS reorg_new)
        INSERT INTO {_images(job)} (reorg_k, reorg_old, reorg_new)
        SELECT reorg_k, reorg_old, reorg_new FROM updated
        ON CONFLICT (reorg_k) DO UPDATE SET reorg_new = EXCLUDED.reorg_new"""


def register() -> None:
    jobtype.register(SqlUpdate())
