"""The ``copy`` job's data plane: select expressions on Spark, the staging
table, the fenced upsert into the target, and its rollback bookkeeping.

A batch: Spark reads ``[lo, hi)`` of the source over JDBC, applies the select
expressions, and the rows go to the driver as Arrow, then CSV; in one
transaction they are COPYed into a temporary stage, upserted into the target
and checkpointed (DESIGN 3).

Exact copies of columns: an output that is just a source column (``b`` or
``b AS b2``) whose target column has the same PostgreSQL type is read as
PostgreSQL's own text form of the value and written back through the same
text (COPY), so every type (unconstrained numeric, arrays, bytea, ranges, ...)
copies exactly, without a detour through Spark's types. Every other output is
computed by Spark and cast to the target column's Spark type.

Upsert (idempotent per range): ``INSERT ... ON CONFLICT (key) DO UPDATE``.
Into a target the job created, that is all (rollback drops the table). Into a
target that existed before, every key the job writes is recorded in
``<work_schema>.copy_<job>_keys`` in the same statement, and the update branch
only fires for keys already recorded: a row the job did not write is never
overwritten (``submit`` refuses targets that already hold keys the copy would
write; a row an application inserts during the job stops the job instead).
Rollback deletes exactly the recorded keys. For a key of any type
(``framework.keys``) the conflict, the check and the record are on every key
column, and the keys table has the key's own columns (``k0, k1, ...``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.expressions import embed
from backfill.spark import landing
from backfill.spark.expression_guard import check_spark_expression
from backfill.spark.pipeline import Batch, RangePipeline, key_between, spark_column
from backfill.tables import quote
from framework.keys import KeySpec, decode, shown
from framework.subtask import SubtaskContext

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

TEXT_PREFIX = "__reorg_txt_"


class CopyConflict(RuntimeError):
    """A key the job was about to write exists in the target and is not the
    job's own: someone else wrote it. Not retryable; the job fails and rolls back."""


@dataclass(frozen=True)
class OutputColumn:
    name: str  # target column, unquoted
    expr: str  # the Spark SQL select expression as given
    pg_type: str  # the target column's PostgreSQL type
    source: str | None = None  # copied verbatim from this source column (text round trip)

    def to_param(self) -> dict[str, Any]:
        return {"name": self.name, "expr": self.expr, "pg_type": self.pg_type,
                "source": self.source}

    @staticmethod
    def from_param(value: dict[str, Any]) -> OutputColumn:
        return OutputColumn(value["name"], value["expr"], value["pg_type"], value.get("source"))


@dataclass(frozen=True)
class CopySpec:
    job_id: int
    source: str  # quoted, schema-qualified
    key: str  # quoted key column (same name in source and target)
    key_name: str
    target: str  # quoted, schema-qualified
    columns: tuple[OutputColumn, ...]
    where: str | None
    created: bool  # the job created the target (rollback drops it)
    work_schema: str
    target_seconds: float = 1.0
    # Every key column with its type (same names in source and target).
    source_key: KeySpec = field(kw_only=True)

    @property
    def copied_key(self) -> KeySpec:
        """The key as the table of copied keys (``keys``) holds it
        (``KeySpec.work_key``)."""
        return self.source_key.work_key()

    # --- Spark -----------------------------------------------------------------

    def base_query(self, limit: int | None = None) -> str:
        """The source rows as Spark's JDBC source reads them, plus the text form
        of each verbatim column (pruned away unless a batch selects it)."""
        extra = "".join(f", CAST({quote(c.source)} AS text) AS {quote(TEXT_PREFIX + str(i))}"
                        for i, c in enumerate(self.columns) if c.source)
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        where = embed(self.where or "TRUE")
        return (f"(SELECT *{extra} FROM {self.source} WHERE {where}{tail}) "
                "reorg_src")

    def output(self, df: DataFrame, target_types: dict[str, DataType] | None) -> DataFrame:
        """The batch's rows as the target's columns, in order. ``target_types``:
        the target columns' Spark types to cast computed outputs to (None: keep
        Spark's own types, the target was created from them)."""
        for c in self.columns:
            if not c.source:  # again on the worker: a job row need not come from submit
                check_spark_expression(df.sparkSession, c.expr, "--select")
        exprs = [f"`{TEXT_PREFIX}{i}` AS `{c.name}`" if c.source else c.expr
                 for i, c in enumerate(self.columns)]
        out = df.selectExpr(*exprs)
        if not target_types:
            return out
        return out.select(*[
            spark_column(c.name) if c.source or c.name not in target_types
            else spark_column(c.name).cast(target_types[c.name]).alias(c.name)
            for c in self.columns])

    # --- SQL -------------------------------------------------------------------

    @property
    def stage(self) -> str:
        defs = ",".join(f"{c.name}:{c.pg_type}" for c in self.columns)
        return quote("reorg_copy_stage_" + hashlib.md5(defs.encode()).hexdigest()[:12])

    @property
    def keys(self) -> str:
        return f"{quote(self.work_schema)}.{quote(f'copy_{self.job_id}_keys')}"

    def column_list(self) -> str:
        return ", ".join(quote(c.name) for c in self.columns)

    def create_stage(self) -> str:
        cols = ", ".join(f"{quote(c.name)} {c.pg_type}" for c in self.columns)
        return f"CREATE TEMP TABLE IF NOT EXISTS {self.stage} ({cols}) ON COMMIT DELETE ROWS"

    def upsert(self) -> str:
        """Stage -> target, the conflict, the check and the record on every
        key column. Returns the number of rows written in a row."""
        cols, key, copied = self.column_list(), self.source_key, self.copied_key
        names = set(key.columns)
        others = [quote(c.name) for c in self.columns if c.name not in names] or key.names()
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in others)
        insert = (f"INSERT INTO {self.target} AS t ({cols}) SELECT {cols} FROM {self.stage} "
                  f"ON CONFLICT ({key.order_by()}) DO UPDATE SET {sets}")
        if self.created:
            return f"WITH up AS ({insert} RETURNING 1) SELECT count(*) FROM up"
        # Only rows this job wrote before may be updated (a retried range);
        # every written key is recorded for rollback in the same statement.
        returned = ", ".join(f"{name} AS {c}" for name, c in
                             zip(key.names("t"), copied.columns, strict=True))
        return (f"WITH up AS ({insert} WHERE EXISTS (SELECT 1 FROM {self.keys} w "
                f"WHERE {copied.expr('w')} = {key.expr('t')}) RETURNING {returned}), "
                f"rec AS (INSERT INTO {self.keys} ({copied.order_by()}) "
                f"SELECT {copied.order_by()} FROM up ON CONFLICT DO NOTHING) "
                "SELECT count(*) FROM up")

    def foreign_key(self) -> str:
        """A staged key the upsert skipped: it is in the target but not the
        job's (as its stored form, jsonb)."""
        key, copied = self.source_key, self.copied_key
        return (f"SELECT {key.as_stored('s')} FROM {self.stage} s WHERE NOT EXISTS "
                f"(SELECT 1 FROM {self.keys} w WHERE {copied.expr('w')} = {key.expr('s')}) "
                f"ORDER BY {key.order_by('s')} LIMIT 1")

    def marker(self) -> str:
        return f"reorg copy job {self.job_id}: created by the job, dropped if it rolls back"

    def create_target(self) -> list[str]:
        cols = ", ".join(f"{quote(c.name)} {c.pg_type}" for c in self.columns)
        return [f"CREATE TABLE {self.target} ({cols}, PRIMARY KEY ({self.source_key.order_by()}))",
                f"COMMENT ON TABLE {self.target} IS '{self.marker()}'"]

    def create_keys(self) -> str:
        copied = self.copied_key
        cols = ", ".join(f"{c} {t} NOT NULL" for c, t in zip(copied.columns, copied.types,
                                                               strict=True))
        return (f"CREATE TABLE IF NOT EXISTS {self.keys} ({cols}, "
                f"PRIMARY KEY ({copied.order_by()}))")

    def drop_keys(self) -> str:
        return f"DROP TABLE IF EXISTS {self.keys}"

    def delete_copied_range(self, bounded: bool = True) -> str:
        """Delete the rows the job copied with keys in ``[:lo, :hi)``: one
        batch of a revert subtask (``bounded`` False: no upper bound)."""
        key, copied = self.source_key, self.copied_key
        return (f"DELETE FROM {self.target} t USING {self.keys} w "
                f"WHERE {key.expr('t')} = {copied.expr('w')} "
                f"AND {copied.in_range('w', bounded=bounded)} "
                f"AND {key.in_range('t', bounded=bounded)}")


@dataclass(frozen=True)
class Staged:
    data: bytes  # CSV
    rows: int


class CopyPipeline(RangePipeline):
    """One ``copy`` subtask."""

    def __init__(self, ctx: SubtaskContext, engine: Engine, spec: CopySpec) -> None:
        super().__init__(ctx, engine, table=spec.source, key=spec.key, key_name=spec.key_name,
                         target_seconds=spec.target_seconds)
        self.spec = spec
        self._base: DataFrame | None = None
        self._types: dict[str, DataType] | None = None

    def _target_types(self) -> dict[str, DataType] | None:
        if self.spec.created:
            return None
        if self._types is None:
            from backfill.spark.jdbc import schema_probe

            computed = [c.name for c in self.spec.columns if not c.source]
            if not computed:
                self._types = {}
            else:
                probe = schema_probe(self.spark, self.jdbc, "SELECT " + ", ".join(
                    quote(n) for n in computed) + f" FROM {self.spec.target}")
                self._types = {f.name: f.dataType for f in probe.schema.fields}
        return self._types

    def compute(self, lo: Any, hi: Any, scanned: int) -> Staged:
        if not self.keys.arithmetic:  # keyset predicates; Spark cannot filter the key
            df = self.keyset_frame(self.spec.base_query(), lo, hi, scanned)
            table = self.spec.output(df, self._target_types()).toArrow()
            return Staged(landing.to_csv(table), table.num_rows)
        if self._base is None:
            self._base = self.spark.read.jdbc(self.jdbc.url, self.spec.base_query(),
                                              properties=self.jdbc.read_props())
        df = key_between(self._base, self.key_name, lo, hi, self.partitions(scanned))
        table = self.spec.output(df, self._target_types()).toArrow()
        return Staged(landing.to_csv(table), table.num_rows)

    def begin(self, conn: Connection) -> None:
        super().begin(conn)
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")

    def apply(self, conn: Connection, raw: Any, batch: Batch) -> int:
        staged: Staged = batch.payload
        if not staged.rows:
            return 0
        spec = self.spec
        conn.exec_driver_sql(spec.create_stage())
        copy_rows(raw, spec, staged.data)
        written = conn.execute(text(spec.upsert())).scalar_one()
        if written != staged.rows:
            found = conn.execute(text(spec.foreign_key())).scalar()
            raise CopyConflict(
                f"key {shown(decode(found))} already exists in {spec.target} and was not written by this job "
                "(another writer inserted it during the copy); the copy stops rather than "
                "overwrite it")
        return int(written)


def copy_rows(raw: Any, spec: CopySpec, data: bytes) -> None:
    """COPY CSV ``data`` into the spec's stage on psycopg connection ``raw``."""
    with raw.cursor() as cur, cur.copy(
            f"COPY {spec.stage} ({spec.column_list()}) FROM STDIN (FORMAT csv)") as copy:
        copy.write(data)


def pg_type_of(dt: DataType) -> str | None:
    """The PostgreSQL column type for a Spark result type; None if copy cannot
    create a column for it (complex and binary types)."""
    from pyspark.sql import types as T

    if isinstance(dt, T.DecimalType):
        return f"numeric({dt.precision},{dt.scale})"
    simple: list[tuple[type, str]] = [
        (T.BooleanType, "boolean"), (T.ByteType, "smallint"), (T.ShortType, "smallint"),
        (T.IntegerType, "integer"), (T.LongType, "bigint"), (T.FloatType, "real"),
        (T.DoubleType, "double precision"), (T.StringType, "text"), (T.VarcharType, "text"),
        (T.CharType, "text"), (T.DateType, "date"),
        (T.TimestampNTZType, "timestamp without time zone"),
        (T.TimestampType, "timestamp with time zone"),
    ]
    for cls, name in simple:
        if isinstance(dt, cls):
            return name
    return None


def run_copy(ctx: SubtaskContext, engine: Engine, spec: CopySpec) -> CopyPipeline:
    pipeline = CopyPipeline(ctx, engine, spec)
    pipeline.run()
    return pipeline
