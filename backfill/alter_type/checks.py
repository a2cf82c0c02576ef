"""What ``reorg submit alter-type`` refuses, each with one line saying what is
wrong and what to do instead (DESIGN 11). Run at submit, and again by the
owner in ``prepare`` (the table may have changed since); what a swap cannot
carry (``check_swappable``) is checked a third time by the cut-over, under
its lock (DESIGN 15).

Refused, because a swap of columns cannot carry them over safely:
partitioned tables, partitions and tables with inheritance parents or
children; generated columns; an identity column to any type but an integer
at least as wide (its sequence is made again on the new column by the cut-over);
a column referenced by a foreign
key; a column a view, materialized view, generated column, trigger,
policy, rule, extended statistics or a publication's column list or row
filter depend on; an exclusion constraint on the column; a column of the
table's key (of any type, ``framework.keys``) to a type no unique btree
index takes.

Refused because the job would break DESIGN 14: a user BEFORE trigger that
would fire after the job's, and row triggers the backfill would fire unless
the user accepts them (``backfill.schema.user_triggers``)."""

from __future__ import annotations

from typing import Any

from pglast.parser import ParseError
from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.alter_type import names, plan
from backfill.expressions import one_expression
from backfill.schema import catalog, user_triggers
from backfill.tables import (
    TableInfo,
    check_identifier,
    explain_or_fail,
    inspect_table,
    resolve_type,
)
from framework.errors import InvalidParams, one_line
from framework.records import Job, Target

USE_ALTER = "change it with ALTER TABLE ... TYPE in a maintenance window instead"


def check(conn: Connection, params: dict[str, Any]) -> Target:
    """The normalised params of a valid request, or InvalidParams."""
    table_name = params.get("table") or ""
    refuse_table_kind(conn, table_name)
    table = inspect_table(conn, table_name, any_key=True)
    column = check_identifier(params.get("column") or "", "--column")
    facts = catalog.column_facts(conn, table.qualified, column)
    if facts is None:
        raise InvalidParams(f"column {column} does not exist in {table.display}; "
                            f"check --column (columns: {', '.join(table.columns)})")
    type_name = resolve_type(conn, (params.get("type") or "").strip())
    using = params.get("using")
    using = one_expression(using, "--using") if using is not None else None
    if _same_type(conn, facts.type, type_name) and using is None:
        raise InvalidParams(f"column {column} of {table.display} is already {facts.type}; "
                            "nothing to change (give another --type, or --using)")
    shadow = names.shadow_column(column)
    if len(shadow) > names.MAX_IDENTIFIER:
        raise InvalidParams(f"column name {column} is too long for its shadow column {shadow} "
                            f"(PostgreSQL allows {names.MAX_IDENTIFIER} characters); {USE_ALTER}")
    if shadow in table.columns:
        raise InvalidParams(f"{table.display} already has a column {shadow} (the shadow column "
                            "alter-type would add): a job on it is running or left it; drop it "
                            "if it is a leftover")
    where = f"column {column} of {table.display}"
    _check_key_column(conn, table, column, type_name, where)
    _check_identity(conn, facts, type_name, where)
    check_swappable(conn, table.qualified, table.display, facts)
    normalised: dict[str, Any] = {"table": table.display, "column": column, "type": type_name,
                  "shadow": shadow}
    user_triggers.check(conn, table.qualified, table.display, params)
    if user_triggers.allowed(params):
        normalised[user_triggers.ALLOW] = True
    if using is not None:
        normalised["using"] = using
    explain_or_fail(conn, f"SELECT {plan.expression(normalised)} FROM {table.qualified} "
                          "WHERE :one = 1", {"one": 1},
                    f"{'--using' if using else '--type'} does not work on {where}",
                    "give an expression of the column that converts to the new type "
                    "(--using)" if using is None else "fix the expression")
    if not _has_equality(conn, type_name):
        normalised["verify_as_text"] = True
    _check_rewrites(conn, table.qualified, table.key_sql, normalised, facts.attnum, where)
    return Target(table.qualified, table.key_sql, normalised, key=table.key_spec)


def _check_identity(conn: Connection, facts: catalog.ColumnFacts, type_name: str,
                    where: str) -> None:
    """An identity column keeps its identity on the new column (the cut-over
    re-creates its sequence there, at the same value): only on an integer
    type at least as wide, whose range holds every value the sequence had."""
    if not facts.identity:
        return
    old, new = (catalog.integer_width(conn, t) for t in (facts.type, type_name))
    if new is None or old is None or new < old:
        raise InvalidParams(f"{where} is an identity column of type {facts.type}; alter-type "
                            "keeps its identity on a wider integer type only (e.g. bigint); "
                            f"{USE_ALTER}")


def _check_key_column(conn: Connection, table: TableInfo, column: str, type_name: str,
                      where: str) -> None:
    """A column of the key the job splits by (one integer column, any other
    type, or one of several) may be altered: the ranges and batches run on
    the old column, which the cut-over swaps out only as the job's last act,
    in the transaction that marks it succeeded; no range ever runs on a key
    whose type changed under it, and a rollback never sees the new column in
    the key. What must hold is that the new column can take the old one's
    place in the key's unique index: refused now, not after the backfill."""
    if column not in table.key_spec.columns:
        return
    probe = "pg_temp.reorg_check_key"
    try:
        with conn.begin_nested() as savepoint:
            conn.execute(text(f"CREATE TEMP TABLE {probe} (k {type_name}) ON COMMIT DROP"))
            conn.execute(text(f"CREATE UNIQUE INDEX ON {probe} (k)"))
            savepoint.rollback()
    except Exception as exc:
        described = table.key_spec.described()
        if not described.startswith("("):
            described = f"({described})"
        raise InvalidParams(f"{where} is in the key of {table.display} {described} and its "
                            "unique index cannot be "
                            f"rebuilt on type {type_name}: {one_line(exc)}; choose a type with "
                            f"a btree order (e.g. bigint, text, numeric), or {USE_ALTER}") from None


def check_swappable(conn: Connection, table: str, display: str,
                    facts: catalog.ColumnFacts) -> None:
    """What a swap of the column cannot carry over, refused in one line
    naming it: at submit, in prepare, and again by the cut-over under its
    lock (``cutover``), since any of it may appear while the job runs."""
    refuse_table_kind(conn, table, display)
    where = f"column {facts.name} of {display}"
    if facts.generated:
        raise InvalidParams(f"{where} is a generated column; {USE_ALTER}")
    if not facts.not_null_valid:
        # PostgreSQL 18: NOT NULL ... NOT VALID. The new column's SET NOT NULL
        # would make it valid (and fail on a NULL the old one lets be).
        raise InvalidParams(f"{where} has NOT NULL constraint {facts.not_null_constraint} NOT "
                            "VALID, which the swap would make valid: validate it first (ALTER "
                            f"TABLE ... VALIDATE CONSTRAINT {facts.not_null_constraint}) or drop "
                            f"it, or {USE_ALTER}")
    fks = catalog.referencing_foreign_keys(conn, table, facts.attnum)
    if fks:
        raise InvalidParams(f"{where} is referenced by foreign key {', '.join(fks)}; a swap of "
                            "columns would drop it: drop the foreign key first and add it back "
                            f"after, or {USE_ALTER}")
    dependents = catalog.blocking_dependents(conn, table, facts.attnum)
    if dependents:
        raise InvalidParams(f"{where} is used by {', '.join(dependents)}; a swap of columns "
                            f"would drop it: drop it first and create it again after, or "
                            f"{USE_ALTER}")


def refuse_table_kind(conn: Connection, name: str, display: str | None = None) -> None:
    """A partitioned table, a partition, or a table with inheritance parents
    or children: the cut-over's DROP and RENAME COLUMN recurse into every
    child, whose rows the job never converts (they would lose the column's
    values), and a partition's column cannot change alone."""
    tree = catalog.inheritance(conn, name)
    if tree is None or tree.plain:
        return  # inspect_table says it does not exist
    shown = display or name
    if tree.partitioned:
        raise InvalidParams(f"table {shown} is partitioned; alter-type cannot swap a column of "
                            f"every partition in one short transaction; {USE_ALTER}")
    relation = (f"a partition of {tree.partition_of}" if tree.partition_of
                else f"inherits from {', '.join(tree.parents)}" if tree.parents
                else f"inheritance children {', '.join(tree.children)}")
    raise InvalidParams(f"table {shown} is part of an inheritance tree ({relation}); "
                        f"alter-type works on a plain table only; {USE_ALTER}")


def _has_equality(conn: Connection, type_name: str) -> bool:
    """Whether values of the type compare with ``=`` (json, point, xml do not):
    else verify compares their text forms."""
    try:
        with conn.begin_nested():
            conn.execute(text(f"SELECT CAST(NULL AS {type_name}) IS NOT DISTINCT FROM "
                              f"CAST(NULL AS {type_name}) WHERE :one = 1"), {"one": 1})
    except Exception:
        return False
    return True


def _same_type(conn: Connection, current: str, wanted: str) -> bool:
    """Whether ``wanted`` (as the user wrote it) names the column's type."""
    if "(" in current or "(" in wanted:  # a typmod: compare as written, spaces aside
        return current.replace(" ", "").lower() == wanted.replace(" ", "").lower()
    return bool(conn.execute(text("SELECT to_regtype(:w) = to_regtype(:c)"),
                             {"w": wanted, "c": current}).scalar())


def _check_rewrites(conn: Connection, table: str, key: str, params: dict[str, Any],
                    attnum: int, where: str) -> None:
    """Every index and constraint on the column can be moved to the shadow column."""
    job = Job(id=0, type="alter-type", state="queued", step=0,
              params={**params, "work_schema": "reorg"}, target_table=table, key_column=key,
              batch_rows=1, max_rows_per_sec=None, row_estimate=None)
    for index in catalog.covering_indexes(conn, table, attnum):
        if index.constraint_type == "x":
            raise InvalidParams(f"{where} has exclusion constraint {index.constraint}; "
                                f"alter-type cannot rebuild it online; {USE_ALTER}")
    try:
        plan.index_builds(conn, job, attnum)
        plan.constraint_clones(conn, job, attnum)
    except ParseError as exc:
        raise InvalidParams(f"an index or constraint on {where} cannot be moved to a new column "
                            f"({exc}); {USE_ALTER}") from None

