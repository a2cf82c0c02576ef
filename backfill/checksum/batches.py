"""The ``checksum`` job's data plane: compare two tables range by range.

What is compared: for each compared column, PostgreSQL's text form of the
value (cast first to the two columns' common type when their types differ,
e.g. integer vs bigint), so equal means "prints the same" and no value takes
a lossy detour through Spark's types (unconstrained numeric, timestamps,
arrays, ... compare exactly).

A batch, ``compare_in = "postgres"`` (the default): one statement FULL JOINs
the batch's key range of both tables and returns the keys that one side lacks
or whose rows differ (a null-safe compare of the rows' text). One statement
is one snapshot of both tables, so a concurrent write cannot make equal rows
look different. It runs on the read thread, so batch k+1 is compared while
batch k's findings are committed.

``compare_in = "spark"``: Spark reads ``[lo, hi)`` of both tables over JDBC,
(key, the columns' text) each, hashes each row with ``xxhash64`` over
(value, is-null) pairs, full-outer-joins the two sides on the key and
collects the keys that differ. The two reads are two snapshots, so in the
batch's transaction the found keys are compared again with the statement
above (one snapshot) and only what it confirms is recorded.

Why PostgreSQL by default (docs/benchmarks.md, "Measured apart"): Spark
is 5-7x slower: it needs every row PostgreSQL reads anyway, rendered
and sent over JDBC, and then pays per batch for two JDBC scans and a shuffle
join, where PostgreSQL compares in place. That is "much slower", so the
default compares in PostgreSQL. Spark stays selectable (job parameter
``compare_in``) and tested: it moves the hashing and the join off the database
server onto a Spark cluster, which may pay off where the server's CPU is the
scarce resource (not measured here: one machine runs everything).

Beyond the split: ranges tile ``[min, max + 1)`` of the first table's keys.
The subtask whose range starts at that table's smallest key also compares
every key below it in either table, and the one whose range ends past its
largest key every key above, so rows of the second table outside the first
table's key span are found too. (Rows added to the first table beyond its
largest key after the job split it are not compared.) A key of any type
(``framework.keys``) tiles ``[min, END)``: the last range has no upper bound
anyway, and its findings keep each key as its stored JSON array.

Findings go into the subtask's meta with its checkpoint (one transaction,
exactly once): counts by kind, the batch ranges that mismatched, and up to
``MAX_KEYS`` keys per subtask (all are counted).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.checksum.report import KINDS, META_KEY
from backfill.spark import keyset_read
from backfill.spark.pipeline import Batch, RangePipeline, key_between
from backfill.spark.sizing import READ_ONLY_RANGE_ABOVE
from backfill.tables import quote
from framework.keys import END, Key, KeySpec, decode, stored_json
from framework.subtask import SubtaskContext

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("reorg.spark.checksum")

MAX_KEYS = 1000  # keys recorded per subtask (range); every mismatch is counted
MAX_RANGES = 1000  # mismatching batch ranges recorded per subtask


@dataclass(frozen=True)
class CompareColumn:
    name: str  # unquoted, present in both tables
    common: str | None = None  # cast both sides to this type first (their types differ)

    def as_text(self, alias: str | None = None) -> str:
        col = f"{alias}.{quote(self.name)}" if alias else quote(self.name)
        if self.common:
            col = f"CAST({col} AS {self.common})"
        return f"CAST({col} AS text)"


@dataclass(frozen=True)
class ChecksumSpec:
    source: str  # quoted, schema-qualified: the table whose keys are split
    target: str  # quoted, schema-qualified
    key: str  # quoted first key column, in both tables
    key_name: str
    columns: tuple[CompareColumn, ...]
    keys: KeySpec  # every key column with its type, in both tables
    compare_in: str = "postgres"  # or "spark"
    target_seconds: float = 1.0

    def side_query(self, table: str) -> str:
        """One side as Spark reads it on the integer fast path: the key as
        ``k`` (a number Spark filters on) and each column's text as c0, c1, ..."""
        cols = "".join(f", {c.as_text()} AS c{i}" for i, c in enumerate(self.columns))
        return f"(SELECT {self.key} AS k{cols} FROM {table}) reorg_cmp"

    def keyset_side_query(self, table: str) -> str:
        """One side as Spark reads it in keyset predicates (``keyset_read``):
        the key's columns under their own names (for the predicates), the text
        of its stored form as ``__reorg_k`` and the columns' text as
        ``__reorg_c0``, ... (``spark_side`` names them)."""
        key = self.keys
        cols = "".join(f", {c.as_text()} AS {quote(f'__reorg_c{i}')}"
                       for i, c in enumerate(self.columns))
        return (f"(SELECT {key.order_by()}, {key.read()} AS "
                f"{quote('__reorg_k')}{cols} FROM {table}) reorg_cmp")

    def compare_sql(self, cond: str) -> str:
        """The mismatching keys among rows matching ``cond`` (over the key
        columns), in one statement: one snapshot of both tables; joined on
        every key column, each mismatching key as its stored form (jsonb)."""
        key = self.keys
        n = len(key.columns)
        # Composite values compare NULL fields as equal: a null-safe row compare.
        row_a = ", ".join(c.as_text("a") for c in self.columns) or "0"
        row_b = ", ".join(c.as_text("b") for c in self.columns) or "0"
        read_a = ", ".join(f"{name} AS k{i}" for i, name in enumerate(key.names("a")))
        read_b = ", ".join(f"{name} AS k{i}" for i, name in enumerate(key.names("b")))
        joined = " AND ".join(f"x.k{i} = y.k{i}" for i in range(n))
        found = [f"coalesce(x.k{i}, y.k{i})" for i in range(n)]
        return f"""
            SELECT {key.stored_of(found)} AS k,
                   CASE WHEN y.k0 IS NULL THEN 'missing_in_target'
                        WHEN x.k0 IS NULL THEN 'missing_in_source' ELSE 'different' END AS kind
            FROM (SELECT {read_a}, ROW({row_a}) AS r FROM {self.source} a
                  WHERE {cond.format(t='a')}) x
            FULL JOIN (SELECT {read_b}, ROW({row_b}) AS r FROM {self.target} b
                       WHERE {cond.format(t='b')}) y ON {joined}
            WHERE x.k0 IS NULL OR y.k0 IS NULL OR x.r IS DISTINCT FROM y.r
            ORDER BY {', '.join(found)}"""

    def range_cond(self, lo: Key | None, hi: Key | None) -> tuple[str, dict[str, Any]]:
        """``lo <= key < hi`` over ``{t}``; None or END: no bound on that side."""
        key = self.keys
        conds, bound = ["TRUE"], {}
        if lo is not None:
            conds.append(f"{key.expr('{t}')} >= {key.param('lo')}")
            bound["lo"] = key.bind(lo)
        if hi is not None and hi is not END:
            conds.append(f"{key.expr('{t}')} < {key.param('hi')}")
            bound["hi"] = key.bind(hi)
        return " AND ".join(conds), bound

    def keys_cond(self) -> str:
        """The listed keys (bound by ``bind_keys``)."""
        return self.keys.among("keys", "{t}")

    def bind_keys(self, keys: list[Any]) -> Any:
        """``keys`` as findings keep them (stored JSON values), for ``keys_cond``."""
        return self.keys.bind_all([decode(k) for k in keys])


def spark_diff(a: DataFrame, b: DataFrame, ncols: int) -> DataFrame:
    """Keys whose rows differ (per-row hash) or that one side lacks, with the kind."""
    from pyspark.sql import functions as F

    def hashed(df: DataFrame) -> DataFrame:
        parts = []
        for i in range(ncols):
            # The is-null flag keeps (NULL, 'x') and ('x', NULL) apart:
            # xxhash64 skips NULL inputs.
            parts += [F.col(f"c{i}"), F.col(f"c{i}").isNull()]
        h = F.xxhash64(*parts) if parts else F.lit(0)
        return df.select(F.col("k"), h.alias("h"))

    x, y = hashed(a).alias("x"), hashed(b).alias("y")
    xk, yk = F.col("x.k"), F.col("y.k")
    joined = x.join(y, xk == yk, "full_outer").where(
        xk.isNull() | yk.isNull() | (F.col("x.h") != F.col("y.h")))
    kind = (F.when(yk.isNull(), F.lit("missing_in_target"))
            .when(xk.isNull(), F.lit("missing_in_source")).otherwise(F.lit("different")))
    return joined.select(F.coalesce(xk, yk).alias("k"), kind.alias("kind"))


@dataclass
class Findings:
    """One subtask's findings so far (its meta), updated batch by batch."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    ranges: list[list[Any]] = field(default_factory=list)  # [lo|None, hi|None, mismatches]
    keys: list[list[Any]] = field(default_factory=list)  # [key, kind]
    ranges_dropped: int = 0

    @property
    def mismatches(self) -> int:
        return sum(self.counts.values())

    @staticmethod
    def from_meta(meta: dict[str, Any] | None) -> Findings:
        m = (meta or {}).get(META_KEY) or {}
        return Findings({k: int(m.get(k, 0)) for k in KINDS}, [list(r) for r in m.get("ranges", [])],
                        [list(k) for k in m.get("keys", [])], int(m.get("ranges_dropped", 0)))

    def copy(self) -> Findings:
        return Findings(dict(self.counts), [list(r) for r in self.ranges],
                        [list(k) for k in self.keys], self.ranges_dropped)

    def to_meta(self) -> dict[str, Any]:
        return {META_KEY: {"mismatches": self.mismatches, **self.counts, "ranges": self.ranges,
                           "keys": self.keys, "ranges_dropped": self.ranges_dropped}}

    def add(self, lo: Any, hi: Any, found: list[tuple[Any, str]]) -> None:
        if not found:
            return
        for key, kind in found:
            self.counts[kind] += 1
            if len(self.keys) < MAX_KEYS:
                self.keys.append([key, kind])
        last = self.ranges[-1] if self.ranges else None
        if last is not None and last[1] is not None and last[1] == lo:
            last[1] = hi  # adjacent batches: one range
            last[2] += len(found)
        elif len(self.ranges) < MAX_RANGES:
            self.ranges.append([lo, hi, len(found)])
        else:
            self.ranges_dropped += 1


@dataclass
class Compared:
    # Keys as findings keep them: ints, or a key of any type's stored form (lists).
    lo: Any  # None: unbounded (the first subtask's head)
    hi: Any  # None: unbounded (the last subtask's tail)
    found: list[tuple[Any, str]]  # candidates (spark) or final (postgres)


class ChecksumPipeline(RangePipeline):
    """One ``checksum`` subtask."""

    range_above = READ_ONLY_RANGE_ABOVE  # writes nothing a crash would redo

    def __init__(self, ctx: SubtaskContext, engine: Engine, spec: ChecksumSpec) -> None:
        super().__init__(ctx, engine, table=spec.source, key=spec.key, key_name=spec.key_name,
                         target_seconds=spec.target_seconds)
        self.spec = spec
        self.uses_spark = spec.compare_in == "spark"
        self.findings = Findings.from_meta(ctx.meta)  # as of the last committed batch
        self._pending = self.findings
        self._sides: tuple[DataFrame, DataFrame] | None = None
        # The first batch of the range that starts at the source's smallest key
        # also covers every key below it (in either table).
        self._head = ctx.curr_key == ctx.start_key and not self._any_source(
            f"{self.keys.expr()} < {self.keys.param('k')}", ctx.start_key)

    def _any_source(self, cond: str, key: Key) -> bool:
        with self.engine.connect() as conn:
            return bool(conn.execute(text(
                f"SELECT EXISTS (SELECT 1 FROM {self.spec.source} WHERE {cond})"),
                {"k": self.keys.bind(key)}).scalar())

    def compute(self, lo: Any, hi: Any, scanned: int) -> Compared:
        spec, ctx, key = self.spec, self.ctx, self.keys
        read_lo: Any = None if (self._head and lo == ctx.start_key) else lo
        read_hi: Any = hi
        if hi is END or (hi == ctx.end_key and not self._any_source(
                f"{key.expr()} >= {key.param('k')}", ctx.end_key)):
            read_hi = None  # the last range: also every key above it
        if spec.compare_in == "postgres":
            cond, params = spec.range_cond(read_lo, read_hi)
            with self.engine.begin() as conn, ctx.cancel_on_stop(conn):
                conn.exec_driver_sql("SET LOCAL jit = off")
                rows = conn.execute(text(spec.compare_sql(cond)), params).all()
            return self._compared(read_lo, read_hi, [(r.k, r.kind) for r in rows])
        if not key.arithmetic:  # keyset predicates; Spark cannot filter the key
            return self._keyset_spark_compare(read_lo, read_hi)
        if self._sides is None:
            props = self.jdbc.read_props()
            self._sides = (
                self.spark.read.jdbc(self.jdbc.url, spec.side_query(spec.source), properties=props),
                self.spark.read.jdbc(self.jdbc.url, spec.side_query(spec.target), properties=props))
        a, b = self._sides
        diff = spark_diff(key_between(a, "k", read_lo, read_hi),
                          key_between(b, "k", read_lo, read_hi), len(spec.columns))
        table = diff.toArrow()
        keys = table.column("k").to_pylist()
        kinds = table.column("kind").to_pylist()
        return self._compared(read_lo, read_hi, sorted(zip(keys, kinds, strict=True)))

    @staticmethod
    def _compared(lo: Key | None, hi: Key | None, found: list[tuple[Any, str]]) -> Compared:
        """Findings keep keys in their stored form (JSON: a number, or an array)."""
        return Compared(None if lo is None else stored_json(lo),
                        None if hi is None else stored_json(hi), found)

    def _keyset_spark_compare(self, lo: Key | None, hi: Key | None) -> Compared:
        """``compare_in = "spark"`` for a key of any type: each side read in
        a keyset predicate (``keyset_read``), keyed by its stored form's text."""
        from pyspark.sql import functions as F

        spec = self.spec

        def side(table: str) -> DataFrame:
            df = keyset_read.read_batch(self.spark, self.jdbc, spec.keyset_side_query(table),
                                        self.keys, lo, hi, [])
            return df.select(F.col("__reorg_k").alias("k"), *[
                F.col(f"__reorg_c{i}").alias(f"c{i}") for i in range(len(spec.columns))])

        diff = spark_diff(side(spec.source), side(spec.target), len(spec.columns))
        table = diff.toArrow()
        keys = [json.loads(k) for k in table.column("k").to_pylist()]
        kinds = table.column("kind").to_pylist()
        return self._compared(lo, hi, list(zip(keys, kinds, strict=True)))

    def apply(self, conn: Connection, raw: Any, batch: Batch) -> list[tuple[Any, str]]:
        compared: Compared = batch.payload
        found = compared.found
        if found and self.spec.compare_in != "postgres":
            # Confirm in one snapshot: the two Spark reads were two.
            rows = conn.execute(text(self.spec.compare_sql(self.spec.keys_cond())),
                                {"keys": self.spec.bind_keys([k for k, _ in found])}).all()
            found = [(r.k, r.kind) for r in rows]
        self._pending = self.findings.copy()
        self._pending.add(compared.lo, compared.hi, found)
        return found

    def batch_meta(self, batch: Batch, result: Any) -> dict[str, Any]:
        return self._pending.to_meta()

    def committed(self, batch: Batch, result: Any) -> None:
        self.findings = self._pending


def run_checksum(ctx: SubtaskContext, engine: Engine, spec: ChecksumSpec) -> ChecksumPipeline:
    pipeline = ChecksumPipeline(ctx, engine, spec)
    pipeline.run()
    return pipeline
