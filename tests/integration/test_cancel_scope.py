"""A hard stop cancels the batch's running statement, and only that one: a
canceller that fires late never reaches the next user of the pooled
connection (issue 11, defect 10), on a real PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from framework.errors import LeaseLost
from framework.records import Job
from framework.subtask import SubtaskContext


def _ctx() -> SubtaskContext:
    job = Job(1, "t", "running", 1, {}, "t", "id", 100, None, None)
    return SubtaskContext(job, 1, 0, 10, 0, 1, {}, engine=None, fence=lambda *a: None)  # type: ignore[arg-type]


@pytest.fixture
def one_connection_pool(db):
    """Every checkout gets the same PostgreSQL session back."""
    engine = sa.create_engine(db.engine.url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _backend_pid(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def test_a_late_canceller_does_not_cancel_the_next_statement_on_the_pooled_connection(
        one_connection_pool):
    engine, ctx = one_connection_pool, _ctx()
    # Cancellers run one after another on their own thread: this one holds the
    # batch's canceller back until after the batch is over.
    ctx.on_stop(lambda: time.sleep(0.5))
    pid = _backend_pid(engine)
    with engine.begin() as conn, ctx.cancel_on_stop(conn):
        conn.execute(sa.text("SELECT 1"))
        ctx.stop("lease lost", hard=True)
    with engine.connect() as conn:  # the next user of the same session
        assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() == pid
        conn.execute(sa.text("SELECT pg_sleep(1.5)"))  # not cancelled half-way


def test_a_cancel_sent_mid_statement_abandons_the_batch_and_the_session(one_connection_pool):
    engine, ctx = one_connection_pool, _ctx()
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE landed (v int)"))
    pid = _backend_pid(engine)
    threading.Timer(0.3, lambda: ctx.stop("lease lost", hard=True)).start()
    with pytest.raises(LeaseLost), engine.begin() as conn, ctx.cancel_on_stop(conn):
        conn.execute(sa.text("INSERT INTO landed VALUES (1)"))
        conn.execute(sa.text("SELECT pg_sleep(5)"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM landed")).scalar_one() == 0
        # The cancelled session was closed, not handed on.
        assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != pid
