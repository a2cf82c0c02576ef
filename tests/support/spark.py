"""Helpers for tests of the Spark data plane (a pytest plugin named in
conftest's ``pytest_plugins``, so ``spark`` and ``target_db`` are fixtures
everywhere).

A ``SubtaskContext`` whose checkpoint is a fenced conditional UPDATE on a small
fake lease table, so a test can run a job type's subtasks without the worker
and can take the lease away; ``JobKind`` submits a job and runs its ranges
that way."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from framework.errors import InvalidParams
from framework.records import STEP_REVERT, Job, Target
from framework.store.subtasks import Checkpointed
from framework.subtask import Batch, SubtaskContext
from support.db import catalogue, wait_until

if TYPE_CHECKING:
    from backfill.spark.pipeline import RangePipeline

FAKE_LEASES = "public.fake_lease"


@dataclass
class FakeLease:
    """One subtask's lease row; ``revoke`` makes every later checkpoint fail."""

    engine: Engine
    subtask_id: int
    epoch: int = 1
    attempts: list[int] = field(default_factory=list)  # keys of the checkpoints tried, in order

    def create(self, start_key: int) -> None:
        with self.engine.begin() as conn:
            # Serialise concurrent creators (CREATE ... IF NOT EXISTS races in the catalogue).
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(4242)"))
            conn.execute(sa.text(
                f"CREATE TABLE IF NOT EXISTS {FAKE_LEASES} (subtask_id int PRIMARY KEY, "
                "epoch int NOT NULL, alive bool NOT NULL, curr_key bigint NOT NULL, "
                "row_count bigint NOT NULL DEFAULT 0, checkpoints int NOT NULL DEFAULT 0, "
                "meta jsonb)"))
            conn.execute(sa.text(
                f"INSERT INTO {FAKE_LEASES} (subtask_id, epoch, alive, curr_key) "
                "VALUES (:s, :e, true, :k) ON CONFLICT (subtask_id) DO UPDATE "
                "SET epoch = :e, alive = true, curr_key = :k, row_count = 0, checkpoints = 0"),
                {"s": self.subtask_id, "e": self.epoch, "k": start_key})

    def revoke(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {FAKE_LEASES} SET alive = false WHERE subtask_id = :s"),
                         {"s": self.subtask_id})

    def row(self) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT * FROM {FAKE_LEASES} WHERE subtask_id = :s"),
                                {"s": self.subtask_id}).one()


def make_context(engine: Engine, job: Job, subtask_id: int, start_key: int, end_key: int,
                 *, curr_key: int | None = None, epoch: int = 1,
                 revoke_at: int | None = None) -> tuple[SubtaskContext, FakeLease]:
    """A SubtaskContext over ``[start_key, end_key)`` whose checkpoint is fenced
    on the fake lease row. ``revoke_at=n``: the lease is revoked just before the
    n-th checkpoint, as if another worker took the subtask while that batch was
    being applied (so batches 1 .. n-1 commit, and nothing after)."""
    lease = FakeLease(engine, subtask_id, epoch)
    lease.create(start_key if curr_key is None else curr_key)

    def fence(conn: Connection, ctx: SubtaskContext, batch: Batch) -> Checkpointed | None:
        lease.attempts.append(batch.next_key)
        if len(lease.attempts) == revoke_at:
            lease.revoke()
        hit = conn.execute(sa.text(
            f"UPDATE {FAKE_LEASES} SET curr_key = :k, row_count = row_count + :n, "
            "checkpoints = checkpoints + 1, meta = coalesce(CAST(:meta AS jsonb), meta) "
            "WHERE subtask_id = :s AND epoch = :e AND alive AND curr_key <= :k"),
            {"k": batch.next_key, "n": batch.rows, "s": subtask_id, "e": epoch,
             "meta": None if batch.meta is None else json.dumps(batch.meta)}).rowcount
        if hit != 1:
            return None
        return Checkpointed("succeeded" if batch.next_key == end_key else "running", None)

    ctx = SubtaskContext(job=job, subtask_id=subtask_id, start_key=start_key, end_key=end_key,
                         curr_key=start_key if curr_key is None else curr_key, epoch=epoch,
                         meta={}, engine=engine, fence=fence)
    return ctx, lease


def make_job(job_id: int, params: dict[str, Any], *, table: str, key: str = "id",
             batch_rows: int = 10_000, max_rows_per_sec: int | None = None,
             concurrency: int = 2, type_name: str = "backfill") -> Job:
    return Job(id=job_id, type=type_name, state="running", step=1, params=params,
               target_table=table, key_column=f'"{key}"', batch_rows=batch_rows,
               max_rows_per_sec=max_rows_per_sec, row_estimate=None, concurrency=concurrency)


@contextlib.contextmanager
def validating(engine: Engine) -> Iterator[Connection]:
    """A transaction, rolled back at the end, on a session set up as
    ``reorg submit`` validates: with the CLI's timeouts, not the worker's
    (``engine``'s), which are far shorter than a first Spark job under load."""
    from framework.config import Settings
    from framework.db import session_options

    url = engine.url.render_as_string(hide_password=False)
    cli = sa.create_engine(engine.url, poolclass=sa.pool.NullPool, connect_args={
        "options": session_options(Settings(url), "cli")})
    try:
        with cli.connect() as conn, conn.begin() as tx:
            yield conn
            tx.rollback()
    finally:
        cli.dispose()


def check_input(engine: Engine, job_type: Any, params: dict[str, Any]) -> Target:
    """What ``reorg submit`` checks where no owner runs: ``validate``, then the
    type's owner-side ``analyse`` (Spark's analysis and dry run), each in a
    transaction of its own that is rolled back; the target with the params
    the analysis completed. Raises InvalidParams as the submit would."""
    with validating(engine) as conn:
        target = job_type.validate(conn, params)
    if not job_type.analyses_on_owner():
        return target
    job = Job(id=0, type=job_type.name, state="queued", step=0, params=target.params,
              target_table=target.table, key_column=target.key_column, batch_rows=1_000,
              max_rows_per_sec=None, row_estimate=None)
    with validating(engine) as conn:
        analysed = job_type.analyse(conn, job)
    return replace(target, params=analysed)


P = TypeVar("P", bound="RangePipeline")


@dataclass(frozen=True)
class JobKind(Generic[P]):
    """One job type's subtasks, run in the test's process on fake leases."""

    job_type: Any  # a framework JobType
    pipeline: Callable[[SubtaskContext, Engine, Any], P]  # (ctx, engine, spec) -> a RangePipeline
    spec_of: Callable[[Job], Any]
    defaults: dict[str, Any] = field(default_factory=dict)  # params the validated ones override

    def submit(self, engine: Engine, job_id: int, params: dict[str, Any], *,
               batch_rows: int = 1_000) -> Job:
        """validate (rolled back, as the CLI does) + prepare (as the owner does)."""
        target = check_input(engine, self.job_type, params)
        job = make_job(job_id, {**self.defaults, **target.params, "work_schema": "public"},
                       table=target.table, batch_rows=batch_rows, type_name=self.job_type.name)
        with engine.begin() as conn:
            self.job_type.prepare(conn, job)
        return job

    def subtask(self, ctx: SubtaskContext, engine: Engine, job: Job) -> P:
        return self.pipeline(ctx, engine, self.spec_of(job))

    def run_range(self, engine: Engine, job: Job, subtask_id: int, lo: int, hi: int,
                  **kw: Any) -> P:
        ctx, _ = make_context(engine, job, subtask_id, lo, hi, **kw)
        pipeline = self.subtask(ctx, engine, job)
        pipeline.run()
        return pipeline

    def run_split(self, engine: Engine, job: Job, cuts: list[int]) -> list[P]:
        """Subtasks over [cuts[0], cuts[1]), [cuts[1], cuts[2]), ..., one after another."""
        return [self.run_range(engine, job, i + 1, lo, hi)
                for i, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False))]

    def run_all(self, engine: Engine, job: Job, max_key: int, parts: int = 2) -> list[P]:
        """``parts`` subtasks over keys 1 .. max_key."""
        step = (max_key + parts) // parts
        return self.run_split(engine, job, [min(1 + i * step, max_key + 1)
                                            for i in range(parts + 1)])

    def rollback(self, engine: Engine, job: Job) -> None:
        """The whole revert as the owner and a worker run it: plan, one revert
        subtask over every key of the table (restoring an untouched range
        finds nothing to do), the final revert DDL."""
        with engine.begin() as conn:
            ranged = self.job_type.plan_revert(conn, job)
            lo, hi = conn.execute(sa.text(
                f"SELECT coalesce(min({job.key_column}), 0), "
                f"coalesce(max({job.key_column}), 0) + 1 FROM {job.target_table}")).one()
        if ranged:
            reverting = replace(job, state="reverting", step=STEP_REVERT)
            ctx, _ = make_context(engine, reverting, 999_999, lo, hi)
            self.job_type.revert_subtask(ctx)
        with engine.begin() as conn:
            self.job_type.revert(conn, job)

    def run_until_hard_stop(self, engine: Engine, job: Job, lo: int, hi: int, *,
                            checkpoints: int = 2) -> tuple[list[BaseException], FakeLease]:
        """Run subtask 1 over ``[lo, hi)`` on a thread, stop it hard (as a cancel
        does) once ``checkpoints`` batches committed; what it raised, and its
        lease. Fails if the subtask does not stop."""
        ctx, lease = make_context(engine, job, 1, lo, hi)
        pipeline = self.subtask(ctx, engine, job)
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                pipeline.run()
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_until(lambda: lease.row().checkpoints >= checkpoints, 60,
                       f"{checkpoints} committed batches", interval=0.01)
        finally:
            ctx.stop("job cancelling", hard=True)
            thread.join(30)
        assert not thread.is_alive(), "subtask did not stop after a hard stop"
        return outcome, lease

    def assert_rejected(self, engine: Engine, params: dict[str, Any], says: str) -> None:
        """``validate`` refuses ``params`` with one line that contains ``says``,
        and no table changes."""
        before = catalogue(engine)
        with pytest.raises(InvalidParams) as err:
            check_input(engine, self.job_type, params)
        message = str(err.value)
        assert says in message and "\n" not in message, message
        assert catalogue(engine) == before


def reverse_text(value: str | None) -> str | None:
    """A Python UDF for tests (``--udf support.spark:reverse_text``)."""
    return None if value is None else value[::-1]


def slow_reverse_text(value: str | None) -> str | None:
    """``reverse_text`` taking a fifth of a millisecond a row: a read of
    more rows than one fetch stays open, between its fetches, long enough
    for a test to drop its connection."""
    import time

    time.sleep(0.0002)
    return reverse_text(value)


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark(spark_class_archive: Any) -> Iterator[Any]:
    """The process's SparkSession, started once for the whole test session
    (after the session's class-data archive is built, so it maps it)."""
    from backfill.spark.session import get_spark, stop

    yield get_spark()
    stop()


@pytest.fixture
def target_db(fresh_db: str) -> Iterator[Engine]:
    """An engine on a fresh database with a worker's session settings (statement
    and lock timeouts below the lease length)."""
    from framework.config import Settings
    from framework.db import session_options, sqlalchemy_url

    engine = sa.create_engine(
        sqlalchemy_url(fresh_db), pool_size=5, max_overflow=5,
        connect_args={"options": session_options(Settings(fresh_db, lease_seconds=30), "worker")})
    yield engine
    engine.dispose()
