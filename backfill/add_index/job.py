"""``add-index``: an index built online, under the job's leases.

    reorg submit add-index --table T --columns A[,B...] [--unique] [--name N] [--where PRED]

Steps (TiDB's schema states beside them)::

    check-duplicates (--unique only: hash buckets) ─► build (1 subtask) ─► cut-over
    none: no index yet                                write-reorg          public
    (a duplicate fails the job here,                  CREATE INDEX          the index is
     before any index exists)                         CONCURRENTLY          valid

``build`` runs ``CREATE [UNIQUE] INDEX CONCURRENTLY`` on a worker, outside
any transaction (``backfill.add_index.build``): PostgreSQL's own delete-only
→ write-only → write-reorg → public, with its percent from
``pg_stat_progress_create_index``. The cut-over only checks the index is
valid. Cancel or failure drops the index (valid or invalid) in the owner's
revert, under a bounded lock_timeout, retried; an index of the same name
that is not the job's is never dropped.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.add_index import duplicates
from backfill.add_index.build import build_index, index_state
from backfill.expressions import embed, on_one_line, optional_expression
from backfill.tables import (
    TableInfo,
    check_identifier,
    check_where,
    inspect_table,
    quote,
    set_ddl_lock_timeout,
)
from framework import jobtype
from framework.errors import InvalidParams, one_line
from framework.jobtype import JobType
from framework.records import Job, Step, Target
from framework.subtask import Batch, SubtaskContext

CHECK, BUILD = 1, 2  # stored step numbers: never renumber
NAME_BYTES = 63  # PostgreSQL's identifier limit
_SCHEMA = re.compile(r'^("(?:[^"]|"")*")\.')


class AddIndex(JobType):
    name = "add-index"
    # Neither step ranges over the table's key (hash buckets, then one build):
    # any key will do (framework.keys); it only names duplicates' rows.
    keys_of_any_type = True
    submit_options = "backfill.add_index.options:add_index"
    steps = (Step("check-duplicates", ranges=False, restore=False, schema_state="none"),
             Step("build", ranges=False, restore=False, schema_state="write-reorg"))
    done_schema_state = "public"

    # --- submit ------------------------------------------------------------------

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        table = inspect_table(conn, params.get("table", ""), any_key=True)
        columns = _columns(table, params.get("columns"))
        where = optional_expression(params.get("where"), "--where")
        if where:
            check_where(conn, table, where)
        unique = bool(params.get("unique"))
        name = _index_name(conn, table, columns, params.get("name"))
        _check_index_on_clone(conn, table, columns, where)
        return Target(table.qualified, table.key_sql, {
            "table": table.display, "columns": columns, "unique": unique, "where": where,
            "name": name, "index": f"{schema_of(table.qualified)}.{quote(name)}",
            "hashable": duplicates.key_is_hashable(conn, table.qualified, columns),
        }, key=table.key_spec)

    def describe(self, conn: Connection, job: Job) -> list[str]:
        params, table = job.params, job.target_table
        lines = []
        if params["unique"]:
            lines.append("check-duplicates (none): GROUP BY the key per hash bucket; a "
                         "duplicate fails the job before any index exists")
        lines.append(f"build (write-reorg): {create_statement(params, table)}")
        lines.append(f"build (write-reorg): COMMENT ON INDEX {params['index']} (the job's own)")
        lines.append("cut-over (public): checks the index is valid")
        lines.append(f"rollback: DROP INDEX IF EXISTS {params['index']}")
        return [on_one_line(line) for line in lines]

    # --- owner ---------------------------------------------------------------------

    def prepare(self, conn: Connection, job: Job) -> None:
        pass  # nothing exists before the build: state none

    def fixed_subtasks(self, conn: Connection, job: Job, step: int) -> list[dict[str, Any]]:
        p = job.params
        if step == CHECK:
            if not p["unique"]:
                return []  # nothing to check: the step ends at once
            count = duplicates.bucket_count(conn, job.target_table, p["hashable"],
                                            p.get("rows_per_subtask"))
            return [{"bucket": b, "buckets": count} for b in range(count)]
        return [{"index": p["index"]}]

    def advance(self, conn: Connection, job: Job) -> None:
        """The cut-over: the index the build step left must be there and valid."""
        state = index_state(conn, job.params["index"], job.id)
        if state != "ours":
            raise ValueError(f"index {job.params['index']} is {state} after its build; "
                             "the job is rolled back")

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return False  # nothing written to the table's rows: the DROP is all

    def revert(self, conn: Connection, job: Job) -> None:
        """Drop the job's index: an invalid one (an interrupted build) or one
        carrying the job's comment, never another's of the same name. A plain
        DROP INDEX (this runs in the owner's transaction) holds its lock for
        a moment; its wait is bounded and the owner retries it."""
        index = job.params["index"]
        # A build a dead worker left running was ended by the owner before
        # this (framework.long_statements), so the DROP does not wait for it.
        if index_state(conn, index, job.id) in ("invalid", "ours"):
            set_ddl_lock_timeout(conn)
            conn.execute(text(f"DROP INDEX IF EXISTS {index}"))

    # --- workers -------------------------------------------------------------------

    def run_subtask(self, ctx: SubtaskContext) -> None:
        if ctx.job.step == CHECK:
            self._check_bucket(ctx)
        elif ctx.job.step == BUILD:
            build_index(ctx, create_statement(ctx.job.params, ctx.job.target_table),
                        ctx.job.params["index"])
        else:
            raise ValueError(f"add-index has no step {ctx.job.step}")

    @staticmethod
    def _check_bucket(ctx: SubtaskContext) -> None:
        job, p = ctx.job, ctx.job.params

        def check(conn: Connection) -> Batch:
            conn.execute(text("SET LOCAL statement_timeout = 0"))  # one scan, lease renewed
            found = duplicates.find_duplicates(
                conn, table=job.target_table, key=job.key, columns=p["columns"],
                where=p["where"], bucket=ctx.meta["bucket"], buckets=ctx.meta["buckets"])
            if found:
                raise ValueError(duplicates.describe(found, p["columns"]))
            return Batch(ctx.end_key, 0)

        ctx.commit(check)


def create_statement(params: dict[str, Any], table: str) -> str:
    cols = ", ".join(quote(c) for c in params["columns"])
    unique = "UNIQUE " if params["unique"] else ""
    where = f" WHERE {embed(params['where'])}" if params.get("where") else ""
    return (f"CREATE {unique}INDEX CONCURRENTLY {quote(params['name'])} ON {table} ({cols})"
            f"{where}")


def schema_of(qualified: str) -> str:
    match = _SCHEMA.match(qualified)
    assert match, qualified
    return match.group(1)


def _columns(table: TableInfo, given: Any) -> list[str]:
    raw = given if isinstance(given, list) else str(given or "").split(",")
    columns = [c.strip() for value in raw for c in str(value).split(",") if c.strip()]
    if not columns:
        raise InvalidParams("no --columns given; name the index's columns, e.g. --columns a,b")
    for column in columns:
        check_identifier(column, "column")
        if column not in table.columns:
            raise InvalidParams(f"column {column} does not exist in {table.display}; "
                                f"choose from {', '.join(table.columns)}")
    if len(set(columns)) != len(columns):
        raise InvalidParams(f"--columns {','.join(columns)} names a column twice; list each once")
    return columns


def _index_name(conn: Connection, table: TableInfo, columns: list[str], given: Any) -> str:
    """--name, free in the table's schema; or PostgreSQL's own style of name
    (``table_a_b_idx``), numbered until free."""
    schema = schema_of(table.qualified)
    if given:
        name = check_identifier(str(given).strip(), "--name")
        if _taken(conn, schema, name):
            raise InvalidParams(f"--name {name}: a relation of that name already exists in "
                                f"{schema}; choose another name")
        return name
    base = "_".join([table.display.split(".")[-1], *columns])
    for n in range(1000):
        suffix = "_idx" if n == 0 else f"_idx{n}"
        name = base[:NAME_BYTES - len(suffix)] + suffix
        if not _taken(conn, schema, name):
            return name
    raise InvalidParams(f"no free index name for {table.display}; pass --name")


def _taken(conn: Connection, schema: str, name: str) -> bool:
    return bool(conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"),
                             {"n": f"{schema}.{quote(name)}"}).scalar())


def _check_index_on_clone(conn: Connection, table: TableInfo, columns: list[str],
                          where: str | None) -> None:
    """Build the index on an empty clone of the table (LIKE takes ACCESS SHARE
    only): a column type without a btree operator class or a predicate that
    is not immutable fails here, at submit, not in the build."""
    clone = "pg_temp.reorg_check_index"
    cols = ", ".join(quote(c) for c in columns)
    predicate = f" WHERE {embed(where)}" if where else ""
    with conn.begin_nested() as savepoint:
        conn.execute(text(f"CREATE TEMP TABLE {clone} (LIKE {table.qualified}) ON COMMIT DROP"))
        try:
            with conn.begin_nested():
                conn.execute(text(f"CREATE INDEX ON {clone} ({cols}){predicate}"))
        except Exception as exc:
            raise InvalidParams(f"no index on ({', '.join(columns)}){predicate and ' WHERE ...'} "
                                f"can be built on {table.display}: {one_line(exc)}; fix "
                                "--columns or --where") from None
        savepoint.rollback()


def register() -> None:
    jobtype.register(AddIndex())

