"""The ``backfill`` job's batches on the shared batch loop (``backfill.spark.pipeline``).

    read thread:  bounds ─► Spark JDBC read (+xmin) ─► transform ─► Arrow ─► CSV
    main thread:                      COPY to temp stage ─► merge where xmin unchanged
                                      ─► recompute changed rows ─► checkpoint ─► commit

The read of batch k+1 runs while batch k merges, so Spark's time hides behind
the database's. Each batch's merge and its fenced checkpoint commit in one
transaction (DESIGN 3): a zombie's checkpoint raises LeaseLost and the whole
batch rolls back; a retried subtask resumes at the committed ``curr_key``, so
no batch applies twice. Rows written by someone else after Spark read them are
re-read and recomputed, optimistically first, then under ``FOR UPDATE``
(DESIGN 9).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.spark import landing
from backfill.spark.jdbc import jdbc_target, read_base, read_query
from backfill.spark.keyset_read import read_listed_keys, text_columns
from backfill.spark.pipeline import Batch, BatchStat, RangePipeline, key_between
from backfill.spark.session import on_session_stop
from backfill.spark.transform import Transform
from backfill.spark_backfill.merge import MergeSql
from framework import faults
from framework.errors import RetryableError
from framework.keys import END, KeySpec, decode
from framework.privileges import run_as
from framework.subtask import SubtaskContext

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


OPTIMISTIC_ROUNDS = 2  # re-read changed rows this often without locks, then lock them
MAX_ROUNDS = OPTIMISTIC_ROUNDS + 2  # after the locked round nothing should be left


@dataclass
class _JobCache:
    """What one process learns about a job and reuses for its next subtask:
    the JDBC DataFrame (its schema query costs a connection), the target's
    Spark type, and the batch size the sizer settled on."""

    batch_rows: dict[int, int] = field(default_factory=dict)  # job's batch_rows -> learned size
    spark: Any = None  # the session ``base`` and the registered UDF belong to
    base: Any = None
    target_type: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, spark: Any, name: str, make: Callable[[], Any]) -> Any:
        """``base`` or ``target_type`` for ``spark``, made on first use. A worker
        whose JVM died runs on a new session, where the old DataFrame is
        unusable and the UDF not registered: both are made again there."""
        with self.lock:
            if self.spark is not spark:
                self.spark, self.base, self.target_type = spark, None, None
            if getattr(self, name) is None:
                setattr(self, name, make())
            return getattr(self, name)


_jobs: dict[tuple[int, str, str | None], _JobCache] = {}
_jobs_lock = threading.Lock()
_MAX_JOBS = 32
on_session_stop(_jobs.clear)


def _job_cache(job_id: int, url: str, role: str | None) -> _JobCache:
    with _jobs_lock:
        key = (job_id, url, role)  # the role: a DataFrame reads as the role it was made for
        if key not in _jobs:
            if len(_jobs) >= _MAX_JOBS:
                _jobs.pop(next(iter(_jobs)))
            _jobs[key] = _JobCache()
        return _jobs[key]


@dataclass(frozen=True)
class BackfillSpec:
    """What one backfill job does, from its normalised params."""

    job_id: int
    table: str  # quoted, schema-qualified
    key: str  # quoted key column
    key_name: str  # unquoted key column
    transform: Transform
    column_type: str  # PostgreSQL type of the target column
    where: str | None
    merge: MergeSql
    target_seconds: float = 1.0

    @property
    def overwrite(self) -> bool:
        return self.merge.overwrite

    @property
    def keys(self) -> KeySpec:
        """Every key column with its type (``merge`` carries them)."""
        return self.merge.keys


@dataclass(frozen=True)
class Staged:
    """Computed rows ready for COPY."""

    data: bytes  # CSV
    rows: int


def _staged(table: pa.Table) -> Staged:
    return Staged(landing.to_csv(table), table.num_rows)


@dataclass(frozen=True)
class Merged:
    """What a batch's merge did."""

    rows: int  # rows computed from the batch's read (``where`` may skip some scanned ones)
    rounds: int  # recompute rounds
    recomputed: int  # rows recomputed in them


class BatchStats(BatchStat):
    """A backfill batch's timings (``result`` is its ``Merged``), kept for the
    benchmark and tests."""

    result: Merged

    @property
    def rows(self) -> int:
        return self.result.rows

    @property
    def merge_seconds(self) -> float:
        return self.apply_seconds

    @property
    def rounds(self) -> int:
        return self.result.rounds

    @property
    def recomputed(self) -> int:
        return self.result.recomputed


class SubtaskRunner(RangePipeline):
    """One ``backfill`` subtask."""

    # One Spark job per 10 batches: a job's fixed cost (scheduling, plan, a
    # JDBC connection and query) was most of a 10,000-row batch's read, and
    # 10 a read took 40 % less JVM CPU than 5 (docs/benchmarks.md, "Where
    # a backfill batch's time goes"). Writes a kill redoes stay one batch.
    batches_per_read = 10

    def __init__(self, ctx: SubtaskContext, engine: Engine, spec: BackfillSpec) -> None:
        self.spec = spec
        self.cache = _job_cache(spec.job_id, jdbc_target(engine.url).url, run_as(ctx.job))
        super().__init__(ctx, engine, table=spec.table, key=spec.key, key_name=spec.key_name,
                         target_seconds=spec.target_seconds, learned=self.cache.batch_rows)

    # --- read: Spark, Arrow (read thread) ---------------------------------------

    def compute(self, lo: Any, hi: Any, scanned: int) -> pa.Table:
        if not self.keys.arithmetic:  # keyset predicates; Spark cannot filter the key
            query = read_query(self.spec.table, self.spec.where,
                               columns=text_columns(self.keys))
            return self._computed(self.keyset_frame(query, lo, hi, scanned))
        base = self.cache.get(self.spark, "base", lambda: read_base(
            self.spark, self.jdbc, self.spec.table, self.spec.where))
        return self._computed(key_between(base, self.key_name, lo, hi,
                                          self.partitions(scanned)))

    def split(self, payload: pa.Table, lo: Any, edges: list[tuple[Any, int]]) -> list[Staged]:
        """The read's rows as staging CSV, one per batch of it: a batch stages
        exactly the rows of its key range, which its merge bounds."""
        if len(edges) == 1:
            return [_staged(payload)]
        import pyarrow.compute as pc

        keys, staged, start = payload.column("k"), [], lo
        for end, _ in edges:
            staged.append(_staged(payload.filter(
                pc.and_(pc.greater_equal(keys, start), pc.less(keys, end)))))
            start = end
        return staged

    def _computed(self, df: DataFrame) -> pa.Table:
        """Transform ``df`` (rows read with versions) into the staged columns, on
        the driver. Old values are not staged: the merge takes them inside
        PostgreSQL (``merge``)."""
        def register() -> Any:
            target_type = df.schema[self.spec.transform.column].dataType
            self.spec.transform.register(self.spark, target_type)
            return target_type

        target_type = self.cache.get(self.spark, "target_type", register)
        return self.spec.transform.output(df, self.spec.keys, target_type).toArrow()

    def _stage(self, df: DataFrame) -> Staged:
        return _staged(self._computed(df))

    # --- merge (main thread, in the batch transaction) ---------------------------

    def begin(self, conn: Connection) -> None:
        super().begin(conn)
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")

    def apply(self, conn: Connection, raw: Any, batch: Batch) -> Merged:
        m, keys = self.spec.merge, self.spec.keys
        bounds = {"lo": keys.bind(batch.lo), "hi": keys.bind(batch.hi)}
        merge = m.merge(bounded=batch.hi is not END)  # END: the last batch of a key of any type
        rounds = recomputed = 0
        conn.exec_driver_sql(landing.create_staging_sql(self.spec.column_type, keys))
        staged: Staged = batch.payload
        while staged.rows:
            landing.copy_in(raw, self.spec.column_type, m.stage_columns, staged.data, keys)
            faults.hit("spark.after_stage")
            # Without nested loops the overwrite's second read of the range
            # (``o``, for the old values) is a merge join of two index range
            # scans instead of an index probe per row: the statement takes a
            # third less time, the same as without images. Only for this
            # statement: ``changed`` has no range bound to scan by.
            conn.exec_driver_sql("SET LOCAL enable_nestloop = off")
            result = conn.execute(text(merge), bounds)
            applied = result.scalar_one() if m.overwrite else result.rowcount
            conn.exec_driver_sql("SET LOCAL enable_nestloop = on")
            if applied == staged.rows:
                break
            rounds += 1
            staged = self._recompute(conn, rounds)
            recomputed += staged.rows
        if m.overwrite:
            conn.execute(text(m.record_batch()), {**bounds, "subtask": self.ctx.subtask_id})
        return Merged(batch.payload.rows, rounds, recomputed)

    def _recompute(self, conn: Connection, round_no: int) -> Staged:
        """Rows that changed since Spark read them: read their latest versions and
        compute again. From round OPTIMISTIC_ROUNDS + 1 on, lock them first, so
        the version Spark reads is the one the merge finds."""
        m = self.spec.merge
        keys = [decode(k) for k in conn.execute(text(m.changed())).scalars()]
        conn.exec_driver_sql(m.clear_stage())
        if not keys:
            return Staged(b"", 0)
        if round_no > MAX_ROUNDS:
            raise RetryableError(f"{len(keys)} rows kept changing under batch; retrying the subtask")
        if round_no > OPTIMISTIC_ROUNDS:
            conn.execute(text(m.lock()), {"keys": self.spec.keys.bind_all(keys)})
        self.ctx.raise_if_stopped()
        self.tag_spark_jobs()  # on the main thread: a hard stop cancels this read too
        df = read_listed_keys(self.spark, self.jdbc, self.spec.table, self.spec.keys, keys,
                              where=self.spec.where)
        return self._stage(df)

    def stat(self, batch: Batch, result: Merged, seconds: float) -> BatchStats:
        return BatchStats(batch.lo, batch.hi, batch.scanned, batch.seconds, seconds, result)

    def figures(self, result: Merged) -> dict[str, Any]:
        """``rows`` are the rows computed (``where`` may skip scanned ones), plus
        the merge's recompute rounds."""
        return {"rows": result.rows, "rounds": result.rounds, "recomputed": result.recomputed}


def run_subtask(ctx: SubtaskContext, engine: Engine, spec: BackfillSpec) -> SubtaskRunner:
    runner = SubtaskRunner(ctx, engine, spec)
    runner.run()
    return runner
