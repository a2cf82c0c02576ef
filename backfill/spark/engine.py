"""The batch engine: one subtask, batch by batch from ``curr_key``.

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

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.spark import landing
from backfill.spark.jdbc import JdbcTarget, in_range, jdbc_target, read_base, read_keys
from backfill.spark.merge import MergeSql
from backfill.spark.session import get_spark, on_session_stop
from backfill.spark.sizing import BatchSizer
from backfill.spark.transform import Transform
from framework.jobtype import RetryableError, SubtaskContext

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("reorg.spark.engine")

OPTIMISTIC_ROUNDS = 2  # re-read changed rows this often without locks, then lock them
MAX_ROUNDS = OPTIMISTIC_ROUNDS + 2  # after the locked round nothing should be left
ROWS_PER_PARTITION = 50_000  # below this, another JDBC partition costs more than it saves


class _Active:
    """How many subtasks this process runs on Spark right now."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1


_active = _Active()


@dataclass
class _JobCache:
    """What one process learns about a job and reuses for its next subtask:
    the JDBC DataFrame (its schema query costs a connection), the target's
    Spark type, and the batch size the sizer settled on."""

    base: Any = None
    target_type: Any = None
    batch_rows: dict[int, int] = field(default_factory=dict)  # job's batch_rows -> learned size


_jobs: dict[tuple[int, str], _JobCache] = {}
_jobs_lock = threading.Lock()
_MAX_JOBS = 32
on_session_stop(_jobs.clear)


def _job_cache(job_id: int, url: str) -> _JobCache:
    with _jobs_lock:
        key = (job_id, url)
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


@dataclass(frozen=True)
class Staged:
    """Computed rows ready for COPY."""

    data: bytes  # CSV
    rows: int
    has_old: bool  # some before-image is not NULL (overwrite mode): keep images


@dataclass
class ReadBatch:
    lo: int
    hi: int
    scanned: int  # rows in [lo, hi), for progress
    staged: Staged
    seconds: float


@dataclass
class BatchStats:
    """Per-batch timings, kept for the benchmark and tests."""

    lo: int
    hi: int
    rows: int
    read_seconds: float
    merge_seconds: float
    rounds: int
    recomputed: int


@dataclass
class SubtaskRunner:
    ctx: SubtaskContext
    engine: Engine
    spec: BackfillSpec
    stats: list[BatchStats] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.spark: SparkSession = get_spark()
        self.jdbc: JdbcTarget = jdbc_target(self.engine.url)
        self.group = f"reorg-{self.spec.job_id}-{self.ctx.subtask_id}-{self.ctx.epoch}"
        self.cache = _job_cache(self.spec.job_id, self.jdbc.url)
        batch_rows = self.ctx.job.batch_rows
        self.sizer = BatchSizer(batch_rows, self.spec.target_seconds)
        meta = self.ctx.meta or {}
        # Start from what this job learnt: this subtask's last run (meta), or
        # another subtask in this process; `reorg alter --batch-rows` resets it.
        if meta.get("for_batch_rows") == batch_rows and meta.get("batch_rows"):
            self.sizer.rows = int(meta["batch_rows"])
        elif batch_rows in self.cache.batch_rows:
            self.sizer.rows = self.cache.batch_rows[batch_rows]

    # --- the loop ---------------------------------------------------------

    def run(self) -> None:
        with _active:
            self._run()

    def _run(self) -> None:
        ctx = self.ctx
        sc = self.spark.sparkContext
        # A hard stop (lease lost, cancel) kills this subtask's Spark jobs at once.
        unregister = ctx.on_stop(lambda: sc.cancelJobGroup(self.group))
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"read-{ctx.subtask_id}")
        pending: Future[ReadBatch] | None = None
        try:
            if ctx.curr_key < ctx.end_key:
                pending = pool.submit(self._read, ctx.curr_key, self._size())
            last_commit = time.monotonic()
            while pending is not None:
                # A pause stops here, between batches, without waiting for the
                # prefetched read (``finally`` cancels it).
                ctx.raise_if_stopped()
                try:
                    batch = pending.result()
                except Exception:
                    ctx.raise_if_stopped()  # a cancelled Spark job: report the stop, not the error
                    raise
                pending = None
                ctx.raise_if_stopped()
                if batch.hi < ctx.end_key:
                    pending = pool.submit(self._read, batch.hi, self._size())
                merge_seconds = self._merge(batch)
                self.sizer.observe(batch.scanned, max(batch.seconds, merge_seconds))
                self.cache.batch_rows[self.sizer.batch_rows] = self.sizer.rows
                ctx.throttle(batch.scanned, time.monotonic() - last_commit)
                last_commit = time.monotonic()
        finally:
            if pending is not None and not pending.done():
                sc.cancelJobGroup(self.group)  # leaving early: don't finish a read nobody merges
            pool.shutdown(wait=True)
            unregister()

    def _size(self) -> int:
        job = self.ctx.job  # replaced by the worker when `reorg alter` changes the knobs
        self.sizer.retarget(job.batch_rows)
        per_subtask = (job.max_rows_per_sec / max(job.concurrency, 1)
                       if job.max_rows_per_sec else None)
        return self.sizer.next_rows(per_subtask)

    # --- read: bounds, Spark, Arrow (read thread) -----------------------------

    def _read(self, lo: int, rows: int) -> ReadBatch:
        self.ctx.raise_if_stopped()
        started = time.monotonic()
        hi, scanned = self._bounds(lo, rows)
        if self.cache.base is None:
            self.cache.base = read_base(self.spark, self.jdbc, self.spec.table, self.spec.where)
        staged = self._compute(in_range(self.cache.base, self.spec.key_name, lo, hi,
                                        self._partitions(scanned)))
        return ReadBatch(lo, hi, scanned, staged, time.monotonic() - started)

    def _partitions(self, rows: int) -> int:
        """One JDBC partition per batch is the cheapest in CPU; split only when
        this process runs fewer subtasks than Spark has cores to spare."""
        spare = self.spark.sparkContext.defaultParallelism // max(_active.count, 1)
        return max(1, min(spare, rows // ROWS_PER_PARTITION))

    def _bounds(self, lo: int, rows: int) -> tuple[int, int]:
        """The batch's exclusive upper key: ``rows`` keys in key order, so gappy
        keys still make even batches, deterministic in the table's keys. A
        remainder under half a batch joins this one: a tiny last batch would
        cost a whole batch's fixed Spark and commit overhead."""
        t, k, end = self.spec.table, self.spec.key, self.ctx.end_key

        def nth(param: str) -> str:
            return (f"(SELECT {k} FROM {t} WHERE {k} >= :lo AND {k} < :end "
                    f"ORDER BY {k} OFFSET :{param} LIMIT 1)")

        with self.engine.connect() as conn:
            cut, far = conn.execute(text(f"SELECT {nth('n')}, {nth('n2')}"),
                                    {"lo": lo, "end": end, "n": rows, "n2": rows + rows // 2}).one()
            if cut is not None and far is not None:
                return int(cut), rows
            left = conn.execute(text(f"SELECT count(*) FROM {t} WHERE {k} >= :lo AND {k} < :end"),
                                {"lo": lo, "end": end}).scalar()
            return end, int(left or 0)

    def _compute(self, df: DataFrame) -> Staged:
        """Transform ``df`` (rows read with versions) into staging CSV."""
        self.spark.sparkContext.setJobGroup(self.group, f"reorg subtask {self.ctx.subtask_id}", True)
        if self.cache.target_type is None:
            target_type = df.schema[self.spec.transform.column].dataType
            self.spec.transform.register(self.spark, target_type)
            self.cache.target_type = target_type
        out = self.spec.transform.output(df, self.spec.key_name, self.cache.target_type,
                                         with_old=self.spec.overwrite)
        table = out.toArrow()
        has_old = self.spec.overwrite and table.column("old").null_count < table.num_rows
        if self.spec.overwrite and not has_old:
            # All old values NULL (e.g. filling a new column): restoring NULL needs
            # no per-row image, only the batch's range and xid.
            table = table.drop_columns(["old"])
        return Staged(landing.to_csv(table), table.num_rows, has_old)

    # --- merge (main thread) ------------------------------------------------

    def _merge(self, batch: ReadBatch) -> float:
        started = time.monotonic()
        m, ctx = self.spec.merge, self.ctx
        bounds = {"lo": batch.lo, "hi": batch.hi}
        rounds = recomputed = 0
        with self.engine.begin() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            # A hard stop cancels the running statement: the batch rolls back now,
            # not when the statement would have finished.
            unregister = ctx.on_stop(raw.cancel)
            try:
                # The batch and its checkpoint commit or vanish together, so the
                # commit need not wait for the WAL flush: a crash can only lose
                # whole batches with their checkpoints, and they are redone.
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                conn.exec_driver_sql("SET LOCAL jit = off")
                conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
                conn.exec_driver_sql(landing.create_staging_sql(self.spec.column_type))
                staged = batch.staged
                while staged.rows:
                    landing.copy_in(raw, self.spec.column_type, m.stage_columns(staged.has_old),
                                    staged.data)
                    result = conn.execute(text(m.merge(images=staged.has_old)), bounds)
                    applied = result.scalar_one() if staged.has_old else result.rowcount
                    if applied == staged.rows:
                        break
                    rounds += 1
                    staged = self._recompute(conn, rounds)
                    recomputed += staged.rows
                if m.overwrite:
                    conn.execute(text(m.record_batch()), {**bounds, "subtask": ctx.subtask_id})
                ctx.checkpoint(conn, batch.hi, batch.scanned,
                               {"batch_rows": self.sizer.rows, "for_batch_rows": ctx.job.batch_rows})
            finally:
                unregister()
        seconds = time.monotonic() - started
        self.stats.append(BatchStats(batch.lo, batch.hi, batch.staged.rows, batch.seconds, seconds,
                                     rounds, recomputed))
        log.debug("subtask %s batch [%s, %s): %s rows, read %.3fs, merge %.3fs, %s rounds",
                  ctx.subtask_id, batch.lo, batch.hi, batch.staged.rows, batch.seconds, seconds,
                  rounds)
        return seconds

    def _recompute(self, conn: Connection, round_no: int) -> Staged:
        """Rows that changed since Spark read them: read their latest versions and
        compute again. From round OPTIMISTIC_ROUNDS + 1 on, lock them first, so
        the version Spark reads is the one the merge finds."""
        m = self.spec.merge
        keys = list(conn.execute(text(m.changed())).scalars())
        conn.exec_driver_sql(m.clear_stage())
        if not keys:
            return Staged(b"", 0, False)
        if round_no > MAX_ROUNDS:
            raise RetryableError(f"{len(keys)} rows kept changing under batch; retrying the subtask")
        if round_no > OPTIMISTIC_ROUNDS:
            conn.execute(text(m.lock()), {"keys": keys})
        self.ctx.raise_if_stopped()
        df = read_keys(self.spark, self.jdbc, self.spec.table, self.spec.key, keys,
                       where=self.spec.where)
        return self._compute(df)


def run_subtask(ctx: SubtaskContext, engine: Engine, spec: BackfillSpec) -> SubtaskRunner:
    runner = SubtaskRunner(ctx, engine, spec)
    runner.run()
    return runner
