"""Spark's JDBC read of one batch of a key of any type (text, uuid, numeric,
timestamps, several columns; ``framework.keys``).

Spark splits a numeric column itself (``partitionColumn``, ``lowerBound``,
``upperBound``), and a filter on a DataFrame is pushed down only as Spark
understands the value: neither holds for a text key in PostgreSQL's collation,
a uuid, a timestamp or a row of columns. So the batch ``[lo, hi)`` is read
with explicit ``predicates``, PostgreSQL SQL that Spark appends as the
``WHERE`` of one JDBC partition each, every bound a literal of the key's own
types (``KeySpec.between``): the rows, their order and their partitions are
exactly PostgreSQL's. Partitions are cut at keys of the batch, every
(rows / parts)-th one (``partition_cuts``).

Key values that travel through Spark and back (a backfill's staged rows) go
as PostgreSQL's text of each key column (``text_columns``): COPY parses it
back into the key's type exactly, where Spark's types would round
unconstrained numerics or shift timestamps. A single integer key travels as
Spark's own number, exact (``KeySpec.arithmetic``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.spark.jdbc import JdbcTarget, read_query
from framework.keys import END, Key, KeySpec, decode, quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The text of key column i in a read.
TEXT_KEY_PREFIX = "__reorg_key_"


def text_columns(key: KeySpec) -> str:
    """``, CAST("a" AS text) AS "__reorg_key_0", ...``: to add to a read's
    select list. None for a single integer key, which Spark reads, and a
    batch stages, as its own number (``KeySpec.arithmetic``)."""
    if key.arithmetic:
        return ""
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
    return [key.between(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def read_batch(spark: SparkSession, target: JdbcTarget, query: str, key: KeySpec,
               lo: Key | None, hi: Key | None, cuts: list[Key]) -> DataFrame:
    """``query``'s rows (a ``dbtable`` exposing the key's columns by name) in
    ``[lo, hi)``, one JDBC partition per predicate."""
    return spark.read.jdbc(target.url, query, predicates=predicates(key, lo, hi, cuts),
                           properties=target.read_props())


def read_listed_keys(spark: SparkSession, target: JdbcTarget, table: str, key: KeySpec,
                     keys: list[Key], *, where: str | None = None) -> DataFrame:
    """The listed rows (those that changed under a batch), with their
    versions and the key columns' text (``text_columns``)."""
    return spark.read.jdbc(target.url, read_query(table, where, key.among_literal(keys),
                                                  columns=text_columns(key)),
                           properties=target.read_props())
