"""Helpers for tests of the Spark data plane: a ``SubtaskContext`` whose
checkpoint is a fenced conditional UPDATE on a small fake lease table, so a
test can run ``run_subtask`` without the worker and can take the lease away."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from framework.jobtype import LEASE_LOST, Job, LeaseLost, SubtaskContext

FAKE_LEASES = "public.fake_lease"


def make_items(engine: Engine, rows: int, *, table: str = "items", step: int = 1) -> None:
    """items(id bigint pk, a int, b text, c text) with keys 1, 1+step, ...; c NULL."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, a int, b text, c text)"))
        conn.execute(sa.text(
            f"INSERT INTO {table} SELECT 1 + (g - 1) * :step, g % 97, 'v' || g, NULL "
            "FROM generate_series(1, :n) g"), {"n": rows, "step": step})
        conn.execute(sa.text(f"ANALYZE {table}"))


def snapshot(engine: Engine, table: str = "items") -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1"))]


@dataclass
class FakeLease:
    """One subtask's lease row; ``revoke`` makes every later checkpoint fail."""

    engine: Engine
    subtask_id: int
    epoch: int = 1

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
                 before_checkpoint: Any = None) -> tuple[SubtaskContext, FakeLease]:
    """A SubtaskContext over ``[start_key, end_key)`` whose checkpoint is fenced
    on the fake lease row; ``before_checkpoint(conn, key)`` runs first (fault hook)."""
    lease = FakeLease(engine, subtask_id, epoch)
    lease.create(start_key if curr_key is None else curr_key)

    def checkpoint(conn: Connection, key: int, rows: int, meta: dict | None = None) -> None:
        if before_checkpoint is not None:
            before_checkpoint(conn, key)
        hit = conn.execute(sa.text(
            f"UPDATE {FAKE_LEASES} SET curr_key = :k, row_count = row_count + :n, "
            "checkpoints = checkpoints + 1, meta = coalesce(CAST(:meta AS jsonb), meta) "
            "WHERE subtask_id = :s AND epoch = :e AND alive AND curr_key <= :k"),
            {"k": key, "n": rows, "s": subtask_id, "e": epoch,
             "meta": None if meta is None else json.dumps(meta)}).rowcount
        if hit != 1:
            ctx.stop(LEASE_LOST, hard=True)
            raise LeaseLost(f"subtask {subtask_id} epoch {epoch}: checkpoint refused")
        ctx.curr_key = key

    ctx = SubtaskContext(job=job, subtask_id=subtask_id, start_key=start_key, end_key=end_key,
                         curr_key=start_key if curr_key is None else curr_key, epoch=epoch,
                         meta={}, checkpoint=checkpoint, stop_event=threading.Event())
    return ctx, lease


def make_job(job_id: int, params: dict[str, Any], *, table: str, key: str = "id",
             batch_rows: int = 10_000, max_rows_per_sec: int | None = None,
             concurrency: int = 2) -> Job:
    return Job(id=job_id, type="backfill", state="running", step=1, params=params,
               target_table=table, key_column=f'"{key}"', batch_rows=batch_rows,
               max_rows_per_sec=max_rows_per_sec, row_estimate=None, concurrency=concurrency)


def reverse_text(value: str | None) -> str | None:
    """A Python UDF for tests (``--udf spark_helpers:reverse_text``)."""
    return None if value is None else value[::-1]


# -- fixtures (import them into a test module: `from spark_helpers import spark, target_db`) --


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The process's SparkSession, started once for the whole test session."""
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
