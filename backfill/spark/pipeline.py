"""A subtask as a pipeline of batches, generic over what a batch computes and
how it is applied: the one batch loop of ``backfill``
(``backfill.spark_backfill.batches``), ``copy`` (``backfill.copy.batches``) and
``checksum`` (``backfill.checksum.batches``).

    read thread:  bounds ─► compute(lo, hi) on Spark (its own job group) ─► split
    main thread:              one transaction per batch: apply(batch) ─► checkpoint ─► commit

Batch k+1 is computed while batch k is applied, so Spark's time hides behind
the database's. A job type may read several batches in one Spark job
(``batches_per_read``): Spark's fixed cost per job (scheduling, a JDBC
connection and query, ~90 ms on the 2-core bench machine, whatever the
rows) is then paid once for them, while each batch still merges and
checkpoints in its own transaction. A kill -9 therefore redoes at most one
batch of writes, and re-reads what the slot had read beyond its last
commit: the rest of its current read and the prefetched next one.

Each batch's write and its fenced checkpoint commit in one
transaction (DESIGN 3): a zombie's checkpoint raises LeaseLost and the whole
batch rolls back; a retried subtask resumes at the committed ``curr_key``, so
no batch applies twice. A hard stop (lease lost, cancel) cancels the
subtask's Spark job group and the running statement at once. Batch sizes
adapt toward a target time (``sizing``) and remember what they learnt in the
subtask's meta (and, if the job type keeps one, in a per-job table this
process shares between the job's subtasks).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from backfill.spark import failures, keyset_read, session, sizing
from backfill.spark.jdbc import JdbcTarget, jdbc_target
from backfill.spark.sizing import BatchSizer
from framework import faults, subtask
from framework.errors import LeaseLost, RetryableError, Stopped
from framework.keys import END, Key, KeySpec, decode
from framework.privileges import run_as
from framework.subtask import SubtaskContext

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("reorg.spark.pipeline")

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
class Batch:
    # Keys (framework.keys): ints for a single integer key, else tuples, and
    # ``hi`` END for the last batch of a step's last range.
    lo: Key
    hi: Key
    scanned: int  # rows of the split table in [lo, hi), for progress
    payload: Any  # what compute() returned
    seconds: float  # bounds + compute time


@dataclass
class BatchStat:
    """Per-batch timings and outcome, kept for tests and measurements."""

    lo: Key
    hi: Key
    scanned: int
    read_seconds: float
    apply_seconds: float
    result: Any = None


class RangePipeline(ABC):
    """Runs ``[ctx.curr_key, ctx.end_key)`` of ``table`` (keyed by ``key``)
    batch by batch. Subclasses say what a batch is (``compute``) and how it
    lands (``apply``, inside the fenced batch transaction)."""

    uses_spark = True  # False: compute() runs no Spark job (no session is started)
    range_above = sizing.RANGE_ABOVE  # batches up to batch_rows times this (sizing)
    # Batches one Spark job reads (``split`` cuts its payload into them); only
    # for a key with arithmetic, read and staged as Spark's number, whose
    # batch edges the driver can compare.
    batches_per_read = 1

    def __init__(self, ctx: SubtaskContext, engine: Engine, *, table: str, key: str,
                 key_name: str, target_seconds: float = 1.0,
                 learned: dict[int, int] | None = None) -> None:
        self.ctx = ctx
        self.engine = engine
        self.table = table  # quoted, schema-qualified: the table whose key space is split
        self.key = key  # quoted key column
        self.key_name = key_name  # unquoted key column
        # Every key column with its type: ``key``/``key_name`` are the first
        # column's, the whole key for a single integer one (the fast path).
        self.keys: KeySpec = ctx.job.key
        self.stats: list[BatchStat] = []
        # Spark reads as the job's submitter, never as the worker (security.md).
        self.jdbc: JdbcTarget = jdbc_target(engine.url, run_as(ctx.job))
        self.group = f"reorg-{ctx.job.id}-{ctx.subtask_id}-{ctx.epoch}"
        # The job's batch_rows -> the size the sizer settled on, shared by the
        # job's subtasks in this process (None: each subtask learns alone).
        self.learned = learned
        self._spark: SparkSession | None = None
        batch_rows = ctx.job.batch_rows
        self.sizer = BatchSizer(batch_rows, target_seconds, range_above=self.range_above)
        meta = ctx.meta or {}
        # Start from what this job learnt: this subtask's last run (meta), or
        # another subtask in this process; `reorg alter --batch-rows` resets it.
        if meta.get("for_batch_rows") == batch_rows and meta.get("batch_rows"):
            self.sizer.rows = int(meta["batch_rows"])
        elif learned is not None and batch_rows in learned:
            self.sizer.rows = learned[batch_rows]

    @property
    def spark(self) -> SparkSession:
        """The session this subtask attempt runs on, fixed at first use: if its
        JVM dies, the attempt fails as a whole (and is retried on a new one)
        rather than mixing DataFrames of two sessions."""
        if self._spark is None:
            self._spark = session.get_spark()
        return self._spark

    # --- what a job type provides -------------------------------------------

    @abstractmethod
    def compute(self, lo: Any, hi: Any, scanned: int) -> Any:
        """Read thread: the batch's Spark work, ending in driver-side data."""

    def split(self, payload: Any, lo: Key, edges: list[tuple[Key, int]]) -> list[Any]:
        """Read thread: ``payload`` of a read of several batches, one payload
        per batch ``[lo, edges[0][0]), [edges[0][0], edges[1][0]), ...``."""
        if len(edges) == 1:
            return [payload]
        raise NotImplementedError(f"{type(self).__name__} reads one batch at a time")

    @abstractmethod
    def apply(self, conn: Connection, raw: Any, batch: Batch) -> Any:
        """Main thread, inside the batch transaction, before the checkpoint.
        Returns what the stats should record for the batch."""

    def batch_meta(self, batch: Batch, result: Any) -> dict[str, Any]:
        """Extra meta to store with the batch's checkpoint (the whole meta is
        replaced each time, so return everything worth keeping)."""
        return {}

    def committed(self, batch: Batch, result: Any) -> None:
        """The batch's transaction committed (its checkpoint with it)."""
        return None

    def begin(self, conn: Connection) -> None:
        """Session settings for the batch transaction."""
        # The batch and its checkpoint commit or vanish together, so the commit
        # need not wait for the WAL flush: a crash can only lose whole batches
        # with their checkpoints, and they are redone.
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
        conn.exec_driver_sql("SET LOCAL jit = off")

    def record(self, batch: Batch, result: Any, seconds: float) -> None:
        """Keep the committed batch's stat (``seconds``: its transaction) and log
        its figures for measurements (bench/) as one JSON object at DEBUG on the
        ``reorg.spark.batches`` logger: ``batch {"subtask": 7, "lo": 1, ...}``."""
        self.stats.append(self.stat(batch, result, seconds))
        figures = logging.getLogger("reorg.spark.batches")
        if figures.isEnabledFor(logging.DEBUG):
            import json  # only for this line

            figures.debug("batch %s", json.dumps({
                "subtask": self.ctx.subtask_id, "lo": batch.lo, "hi": batch.hi,
                "scanned": batch.scanned, "rows": batch.scanned,
                "read_seconds": round(batch.seconds, 4), "apply_seconds": round(seconds, 4),
                **self.figures(result)}, default=str))

    def stat(self, batch: Batch, result: Any, seconds: float) -> BatchStat:
        return BatchStat(batch.lo, batch.hi, batch.scanned, batch.seconds, seconds, result)

    def figures(self, result: Any) -> dict[str, Any]:
        """A job type's own per-batch figures, added to (or replacing) the logged ones."""
        return {}

    # --- the loop -------------------------------------------------------------

    def run(self) -> None:
        with _active:
            try:
                self._run()
            except (RetryableError, LeaseLost, Stopped):
                raise
            except Exception as exc:
                # A dead JVM, a dropped database connection or a lost executor:
                # retried from the checkpoint, not failing (and rolling back) the job.
                raised = failures.as_batch_error(
                    exc, self._spark is None or session.alive(self._spark))
                if raised is exc:
                    raise
                raise raised from exc

    def _run(self) -> None:
        ctx = self.ctx
        sc = self.spark.sparkContext if self.uses_spark else None
        # A hard stop (lease lost, cancel) kills this subtask's Spark jobs at once.
        unregister = ctx.on_stop(lambda: sc.cancelJobGroup(self.group) if sc else None)
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"read-{ctx.subtask_id}")
        pending: Future[list[Batch]] | None = None
        try:
            # != rather than <: keys of any type are tuples, the last one END.
            if ctx.curr_key != ctx.end_key:
                pending = pool.submit(self._read, ctx.curr_key, self._size())
            last_commit = time.monotonic()
            while pending is not None:
                # A pause stops here, between batches, without waiting for the
                # prefetched read (``finally`` cancels it).
                ctx.raise_if_stopped()
                try:
                    read = pending.result()
                except Exception:
                    ctx.raise_if_stopped()  # a cancelled Spark job: report the stop, not the error
                    raise
                pending = None
                ctx.raise_if_stopped()
                if read[-1].hi != ctx.end_key:
                    pending = pool.submit(self._read, read[-1].hi, self._size())
                for i, batch in enumerate(read):
                    if i:
                        ctx.raise_if_stopped()  # and between the batches of one read
                    apply_seconds = self._apply(batch)
                    self.sizer.observe(batch.scanned, max(batch.seconds, apply_seconds))
                    if self.learned is not None:
                        self.learned[self.sizer.batch_rows] = self.sizer.rows
                    ctx.throttle(batch.scanned, time.monotonic() - last_commit)
                    last_commit = time.monotonic()
        finally:
            if sc is not None and pending is not None and not pending.done():
                # Leaving early: don't finish a read nobody applies. (On a dead
                # JVM this fails too; the error that brought us here matters.)
                with contextlib.suppress(Exception):
                    sc.cancelJobGroup(self.group)
            pool.shutdown(wait=True)
            unregister()

    def _size(self) -> int:
        job = self.ctx.job  # replaced by the worker when `reorg alter` changes the knobs
        self.sizer.retarget(job.batch_rows)
        return self.sizer.next_rows(job.rate_share())

    # --- read thread: bounds, then compute -------------------------------------

    def _read(self, lo: Key, rows: int) -> list[Batch]:
        """One Spark job's batches: ``batches_per_read`` of ``rows`` each (one
        for a key of any type), their payloads cut apart by ``split``."""
        self.ctx.raise_if_stopped()
        started = time.monotonic()
        edges: list[tuple[Key, int]]
        if self.batches_per_read > 1 and self.keys.arithmetic:
            assert isinstance(lo, int)  # a single integer key's keys are ints
            edges = list(self.batch_edges(lo, rows, self.batches_per_read))
        else:
            edges = [self.bounds(lo, rows)]
        hi, scanned = edges[-1][0], sum(n for _, n in edges)
        if self.uses_spark:
            self.tag_spark_jobs()
        payloads = self.split(self.compute(lo, hi, scanned), lo, edges)
        seconds = time.monotonic() - started
        batches, start = [], lo
        for (end, n), payload in zip(edges, payloads, strict=True):
            # Each batch's share of the read's time, for the sizer and the stats.
            share = n / scanned if scanned else 1 / len(edges)
            batches.append(Batch(start, end, n, payload, seconds * share))
            start = end
        return batches

    def tag_spark_jobs(self) -> None:
        """Spark jobs this thread starts from now on belong to the subtask's job
        group, which a hard stop cancels (the group is per thread)."""
        self.spark.sparkContext.setJobGroup(self.group, f"reorg subtask {self.ctx.subtask_id}",
                                            True)

    def partitions(self, rows: int) -> int:
        """JDBC partitions for a batch of ``rows``: one is the cheapest in CPU;
        split only when this process runs fewer subtasks than Spark has cores
        to spare."""
        spare = self.spark.sparkContext.defaultParallelism // max(_active.count, 1)
        return max(1, min(spare, rows // ROWS_PER_PARTITION))

    def bounds(self, lo: Key, rows: int) -> tuple[Key, int]:
        """The batch's exclusive upper key and its row count: ``rows`` keys of
        ``table`` in key order, so gappy keys still make even batches,
        deterministic in the table's keys. A remainder under half a batch joins
        this one: a tiny last batch would cost a whole batch's fixed Spark and
        commit overhead. Two probes as keyset pages in the key's own order
        (row comparisons on its index)."""
        key, end = self.keys, self.ctx.end_key
        where = key.in_range(None, bounded=end is not END, lo="lo", hi="end")
        bind = {"lo": key.bind(lo), "end": key.bind(end)}
        cut_sql, far_sql = (key.read_nth(self.table, where, n) for n in (":n", ":n2"))
        with self.engine.connect() as conn:
            cut, far = conn.execute(text(f"SELECT {cut_sql}, {far_sql}"),
                                    {**bind, "n": rows, "n2": rows + rows // 2}).one()
            if cut is not None and far is not None:
                return decode(cut), rows
            left = conn.execute(text(f"SELECT count(*) FROM {self.table} WHERE {where}"),
                                bind).scalar()
            return end, int(left or 0)

    def batch_edges(self, lo: int, rows: int, count: int) -> list[tuple[int, int]]:
        """``bounds`` of ``count`` batches in a row from ``lo``, in one index
        scan of at most ``count`` batches and a half: each batch's exclusive
        upper key and row count, the same edges ``count`` calls of ``bounds``
        would give (a remainder under half a batch joins the last one)."""
        t, k, end = self.table, self.key, self.ctx.end_key
        last = count * rows + rows // 2 + 1  # the row whose existence makes the last cut
        wanted = [j * rows + 1 for j in range(1, count + 1)]
        with self.engine.connect() as conn:
            found = conn.execute(text(f"""
                SELECT k, rn, n FROM (
                    SELECT k, rn, count(*) OVER () AS n FROM (
                        SELECT {k} AS k, row_number() OVER (ORDER BY {k}) AS rn FROM {t}
                        WHERE {k} >= :lo AND {k} < :end ORDER BY {k} LIMIT :last) firsts
                ) counted WHERE rn = ANY(:wanted) OR rn = n"""),
                {"lo": lo, "end": end, "last": last, "wanted": wanted}).all()
        n = int(found[0].n) if found else 0
        cut = {int(r.rn): int(r.k) for r in found}
        edges: list[tuple[int, int]] = []
        for j in range(1, count + 1):
            if n >= j * rows + rows // 2 + 1:
                edges.append((cut[j * rows + 1], rows))
            else:
                edges.append((end, n - (j - 1) * rows))
                break
        return edges

    def keyset_frame(self, query: str, lo: Key, hi: Key, scanned: int) -> DataFrame:
        """Rows of ``query`` (a JDBC ``dbtable`` with the key's columns under
        their own names) in ``[lo, hi)`` for a key of any type: Spark's numeric
        ``partitionColumn`` cannot split it, so the batch is read in explicit
        keyset predicates, one JDBC partition each, cut at every
        (rows / parts)-th key of the batch."""
        parts = self.partitions(scanned)
        cuts: list[Key] = []
        if parts > 1:
            with self.engine.connect() as conn:
                cuts = keyset_read.partition_cuts(conn, self.table, self.keys, lo, hi,
                                                  scanned, parts)
        return keyset_read.read_batch(self.spark, self.jdbc, query, self.keys, lo, hi, cuts)

    # --- main thread: the batch transaction -------------------------------------

    def _apply(self, batch: Batch) -> float:
        started = time.monotonic()
        ctx = self.ctx
        faults.hit("spark.before_apply")
        applied: list[Any] = []

        def write(conn: Connection) -> subtask.Batch:
            raw = conn.connection.driver_connection
            assert raw is not None
            self.begin(conn)
            applied.append(self.apply(conn, raw, batch))
            return subtask.Batch(batch.hi, batch.scanned, {
                **self.batch_meta(batch, applied[0]), "batch_rows": self.sizer.rows,
                "for_batch_rows": ctx.job.batch_rows})

        ctx.commit(write)
        result = applied[0]
        self.committed(batch, result)
        seconds = time.monotonic() - started
        self.record(batch, result, seconds)
        return seconds


def key_between(df: DataFrame, key_name: str, lo: int | None, hi: int | None,
                parts: int = 1) -> DataFrame:
    """``df`` restricted to ``lo <= key < hi`` (None: unbounded on that side),
    read in ``parts`` JDBC partitions when both ends are bounded (a union of
    narrower ranges: each child is one pushed-down range scan)."""
    from functools import reduce

    k = spark_column(key_name)
    if lo is not None and hi is not None:
        parts = max(1, min(parts, hi - lo))
        cuts = [lo + (hi - lo) * i // parts for i in range(parts)] + [hi]
        pieces = [df.where((k >= a) & (k < b)) for a, b in zip(cuts, cuts[1:], strict=False)]
        return reduce(lambda x, y: x.union(y), pieces)
    if lo is not None:
        return df.where(k >= lo)
    if hi is not None:
        return df.where(k < hi)
    return df


def spark_column(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")
