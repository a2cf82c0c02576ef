"""``sql-update``: set a column from a PostgreSQL expression, range by range.

    reorg submit sql-update --table T --set COL=EXPR [--where PRED] [--add-column COL:TYPE]

Each batch is one ``UPDATE t SET col = (expr) WHERE key in [lo, hi) AND pred``
committed with its fenced checkpoint (DESIGN 3). PostgreSQL evaluates EXPR on
the row version it writes, so a concurrent application write is never
overwritten by a value computed from an older read (DESIGN 9). Overwriting an
existing column keeps before-images in the same statement, without row locks
(``statements.UpdateSql.update``); a column the job adds needs none.

Submit EXPLAINs (never runs) that very statement, built by the same function
(``backfill.ranged_update``), against a temporary clone of the table: the
column may not exist yet, and a clone needs only ACCESS SHARE on the user's
table, so a submit never queues a stronger lock on a production table.

Rollback (DESIGN 8, 13): a column the job added is dropped; when the job
overwrote an existing column, revert subtasks give rows the job wrote and
nobody wrote since (same ``xmin`` as the batch transaction) their old values
back, range by range and batch by batch; later application writes win. Then
the images are dropped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill import assignment
from backfill.expressions import on_one_line, one_expression, optional_expression
from backfill.ranged_update import UpdateSql, alias_of, check_update_statement
from backfill.restore import index_before_restoring, restore_in_batches
from backfill.tables import (
    quote,
    relation_exists,
    set_ddl_lock_timeout,
)
from backfill.update_batch import fixed_bounds_possible, write_update_batch
from framework import jobtype, privileges
from framework.jobtype import JobType
from framework.privileges import as_role, run_as
from framework.records import Job, Target
from framework.subtask import Batch, SubtaskContext


class SqlUpdate(JobType):
    name = "sql-update"
    # Its batches are keyset ranges of any key (framework.keys).
    keys_of_any_type = True
    submit_options = "backfill.sql_update.options:sql_update"

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        # Batches run as the submitter (framework.privileges): say now what
        # they would be refused.
        table, column, expr, type_, adding = assignment.check(conn, params)
        expr = one_expression(expr, "--set")
        where = optional_expression(params.get("where"), "--where")
        check_update_statement(conn, table, column, expr, where, type_, adding=adding)
        return Target(table.qualified, table.key_sql, {
            **params, "column": column, "expr": expr, "where": where, "column_type": type_,
            "overwrite": not adding,
        }, key=table.key_spec)

    def describe(self, conn: Connection, job: Job) -> list[str]:
        """What ``--dry-run`` prints: the UPDATE each batch runs (on the keys
        ``[:lo, :hi)`` of its batch; names of the job's work tables show its
        id as 0, not known yet) and the statements around the batches."""
        p, sql = job.params, update_sql(job)
        role = run_as(job)
        who = f" as {role}" if role else ""
        if p["overwrite"]:
            lines = [f"prepare: {s}" for s in sql.create_images(p["column_type"])]
        else:
            lines = [f"prepare: ALTER TABLE {job.target_table} ADD COLUMN "
                     f"{quote(p['column'])} {p['column_type']}"]
        if p["overwrite"]:
            if fixed_bounds_possible(job.key, filtered=bool(p.get("where"))):
                guarded = replace(sql, only_null_old=True, without_probe=True).update()
                does = "writes the rows whose old value is NULL; the one below does the rest"
            else:
                guarded = replace(sql, only_null_old=True).update()
                does = "writes only if every old value is NULL"
            lines.append(f"each batch{who}, keys [:lo, :hi), unless the last one kept images "
                         f"({does}): {guarded}")
            lines.append(f"each batch{who} with old values, keys [:lo, :hi) (rows the one "
                         f"above wrote left out): {sql.update()}")
        else:
            lines.append(f"each batch{who}, keys [:lo, :hi): {sql.update()}")
        if p["overwrite"]:
            lines.append(f"each batch, its range kept for a rollback: {sql.record_batch()}")
            lines += [f"cut-over: {s}" for s in sql.drop_images()]
            lines.append("rollback: rows the job wrote and nobody wrote since get their "
                         "old values back from the images, range by range")
        else:
            lines.append(f"rollback: ALTER TABLE {job.target_table} DROP COLUMN "
                         f"{quote(p['column'])}")
        return [on_one_line(line) for line in lines]

    def prepare(self, conn: Connection, job: Job) -> None:
        p = job.params
        set_ddl_lock_timeout(conn)
        if p["overwrite"]:
            sql = update_sql(job)
            for stmt in sql.create_images(p["column_type"]):
                conn.execute(text(stmt))
            # The batch's one statement keeps the images, as the submitter.
            privileges.grant_to_submitter(conn, job, "INSERT", sql.kept.images)
        else:
            with as_role(conn, run_as(job)):
                conn.execute(text(
                    f"ALTER TABLE {job.target_table} ADD COLUMN {quote(p['column'])} "
                    f"{p['column_type']}"))

    def write_batch(self, ctx: SubtaskContext, conn: Connection) -> Batch:
        job = ctx.job
        return write_update_batch(ctx, conn, lambda bounded: update_sql(job, bounded),
                                  filtered=bool(job.params.get("where")))

    def advance(self, conn: Connection, job: Job) -> None:
        if job.params["overwrite"]:
            for stmt in update_sql(job).drop_images():
                conn.execute(text(stmt))

    # --- revert step (DESIGN 8, 13) -------------------------------------------

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        """Overwritten values come back range by range; an added column needs
        only its DROP (``revert``)."""
        if not job.params["overwrite"]:
            return False
        _restore_legacy_images(conn, job)
        sql = update_sql(job)
        # The images' indexes are the revert subtasks' to build, not this
        # fenced transaction's (backfill.before_images).
        return bool(sql.batches and relation_exists(conn, sql.batches))

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        job = ctx.job
        kept = update_sql(job).kept
        index_before_restoring(ctx, table=kept.images, built=kept.indexed_for_restore(),
                               statements=kept.index_for_restore())
        restore_in_batches(ctx, paced_by=(job.target_table, job.key),
                           statements=lambda bounded: update_sql(job, bounded).restore_range())

    def revert(self, conn: Connection, job: Job) -> None:
        assignment.revert(conn, job, lambda: update_sql(job).kept)


def _restore_legacy_images(conn: Connection, job: Job) -> None:
    """A job prepared by reorg 0.1.0 kept (key, old, new) images in
    ``before_image_<id>`` and is restored by value, as that version did (its
    batches fail under this version, so the job rolls back instead of hanging)."""
    legacy = f'{quote(job.params["work_schema"])}."before_image_{job.id}"'
    if not relation_exists(conn, legacy):
        return
    col = quote(job.params["column"])
    conn.execute(text(
        f"UPDATE {job.target_table} t SET {col} = bi.reorg_old FROM {legacy} bi "
        f"WHERE t.{job.key_column} = bi.reorg_k AND t.{col} IS NOT DISTINCT FROM bi.reorg_new"))
    conn.execute(text(f"DROP TABLE {legacy}"))


def update_sql(job: Job, bounded: bool = True) -> UpdateSql:
    p = job.params
    work = quote(p["work_schema"])
    images = batches = None
    if p["overwrite"]:
        images = f"{work}.{quote(f'sql_update_{job.id}_images')}"
        batches = f"{work}.{quote(f'sql_update_{job.id}_batches')}"
    return UpdateSql(job.target_table, alias_of(job.target_table), job.key, p["column"],
                     p["expr"], p["where"], images, batches, bounded)


def register() -> None:
    jobtype.register(SqlUpdate())
