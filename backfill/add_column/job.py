"""``add-column``: a column whose every row gets EXPR, online.

    reorg submit add-column --table T --column C:TYPE --value EXPR [--default EXPR] [--not-null]

States and steps (TiDB's schema states beside them; the DDL: ``ddl``)::

    prepare ─────────► backfill (ranges) ─► not-null (1 subtask) ─► cut-over
    write-only         write-reorg          write-reorg              public
    column + trigger   UPDATE by range      CHECK NOT VALID →        SET DEFAULT, SET NOT NULL,
    (one transaction)  (fenced batches)     VALIDATE (a scan, on a   DROP the check, the trigger
                                            worker)                  (one transaction)

Without ``--not-null`` the not-null step has no subtask and ends at once.
The backfill's batches are sql-update's (``backfill.ranged_update``): one
UPDATE per batch, committed with its fenced checkpoint (DESIGN 3), EXPR
evaluated on the row version the UPDATE locks (DESIGN 9). The cut-over's DDL
waits for its locks a bounded time; the owner retries it.

Rollback from any state drops the trigger, its function and the column (and
the check with it): the table is as before, whatever the backfill wrote.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from backfill.add_column.ddl import BODY_QUOTE, AddColumnDdl
from backfill.expressions import embed, on_one_line, one_expression, optional_expression
from backfill.ranged_update import UpdateSql, alias_of, check_update_statement
from backfill.tables import (
    TableInfo,
    check_identifier,
    inspect_table,
    quote,
    relation_exists,
    resolve_type,
    set_ddl_lock_timeout,
)
from backfill.update_batch import run_update_batch, run_update_batch_alone
from framework import jobtype
from framework.errors import one_line
from framework.jobtype import InvalidParams, Job, Step, SubtaskContext, Target
from framework.keys import decode, shown

BACKFILL, NOT_NULL = 1, 2  # stored step numbers: never renumber


class AddColumn:
    name = "add-column"
    # Its batches are keyset ranges of any key (framework.keys).
    keys_of_any_type = True
    submit_options = "backfill.add_column.options:add_column"
    steps = (Step("backfill", restore=False, schema_state="write-reorg"),
             Step("not-null", ranges=False, restore=False, schema_state="write-reorg"))
    done_schema_state = "public"
    batch_steps = (BACKFILL,)  # quick backfill subtasks share a transaction (run_batch)
    # No opt-out of the owner's catch-up ranges (framework.catch_up): the
    # split runs before prepare creates the trigger, so rows inserted between
    # them lie past the last range with no value; the first catch-up round
    # covers them (later rows have the trigger's). So rows still arriving
    # after the last round were not missed:
    trigger_covers_inserts = True

    # --- submit ------------------------------------------------------------------

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        table = inspect_table(conn, params.get("table", ""), any_key=True)
        column, type_ = _column_spec(conn, table, params.get("column", ""))
        expr = one_expression(params.get("value", ""), "--value")
        if BODY_QUOTE in expr:
            raise InvalidParams(f"--value must not contain {BODY_QUOTE}; write it otherwise")
        check_update_statement(conn, table, column, expr, None, type_, adding=True,
                               option="--value")
        default = optional_expression(params.get("default"), "--default")
        if default:
            _check_default(conn, table, column, type_, default)
        return Target(table.qualified, table.key_sql, {
            "table": table.display, "key": table.key, "column": column, "column_type": type_, "expr": expr,
            "default": default, "not_null": bool(params.get("not_null")),
        }, key=table.key_spec)

    def describe(self, conn: Connection, job: Job) -> list[str]:
        params, table = job.params, job.target_table
        ddl = AddColumnDdl(table, 0, params)  # the job's id is not known yet: 0 in names
        lines = [f"prepare (write-only): {s}" for s in ddl.prepare()]
        lines.append(f"backfill (write-reorg): {_update(job).update()}"
                     " per batch")
        if params["not_null"]:
            lines += [f"not-null (write-reorg): {s}" for s in ddl.add_check()]
            lines.append(f"not-null (write-reorg): {ddl.validate_check()}")
        lines += [f"cut-over (public): {s}" for s in ddl.cut_over()]
        lines += [f"rollback: {s}" for s in ddl.rollback()]
        return [on_one_line(line) for line in lines]

    # --- owner ---------------------------------------------------------------------

    def prepare(self, conn: Connection, job: Job) -> None:
        set_ddl_lock_timeout(conn)
        for stmt in _ddl(job).prepare():
            conn.execute(text(stmt))

    def enter_step(self, conn: Connection, job: Job, step: int) -> None:
        if step == NOT_NULL:
            set_ddl_lock_timeout(conn)
            for stmt in _ddl(job).add_check():
                conn.execute(text(stmt))

    def fixed_subtasks(self, conn: Connection, job: Job, step: int) -> list[dict[str, Any]]:
        return [{"validate": True}] if job.params["not_null"] else []

    def advance(self, conn: Connection, job: Job) -> None:
        set_ddl_lock_timeout(conn)
        for stmt in _ddl(job).cut_over():
            conn.execute(text(stmt))

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return False  # the column is the job's own: dropping it restores the table

    def revert(self, conn: Connection, job: Job) -> None:
        set_ddl_lock_timeout(conn)
        ddl = _ddl(job)
        statements = ddl.rollback() if relation_exists(conn, job.target_table) else [
            f"DROP FUNCTION IF EXISTS {ddl.function}()"]
        for stmt in statements:
            conn.execute(text(stmt))

    # --- workers -------------------------------------------------------------------

    def run_subtask(self, ctx: SubtaskContext, engine: Engine) -> None:
        if ctx.job.step == NOT_NULL:
            self._validate_not_null(ctx, engine)
            return
        ctx.run_batches(engine, lambda conn: self.run_batch(ctx, conn),
                        alone=lambda engine: self.run_batch_alone(ctx, engine))

    @staticmethod
    def run_batch_alone(ctx: SubtaskContext, engine: Engine) -> int | None:
        """The batch as one statement with its checkpoint, where it can be
        (``run_update_batch_alone``); None where not."""
        job = ctx.job
        return run_update_batch_alone(ctx, engine, lambda bounded: _update(job, bounded),
                                      filtered=False)

    def run_batch(self, ctx: SubtaskContext, conn: Connection) -> int:
        """One backfill batch from ``ctx.curr_key``, checkpointed, not committed."""
        job = ctx.job
        return run_update_batch(ctx, conn, lambda bounded: _update(job, bounded),
                                filtered=False)

    @staticmethod
    def _validate_not_null(ctx: SubtaskContext, engine: Engine) -> None:
        """VALIDATE CONSTRAINT: one scan, its lease renewed by the pool; a NULL
        left by --value fails the job, which is then rolled back."""
        job = ctx.job
        ddl = _ddl(job)
        try:
            with engine.begin() as conn, ctx.cancel_on_stop(conn):
                conn.execute(text("SET LOCAL statement_timeout = 0"))
                set_ddl_lock_timeout(conn)
                conn.execute(text(ddl.validate_check()))
                ctx.checkpoint(conn, ctx.end_key, 0)
        except IntegrityError:
            with engine.begin() as conn:
                key = conn.execute(text(
                    f"SELECT {job.key.read()} FROM {job.target_table} "
                    f"WHERE {ddl.column} IS NULL ORDER BY {job.key.order_by()} LIMIT 1")).scalar()
            raise ValueError(
                f"--not-null: column {job.params['column']} is NULL in some rows (e.g. key "
                f"{shown(decode(key))}): --value gives NULL there; make --value never NULL, e.g. "
                f"coalesce(..., default)") from None

    def revert_subtask(self, ctx: SubtaskContext, engine: Engine) -> None:
        raise AssertionError("add-column plans no revert subtasks")


def _ddl(job: Job) -> AddColumnDdl:
    return AddColumnDdl(job.target_table, job.id, job.params)


def _update(job: Job, bounded: bool = True) -> UpdateSql:
    table, params = job.target_table, job.params
    return UpdateSql(table, alias_of(table), job.key, params["column"], params["expr"], None,
                     None, bounded=bounded)


def _column_spec(conn: Connection, table: TableInfo, value: str) -> tuple[str, str]:
    column, sep, type_ = (value or "").partition(":")
    if not sep or not type_.strip():
        raise InvalidParams(f"--column {value!r} is not COLUMN:TYPE, e.g. --column c:text")
    column = check_identifier(column.strip(), "column")
    if column in table.columns:
        raise InvalidParams(f"column {column} already exists in {table.display}; "
                            "choose a new column name")
    return column, resolve_type(conn, type_.strip())


def _check_default(conn: Connection, table: TableInfo, column: str, type_: str,
                   default: str) -> None:
    """SET DEFAULT on an empty clone of the table (LIKE: ACCESS SHARE only)."""
    clone = "pg_temp.reorg_check_default"
    try:
        with conn.begin_nested() as savepoint:
            conn.execute(text(f"CREATE TEMP TABLE {clone} (LIKE {table.qualified}) "
                              "ON COMMIT DROP"))
            conn.execute(text(f"ALTER TABLE {clone} ADD COLUMN {quote(column)} {type_} "
                              f"DEFAULT {embed(default)}"))
            savepoint.rollback()
    except Exception as exc:
        raise InvalidParams(f"--default {default!r} does not work for {column} {type_}: "
                            f"{one_line(exc)}; give a constant or a function of no column") from None


def register() -> None:
    jobtype.register(AddColumn())
