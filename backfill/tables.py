"""Facts about a user's table, read from the catalogue, and the checks of
user input against it, with the one-line errors that bad input deserves.
Shared by every job type's ``validate`` (and the owner steps' lock timeout)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.expressions import embed
from framework.errors import InvalidParams, one_line
from framework.keys import KeySpec, quote

# How long an owner step's DDL waits for its lock before it fails (and the
# owner retries the step later) instead of queueing every application query
# behind it.
DDL_LOCK_TIMEOUT = "5s"
FIX_WHERE = "fix the predicate (PostgreSQL syntax)"

PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")  # an identifier that needs no quotes


@dataclass(frozen=True)
class TableInfo:
    qualified: str  # quoted, e.g. "public"."items"
    display: str  # as users write it, e.g. public.items
    key: str  # unquoted name of the key's (first) column
    columns: dict[str, str]  # column name -> formatted type
    key_spec: KeySpec  # every key column, with its type

    @property
    def key_sql(self) -> str:
        """The key as one SQL value: the column, or a row of them."""
        return self.key_spec.expr()


def check_identifier(name: str, what: str) -> str:
    if not PLAIN_NAME.match(name or ""):
        raise InvalidParams(
            f"{what} {name!r} is not a plain column name; use letters, digits and underscores"
        )
    return name


def inspect_table(conn: Connection, name: str, *, any_key: bool = False) -> TableInfo:
    """The table and its key. ``any_key``: the caller's job type takes keys of
    any type (``framework.keys``); otherwise only one integer column."""
    if not name:
        raise InvalidParams("no table given; pass --table SCHEMA.TABLE")
    row = conn.execute(
        text("""
            SELECT c.oid, n.nspname, c.relname, c.relkind
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = to_regclass(:name)"""),
        {"name": name},
    ).first()
    if row is None or row.relkind not in ("r", "p"):
        raise InvalidParams(
            f"table {name!r} does not exist; check the name (e.g. --table public.items)"
        )
    columns: dict[str, str] = dict(conn.execute(
        text("""
            SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
            WHERE attrelid = :oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum"""),
        {"oid": row.oid},
    ).all())
    display = f"{row.nspname}.{row.relname}"
    key = _key_of(conn, row.oid, display)
    if not key.arithmetic and not any_key:
        raise InvalidParams(
            f"table {display} is keyed by {key.described()}; this job type needs a "
            "single-column integer key (smallint, integer or bigint)")
    return TableInfo(f"{quote(row.nspname)}.{quote(row.relname)}", display, key.columns[0],
                     columns, key)


# Key column types whose order jsonb keeps (framework.keys): their stored
# values compare as the columns do. Types with a modifier match by prefix.
KEY_TYPES = ("smallint", "integer", "bigint", "numeric", "text", "character varying",
             "uuid", "date", "timestamp without time zone", "timestamp with time zone",
             "timestamp(", "boolean")


def _key_of(conn: Connection, oid: int, display: str) -> KeySpec:
    """The table's primary key, or else its first unique index on NOT NULL
    plain columns (no expression, no predicate), columns in index order."""
    found = conn.execute(
        text("""
            SELECT array_agg(a.attname ORDER BY k.ord) AS columns,
                   array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY k.ord) AS types,
                   bool_and(a.attcollation IN (0, 100)) AS default_collation
            FROM pg_index i
            CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            JOIN pg_class ic ON ic.oid = i.indexrelid
            JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree'
            WHERE i.indrelid = :oid AND i.indisunique AND i.indisvalid AND i.indimmediate
              AND i.indpred IS NULL AND i.indexprs IS NULL
              AND k.ord <= i.indnkeyatts  -- not an INCLUDE column
            GROUP BY i.indexrelid, i.indisprimary
            HAVING bool_and(a.attnotnull)
            ORDER BY i.indisprimary DESC, count(*), i.indexrelid LIMIT 1"""),
        {"oid": oid},
    ).mappings().first()
    if found is None:
        raise InvalidParams(
            f"table {display} has no primary key and no unique index on NOT NULL columns; "
            "reorg needs one to split the table into ranges (e.g. ALTER TABLE ... ADD "
            "PRIMARY KEY)")
    key = KeySpec.of(found["columns"], found["types"])
    unordered = [f"{c} {t}" for c, t in zip(key.columns, key.types, strict=True)
                 if not t.startswith(KEY_TYPES)]
    if unordered:
        raise InvalidParams(
            f"table {display} is keyed by {key.described()}; reorg cannot range over a key "
            f"column of type {unordered[0].split(' ', 1)[1]} (keys may be integers, numeric, "
            "text, varchar, uuid, date, timestamps or booleans)")
    if not found["default_collation"]:
        raise InvalidParams(
            f"table {display} is keyed by {key.described()} with a collation other than the "
            "database's default; reorg orders text keys in the default collation")
    return key


def parse_assignment(value: str) -> tuple[str, str]:
    column, sep, expr = (value or "").partition("=")
    if not sep or not expr.strip():
        raise InvalidParams(f"--set {value!r} is not COLUMN=EXPRESSION, e.g. --set c=md5(b)")
    return check_identifier(column.strip(), "column"), expr.strip()


def parse_column_spec(value: str) -> tuple[str, str]:
    column, sep, type_ = (value or "").partition(":")
    if not sep or not type_.strip():
        raise InvalidParams(f"--add-column {value!r} is not COLUMN:TYPE, e.g. --add-column c:text")
    return check_identifier(column.strip(), "column"), type_.strip()


_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_ ]*(\(\s*\d+(\s*,\s*\d+)?\s*\))?(\[\])?$")


def resolve_type(conn: Connection, type_name: str) -> str:
    """Check a column type as written by the user (typmod included, e.g.
    numeric(10,2)); returns it for use in DDL, or raises a clear error."""
    bad = InvalidParams(
        f"type {type_name!r} is not a PostgreSQL type; e.g. text, bigint, numeric(10,2)"
    )
    if not _TYPE.match(type_name):
        raise bad
    try:
        with conn.begin_nested():
            conn.execute(text(f"SELECT CAST(NULL AS {type_name}) WHERE :one = 1"), {"one": 1})
    except Exception:
        raise bad from None
    return type_name


def target_column(conn: Connection, table: TableInfo, column: str,
                  add_column: str | None) -> str:
    """The type of the column ``--set`` writes: the one ``--add-column COL:TYPE``
    adds (which must name the same, not yet existing, column), else the
    existing column's. Never the key."""
    if column == table.key:
        raise InvalidParams(f"column {column} is the primary key; reorg never rewrites keys")
    if column in table.key_spec.columns:
        raise InvalidParams(f"column {column} is part of the key {table.key_spec.described()}; "
                            "reorg never rewrites keys")
    if add_column:
        added, type_ = parse_column_spec(add_column)
        if added != column:
            raise InvalidParams(
                f"--add-column names {added} but --set writes {column}; use the same column")
        if column in table.columns:
            raise InvalidParams(
                f"column {column} already exists in {table.display}; drop --add-column "
                "to overwrite it (its old values are kept for rollback)")
        return resolve_type(conn, type_)
    if column not in table.columns:
        raise InvalidParams(
            f"column {column} does not exist in {table.display}; pass "
            f"--add-column {column}:TYPE to create it")
    return table.columns[column]


def explain_or_fail(conn: Connection, statement: str, params: dict[str, object],
                    fails: str, fix: str = "fix it") -> None:
    """EXPLAIN a statement built from user input: PostgreSQL parses, type-checks
    and plans it without running it. Bind parameters keep it on the extended
    protocol, which refuses a second statement smuggled in after a semicolon.
    An error becomes ``InvalidParams("<fails>: <reason>; <fix>")``."""
    try:
        with conn.begin_nested():
            conn.execute(text(f"EXPLAIN {statement}"), params)
    except Exception as exc:
        raise InvalidParams(f"{fails}: {one_line(exc)}; {fix}") from None


def explain_select_or_fail(conn: Connection, select: str, option: str, display: str,
                           fix: str = "fix it") -> None:
    """``explain_or_fail`` for a query with no parameters of its own."""
    explain_or_fail(conn, f"SELECT * FROM ({select}) q WHERE :one = 1", {"one": 1},
                    f"{option} does not work on {display}", fix)


def check_where(conn: Connection, table: TableInfo, where: str) -> None:
    """A ``--where`` predicate (already ``one_expression``) on ``table``."""
    explain_select_or_fail(conn, f"SELECT 1 FROM {table.qualified} WHERE {embed(where)}",
                           "--where", table.display, FIX_WHERE)


def set_ddl_lock_timeout(conn: Connection) -> None:
    """Bound the lock wait of the DDL in ``conn``'s transaction."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))


def relation_exists(conn: Connection, name: str) -> bool:
    return bool(conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": name}).scalar())
