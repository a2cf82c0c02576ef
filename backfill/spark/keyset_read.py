"""Spark's JDBC read of one batch of a key of any type (text, uuid, numeric,
timestamps, several columns; ``framework.keys``).

Spark splits a numeric column itself (``partitionColumn``, ``lowerBound``,
``upperBound``), and a filter on a DataFrame is pushed down only as Spark
understands the value: neither holds for a text key in PostgreSQL's collation,
a uuid, a timestamp or a row of columns. So the batch ``[lo, hi)`` is read
with explicit ``predicates``, PostgreSQL SQL that Spark appends as the
``WHERE`` of one JDBC partition each, every bound a literal of the key's own
types (``literal``): the rows, their order and their partitions are exactly
PostgreSQL's. Partitions are cut at keys of the batch, every
(rows / parts)-th one (``partition_cuts``).

Key values that travel through Spark and back (a backfill's or a copy's
staged rows) go as PostgreSQL's text of each key column (``text_columns``):
COPY parses it back into the key's type exactly, where Spark's types would
round unconstrained numerics or shift timestamps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.spark.jdbc import JdbcTarget, read_query
from framework.keys import END, Key, KeySpec, decode, encode, quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The text of key column i in a read, and its staged name.
TEXT_KEY_PREFIX = "__reorg_key_"


def stage_column(i: int) -> str:
    return f"k{i}"


def literal(key: KeySpec, value: Key) -> str:
    """SQL for ``value`` as the key's typed value, comparable with
    ``key.expr()``: its stored JSON as a quoted literal, cast back."""
    stored = "'" + encode(value).replace("'", "''") + "'"
    return key.from_stored(f"CAST({stored} AS jsonb)")


def range_sql(key: KeySpec, lo: Key | None, hi: Key | None, alias: str | None = None) -> str:
    """``lo <= key < hi`` with literal bounds; None or END: no bound on that side."""
    k = key.expr(alias)
    conds = []
    if lo is not None:
        conds.append(f"{k} >= {literal(key, lo)}")
    if hi is not None and hi is not END:
        conds.append(f"{k} < {literal(key, hi)}")
    return " AND ".join(conds) or "TRUE"


def in_list_sql(key: KeySpec, keys: list[Key], alias: str | None = None) -> str:
    """``key IN (the listed keys)``, the list one jsonb literal."""
    array = "'[" + ",".join(encode(k) for k in keys).replace("'", "''") + "]'"
    values = ", ".join(f"CAST(reorg_e ->> {i} AS {t})" for i, t in enumerate(key.types))
    return (f"{key.expr(alias)} IN (SELECT {values} FROM "
            f"jsonb_array_elements(CAST({array} AS jsonb)) AS reorg_e)")


def text_columns(key: KeySpec) -> str:
    """``, CAST("a" AS text) AS "__reorg_key_0", ...``: to add to a read's select list."""
    return "".join(f", CAST({name} AS text) AS {quote(TEXT_KEY_PREFIX + str(i))}"
                   for i, name in enumerate(key.names()))


def partition_cuts(conn: Connection, table: str, key: KeySpec, lo: Key, hi: Key, rows: int,
                   parts: int) -> list[Key]:
    """The keys that start partitions 2 .. ``parts`` of ``[lo, hi)``: every
    (rows / parts)-th key of ``table`` in the batch, in key order."""
    step = max(rows // parts, 1)
    where = key.in_range(None, bounded=hi is not END)
    found = conn.execute(
        text(f"""
            SELECT k FROM (
                SELECT {key.read()} AS k, row_number() OVER (ORDER BY {key.order_by()}) AS rn
                FROM {table} WHERE {where}) numbered
            WHERE rn > 1 AND (rn - 1) % :step = 0 ORDER BY rn LIMIT :cuts"""),
        {"lo": key.bind(lo), "hi": key.bind(hi), "step": step, "cuts": parts - 1},
    ).scalars()
    return [decode(k) for k in found]


def predicates(key: KeySpec, lo: Key | None, hi: Key | None, cuts: list[Key]) -> list[str]:
    """One predicate per partition: ``[lo, c1), [c1, c2), ..., [cn, hi)``
    (None: no bound on that side)."""
    edges: list[Key | None] = [lo, *cuts, hi]
    return [range_sql(key, a, b) for a, b in zip(edges, edges[1:], strict=False)]


def read_batch(spark: SparkSession, target: JdbcTarget, query: str, key: KeySpec,
               lo: Key | None, hi: Key | None, cuts: list[Key]) -> DataFrame:
    """``query``'s rows (a ``dbtable`` exposing the key's columns by name) in
    ``[lo, hi)``, one JDBC partition per predicate."""
    return spark.read.jdbc(target.url, query, predicates=predicates(key, lo, hi, cuts),
                           properties=target.read_props())


def read_listed_keys(spark: SparkSession, target: JdbcTarget, table: str, key: KeySpec,
                     keys: list[Key], *, where: str | None = None) -> DataFrame:
    """``read_keys`` for a key of any type, with the key columns' text."""
    return spark.read.jdbc(target.url, read_query(table, where, in_list_sql(key, keys),
                                                  columns=text_columns(key)),
                           properties=target.read_props())
