"""Databases, tables and jobs for tests: create and drop databases, the
``items`` table every suite uses, small query helpers, and waits for jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.engine import make_url

from framework import control
from framework.states import JOB_TERMINAL
from framework.store import jobs

T = TypeVar("T")

# Where a job ends: framework.states.JOB_TERMINAL as plain strings, the form
# ``control.status`` reports (``failed`` is not terminal: a failed job reverts).
TERMINAL = frozenset(state.value for state in JOB_TERMINAL)


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, message: str = "condition",
    *, interval: float = 0.05,
) -> T:  # fmt: skip
    """Poll ``predicate`` until it returns something truthy and return that.

    Raises AssertionError naming ``message`` once ``timeout`` seconds have passed,
    so a hung test fails with a reason instead of a bare timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for: {message}")
        time.sleep(interval)


# -- databases --------------------------------------------------------------------


def database_url(admin_url: str, dbname: str) -> str:
    """``admin_url`` pointed at another database on the same server."""
    return make_url(admin_url).set(database=dbname).render_as_string(hide_password=False)


# pg_attribute.attoptions without the server's own stamp: PostgreSQL 15.20 as
# Debian ships it keeps pg_attver=<the LSN of the column's last definition>
# there, renewed by every ALTER of the column (a plain ALTER TYPE's too). What
# the catalogue tests compare is what a user set.
ATTOPTIONS = "ARRAY(SELECT o FROM unnest(attoptions) o WHERE NOT starts_with(o, 'pg_attver='))"


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` (optionally as a copy of ``template``); return its URL."""
    # FILE_COPY: a copy of the template's files, not every page through the
    # WAL (WAL_LOG, the default): 0.02 s a database instead of 0.15 s.
    # PostgreSQL 14 has no STRATEGY: it always copies the files.
    query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template or "template1"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.info.server_version >= 150000:
            query += sql.SQL(" STRATEGY FILE_COPY")
        conn.execute(query)
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting anything still attached to it."""
    query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(query)


# -- tables and queries (``target``: a URL, an Engine or a framework Database) -----


def execute(target: Any, statement: str, params: dict[str, Any] | None = None) -> list[tuple]:
    """Run ``statement`` (``;``-separated statements are fine without params)
    and commit; the rows of the last statement, if it returns any."""
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []
    with target.begin() as conn:
        result = conn.execute(sa.text(statement), params or {})
        return [tuple(r) for r in result] if result.returns_rows else []


def make_items(target: Any, rows: int, *, table: str = "items", step: int = 1) -> None:
    """items(id bigint pk, a int, b text, c text) with keys 1, 1+step, ...; c NULL;
    analysed, so batch bounds are planned as on a real table."""
    name = sql.Identifier(table).as_string(None)
    execute(target, f"DROP TABLE IF EXISTS {name}; "
                    f"CREATE TABLE {name} (id bigint PRIMARY KEY, a int, b text, c text)")
    execute(target, f"INSERT INTO {name} SELECT 1 + (g - 1) * {int(step)}, g % 97, 'v' || g, "
                    f"NULL FROM generate_series(1, {int(rows)}) g; ANALYZE {name}")


def rows(engine: Any, statement: str, **params: Any) -> list[tuple]:
    with engine.begin() as conn:
        return [tuple(r) for r in conn.execute(_sql(engine, statement), params)]


def scalar(engine: Any, statement: str, **params: Any) -> Any:
    """The first column of the first row. On a framework Database, ``{s}`` in
    ``statement`` is its system schema."""
    with engine.begin() as conn:
        return conn.execute(_sql(engine, statement), params).scalar()


def table_rows(engine: Any, table: str = "items") -> list[tuple]:
    return rows(engine, f"SELECT * FROM {table} ORDER BY 1")


snapshot = table_rows


def catalogue(engine: Any) -> list[tuple]:
    """Every user table's columns and types: what rejected input must leave alone."""
    return rows(engine, """
        SELECT table_schema, table_name, column_name, data_type FROM information_schema.columns
        WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2, 3""")


def _sql(engine: Any, statement: str) -> Any:
    return engine.sql(statement) if hasattr(engine, "sql") else sa.text(statement)


# -- jobs run by nodes ---------------------------------------------------------------


def job_of(db: Any, job_id: int) -> dict[str, Any]:
    return control.status(db, job_id)[0]


def wait_state(db: Any, job_id: int, states: Collection[str] = TERMINAL,
               timeout: float = 90) -> dict[str, Any]:
    """The job's status once its state is one of ``states``, looked at again
    on each NOTIFY the job's moves send (``framework.store.jobs.notify``),
    and at least once a second besides. A listening session the server
    closes (a restart, ``idle_session_timeout``) is opened again."""
    deadline = time.monotonic() + timeout
    listener: psycopg.Connection | None = None
    try:
        while (job := job_of(db, job_id))["state"] not in states:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout:g}s waiting for: job {job_id} "
                                     f"to reach {sorted(states)}; it is {job['state']}")
            try:
                if listener is None or listener.closed:
                    listener = _listen(db)
                for _ in listener.notifies(timeout=min(left, 1.0), stop_after=1):
                    pass
            except psycopg.OperationalError:
                if listener is not None:
                    listener.close()
                listener = None
                time.sleep(min(0.1, max(left, 0)))  # the server is restarting: not a busy loop
        return job
    finally:
        if listener is not None:
            listener.close()


def _listen(db: Any) -> psycopg.Connection:
    listener = psycopg.connect(db.settings.database_url, autocommit=True)
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(jobs.channel(db))))
    return listener


def wait_history(db: Any, job_id: int, timeout: float = 60) -> None:
    """Until the owner moved the ended job's subtasks to the history, which
    it does on a tick after the job ended (``jobs.history_done``)."""
    wait_until(lambda: scalar(db, "SELECT history_done FROM {s}.jobs WHERE id = :j", j=job_id),
               timeout, f"job {job_id}'s subtasks moved to the history")


def held_by(db: Any, node_id: str, *, live: bool = True) -> list[Any]:
    """(id, start_key, curr_key) rows of the running subtasks ``node_id`` holds;
    ``live``: only those whose lease has not expired."""
    expiry = "AND exec_expired > clock_timestamp()" if live else ""
    with db.begin() as conn:
        return conn.execute(db.sql(
            "SELECT id, start_key, curr_key FROM {s}.background_subtask "
            f"WHERE exec_id = :n AND state = 'running' {expiry}"), {"n": node_id}).all()


def statements_sent(db: Any, run: Callable[[Any], Any]) -> list[tuple[str, Any]]:
    """The statements and parameters ``run(conn)`` sends through ``db``'s
    engine, in a transaction rolled back afterwards (to EXPLAIN them as the
    store functions really send them)."""
    seen: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append((statement, parameters))

    sa.event.listen(db.engine, "before_cursor_execute", capture)
    try:
        with db.connect() as conn:
            tx = conn.begin()
            run(conn)
            tx.rollback()
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", capture)
    return seen


def subtask_ranges(db: Any, job_id: int) -> list[tuple[int, Any, Any]]:
    """(ordinal, start_key, end_key) of every subtask of the job, live and in
    history, in ordinal order: what a split (or its chunks) put in."""
    return rows(db, """
        SELECT ordinal, start_key, end_key FROM {s}.background_subtask WHERE job_id = :j
        UNION ALL
        SELECT ordinal, start_key, end_key FROM {s}.background_subtask_history
        WHERE job_id = :j ORDER BY 1""", j=job_id)


@contextmanager
def busy_sessions(url: str, n: int) -> Iterator[list[int]]:
    """``n`` sessions of the application running a long query (state
    ``active``) until the block ends; yields their pids."""
    conns = [psycopg.connect(url, autocommit=True) for _ in range(n)]
    pids = [c.info.backend_pid for c in conns]
    threads = [threading.Thread(target=_sleep_until_cancelled, args=(c,), daemon=True)
               for c in conns]
    for t in threads:
        t.start()
    try:
        yield pids
    finally:
        execute(url, "SELECT pg_cancel_backend(pid) FROM unnest(%(p)s::int[]) pid", {"p": pids})
        for t in threads:
            t.join(10)
        for c in conns:
            c.close()


def _sleep_until_cancelled(conn: psycopg.Connection) -> None:
    with suppress(psycopg.errors.QueryCanceled):
        conn.execute("SELECT pg_sleep(120)")
