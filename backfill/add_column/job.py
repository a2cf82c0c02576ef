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
UPDATE per batch of the rows whose column IS NULL, committed with its
fenced checkpoint (DESIGN 3), EXPR evaluated on the row version the UPDATE
locks (DESIGN 9); a value the application wrote in the column is never
replaced (``owned``). The cut-over's DDL waits for its locks a bounded time;
the owner retries it.

A table whose row triggers the backfill would fire, or whose BEFORE trigger
would fire after the job's, is refused at submit and in prepare
(``backfill.schema.user_triggers``); the latter again at the cut-over.

Rollback from any state drops the triggers, their functions, the ownership
table and the column (and the check with it): the table is as before,
whatever the backfill wrote.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from backfill.add_column.ddl import BODY_QUOTE, JOB_SETTING, AddColumnDdl
from backfill.expressions import embed, on_one_line, one_expression, optional_expression
from backfill.ranged_update import UpdateSql, alias_of, check_update_statement
from backfill.rewrite import handover
from backfill.schema import catalog, user_triggers
from backfill.tables import (
    TableInfo,
    check_identifier,
    inspect_table,
    quote,
    relation_exists,
    resolve_type,
    set_ddl_lock_timeout,
)
from backfill.update_batch import write_update_batch
from framework import jobtype, long_statements
from framework.errors import InvalidParams, one_line
from framework.jobtype import JobType
from framework.keys import END, Key, decode, shown
from framework.records import Job, Step, Target
from framework.subtask import Batch, SubtaskContext

BACKFILL, NOT_NULL = 1, 2  # stored step numbers: never renumber


class AddColumn(JobType):
    name = "add-column"
    # Its batches are keyset ranges of any key (framework.keys).
    keys_of_any_type = True
    submit_options = "backfill.add_column.options:add_column"
    steps = (Step("backfill", restore=False, schema_state="write-reorg"),
             Step("not-null", ranges=False, restore=False, schema_state="write-reorg"))
    done_schema_state = "public"
    batch_steps = (BACKFILL,)  # quick backfill subtasks share a transaction (batch_writer)
    # No opt-out of the owner's catch-up ranges (framework.catch_up): the
    # split runs before prepare creates the trigger, so rows inserted between
    # them lie past the last range with no value; the first catch-up round
    # covers them (later rows have the trigger's). So rows still arriving
    # after the last round were not missed:
    trigger_covers_inserts = True

    # --- submit ------------------------------------------------------------------

    def handed_over(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        return handover.add_column(params)  # --method rewrite: a rewrite job

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        table = inspect_table(conn, params.get("table", ""), any_key=True)
        _refuse_inheritance_children(conn, table.qualified, table.display)
        column, type_ = _column_spec(conn, table, params.get("column", ""))
        expr = one_expression(params.get("value", ""), "--value")
        if BODY_QUOTE in expr:
            raise InvalidParams(f"--value must not contain {BODY_QUOTE}; write it otherwise")
        check_update_statement(conn, table, column, expr, None, type_, adding=True,
                               option="--value")
        default = optional_expression(params.get("default"), "--default")
        if default:
            _check_default(conn, table, column, type_, default)
        user_triggers.check(conn, table.qualified, table.display, params)
        normalised: dict[str, Any] = {
            "table": table.display, "key": table.key, "column": column, "column_type": type_,
            "expr": expr, "default": default, "not_null": bool(params.get("not_null")),
            user_triggers.ALLOW: user_triggers.allowed(params),
        }
        partitions = catalog.leaf_partitions(conn, table.qualified)
        if partitions:  # the cut-over fills those attached since (_fill_new_partitions)
            normalised[PARTITIONS] = partitions
        return Target(table.qualified, table.key_sql, normalised, key=table.key_spec)

    def describe(self, conn: Connection, job: Job) -> list[str]:
        params, table = job.params, job.target_table
        ddl = _ddl(job)  # the job's id is not known yet: 0 in names
        lines = [f"prepare (write-only): {s}" for s in ddl.prepare()]
        lines.append(f"backfill (write-reorg): {_update(job).update()}"
                     " per batch")
        fix_up = ddl.owned.fix_up(table, alias_of(table), params["column"], bounded=True)
        lines.append(f"backfill (write-reorg): {fix_up} after it (explicit NULLs kept)")
        if params["not_null"]:
            lines += [f"not-null (write-reorg): {s}" for s in ddl.add_check()]
            lines.append(f"not-null (write-reorg): {ddl.validate_check()}")
        lines += [f"cut-over (public): {s}" for s in [ddl.lock(), *ddl.cut_over()]]
        lines += [f"rollback: {s}" for s in ddl.rollback()]
        return [on_one_line(line) for line in lines]

    # --- owner ---------------------------------------------------------------------

    def prepare(self, conn: Connection, job: Job) -> None:
        # Again: the table's triggers may have changed since the submit.
        user_triggers.check(conn, job.target_table, job.params["table"], job.params)
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
        """The cut-over; first, under its lock, what the submit refuses is
        checked again: a child table made during the job (its rows never
        went through the trigger) fails the job, whose rollback drops the column."""
        set_ddl_lock_timeout(conn)
        ddl = _ddl(job)
        conn.execute(text(ddl.lock()))
        try:
            _refuse_inheritance_children(conn, job.target_table, job.params["table"])
        except InvalidParams as exc:
            raise CutOverRefused(f"{job.params['table']} changed during the job: {exc}; the "
                                 "cut-over refused it and the job is rolled back, the table "
                                 "as it was: resolve that, then submit the job again") from None
        # Under the lock (SHARE ROW EXCLUSIVE at least: CREATE TRIGGER waits
        # for it too), no trigger is made or renamed before the commit.
        user_triggers.check_still_last(conn, job.target_table, job.params["table"])
        _fill_new_partitions(conn, job)
        for stmt in ddl.cut_over():
            conn.execute(text(stmt))

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return False  # the column is the job's own: dropping it restores the table

    def revert(self, conn: Connection, job: Job) -> None:
        set_ddl_lock_timeout(conn)
        ddl = _ddl(job)
        statements = (ddl.rollback() if relation_exists(conn, job.target_table)
                      else ddl.drop_work())
        for stmt in statements:
            conn.execute(text(stmt))

    # --- workers -------------------------------------------------------------------

    def run_subtask(self, ctx: SubtaskContext) -> None:
        if ctx.job.step == NOT_NULL:
            self._validate_not_null(ctx)
            return
        super().run_subtask(ctx)

    def write_batch(self, ctx: SubtaskContext, conn: Connection) -> Batch:
        """One backfill batch from ``ctx.curr_key``: its UPDATE, then the
        fix-up of explicit NULLs (``owned``), both unseen by the job's own
        triggers."""
        job = ctx.job
        conn.execute(text(f"SELECT set_config('{JOB_SETTING}', :job, true)"),
                     {"job": str(job.id)})
        # Not ``filtered``: the filter skips only rows the application wrote,
        # few, so batches stay on fixed bounds (counting the rows they wrote).
        return write_update_batch(ctx, conn, lambda bounded: _update(job, bounded),
                                  filtered=False,
                                  after_write=lambda conn, lo, hi: _keep_nulls(ctx, conn, lo, hi))

    @staticmethod
    def _validate_not_null(ctx: SubtaskContext) -> None:
        """VALIDATE CONSTRAINT: one scan, its lease renewed by the pool, on a
        long statement's session (``framework.long_statements``), checkpointed
        in its transaction; a NULL left by --value fails the job, which is
        then rolled back."""
        job = ctx.job
        ddl = _ddl(job)
        try:
            with long_statements.session(ctx, autocommit=False) as session:

                def validate(conn: Connection) -> Batch:
                    set_ddl_lock_timeout(conn)
                    conn.execute(text(ddl.validate_check()))
                    return Batch(ctx.end_key, 0)

                ctx.commit(validate, on=session)
        except IntegrityError:
            with ctx.engine.begin() as conn:
                key = conn.execute(text(
                    f"SELECT {job.key.read()} FROM {job.target_table} "
                    f"WHERE {ddl.column} IS NULL ORDER BY {job.key.order_by()} LIMIT 1")).scalar()
            raise ValueError(
                f"--not-null: column {job.params['column']} is NULL in some rows (e.g. key "
                f"{shown(decode(key))}): --value gives NULL there; make --value never NULL, e.g. "
                f"coalesce(..., default)") from None



# params: the table's partitions at submit (a partitioned table only).
PARTITIONS = "partitions"


def _fill_new_partitions(conn: Connection, job: Job) -> None:
    """The cut-over's fill of each partition the table has gained since the
    submit. One created as a partition (``CREATE TABLE ... PARTITION OF``)
    had the trigger, cloned by PostgreSQL, for every row; one attached
    (``ATTACH PARTITION``) brought rows that never met it, in ranges the
    backfill may have passed already. A batch over the whole partition, under
    the cut-over's lock, gives them --value as the backfill would (only rows
    still NULL, the application's explicit NULLs kept): a short scan for a
    partition made during the job, as long as its size for an attached one."""
    known = job.params.get(PARTITIONS)
    if known is None:
        return  # not partitioned at submit (or submitted by a version before)
    ddl, key = _ddl(job), job.key
    conn.execute(text(f"SELECT set_config('{JOB_SETTING}', :job, true)"), {"job": str(job.id)})
    owned = relation_exists(conn, ddl.owned.table)
    for partition in catalog.leaf_partitions(conn, job.target_table):
        if partition in known:
            continue
        first = conn.execute(text(f"SELECT {key.read()} FROM {partition} "
                                  f"ORDER BY {key.order_by()} LIMIT 1")).scalar()
        if first is None:
            continue
        lo = {"lo": key.bind(decode(first))}
        fill = UpdateSql(partition, alias_of(job.target_table), key, job.params["column"],
                         job.params["expr"], f"{ddl.column} IS NULL", None, bounded=False)
        conn.execute(text(fill.update()), lo)
        if owned:
            conn.execute(text(ddl.owned.fix_up(partition, alias_of(job.target_table),
                                               job.params["column"], bounded=False)), lo)


class CutOverRefused(RuntimeError):
    """The table changed during the job in a way the cut-over cannot carry:
    not retryable, so the job fails and is rolled back."""


def _refuse_inheritance_children(conn: Connection, table: str, display: str) -> None:
    """A table with inheritance children: the column is added to them too,
    but the trigger is the table's own, so rows written to a child never get
    --value. (Partitions are carried: PostgreSQL clones the trigger to every
    partition, and the cut-over fills those attached during the job,
    ``_fill_new_partitions``.)"""
    tree = catalog.inheritance(conn, table)
    if tree is not None and tree.children and not tree.partitioned:
        raise InvalidParams(
            f"table {display} has inheritance children ({', '.join(tree.children)}): rows "
            "written to them would not get --value (the trigger fires on the table alone); "
            "add the column with ALTER TABLE ... ADD COLUMN instead")


def _ddl(job: Job) -> AddColumnDdl:
    return AddColumnDdl(job.target_table, job.id, job.params, job.key)


def _update(job: Job, bounded: bool = True) -> UpdateSql:
    """The batch: only rows whose column IS NULL (a value there is the
    application's, ``owned``), tested on the row version the UPDATE locks."""
    table, params = job.target_table, job.params
    return UpdateSql(table, alias_of(table), job.key, params["column"], params["expr"],
                     f"{quote(params['column'])} IS NULL", None, bounded=bounded)


# ctx.batch_state: whether the job has its ownership table (not if a version
# before it prepared the job: nothing to fix up then).
_OWNED_TABLE = "add_column.owned_table"


def _keep_nulls(ctx: SubtaskContext, conn: Connection, lo: Key, hi: Key) -> None:
    """Set back to NULL what the batch filled where the application had
    written NULL meanwhile (``owned``): reorg's statement, run as the worker."""
    job = ctx.job
    owned = _ddl(job).owned
    if _OWNED_TABLE not in ctx.batch_state:
        ctx.batch_state[_OWNED_TABLE] = relation_exists(conn, owned.table)
    if not ctx.batch_state[_OWNED_TABLE]:
        return
    table = job.target_table
    conn.execute(text(owned.fix_up(table, alias_of(table), job.params["column"],
                                   bounded=hi is not END)),
                 {"lo": job.key.bind(lo), "hi": job.key.bind(hi)})


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
