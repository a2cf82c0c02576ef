"""A long statement a job runs outside its batch transactions (here
``alter-type``'s ``CREATE INDEX CONCURRENTLY``) outlives the worker that
started it when the worker is killed (-9) or frozen (SIGSTOP, a zombie
whose socket stays open): its backend goes on, holding its lock on the
table. The cancel's revert DDL must not queue behind it (each queued lock
request holds the application's writes): the orphan is ended, the job
reaches ``cancelled`` within a bounded time, no backend of it is left, the
application's writes are never held for seconds, and the table is exactly
as before (framework.long_statements)."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest
from support import TERMINAL, rows, scalar, wait_until
from support.app import App, column_catalog, table_as_oracle
from support.oracle import report

from framework import control
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault

ROWS = 2_000
BUILD = "CREATE INDEX CONCURRENTLY%"


def _make_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL DEFAULT 7, b text);
            CREATE INDEX items_a_b ON items (a, b);
            INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
            CREATE TABLE report (x int);
            ANALYZE items""")


def _long_report(url: str) -> psycopg.Connection:
    """A report on another table, its snapshot older than the build's, running
    until closed: the build waits for it at its end ("waiting for old
    snapshots"), holding its lock on items all the while."""
    reader = psycopg.connect(url)
    reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute("SELECT count(*) FROM report")
    return reader


def _builds(db) -> list[tuple]:
    """(pid, application_name) of every backend running a concurrent build."""
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(
            "SELECT pid, application_name FROM pg_stat_activity "
            f"WHERE query LIKE '{BUILD.replace('%', '%%')}' AND pid <> pg_backend_pid()")]


@pytest.mark.parametrize("how", ["kill -9", "SIGSTOP"])
def test_a_worker_gone_during_alter_types_build_leaves_no_build_behind_and_cancel_ends(
        db, settings, workers, how):
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    reader = _long_report(url)
    app = App(url)
    app.load()
    app.start()
    try:
        job_id = submit(db, SubmitRequest(
            "alter-type", {"table": "items", "column": "a", "type": "bigint"},
            rows_per_subtask=1_000, batch_rows=500)).job_id
        for node in ("w1", "w2"):
            workers.start(node, slots=1)
        wait_until(lambda: scalar(db, "SELECT count(*) FROM pg_stat_progress_create_index "
                                      "WHERE phase = 'waiting for old snapshots'"),
                   120, "the build waiting for the report's snapshot")
        (orphan, _), = _builds(db)
        node, = [r[0] for r in db.engine.connect().exec_driver_sql(
            "SELECT exec_id FROM reorg.background_subtask WHERE job_id = %(j)s AND step = 3 "
            "AND state = 'running' AND meta ? 'build'", {"j": job_id})]
        victim, = [w for w in workers if w.node_id == node]
        victim.signal(signal.SIGKILL if how == "kill -9" else signal.SIGSTOP)
        app.longest = 0.0  # from here on: the cancel and its revert
        control.cancel(db, job_id)
        cancelled = time.monotonic()
        # The lease runs out in 3 s, the owner (the other worker, or its heir)
        # reverts at its next tick: well within 30 s unless something hangs.
        done = _ended(db, job_id, 30)
        took = round(time.monotonic() - cancelled, 2)
        app.stop(at_least_ops=20)
    finally:
        reader.close()
        app.stop_event.set()
    report(f"worker {how} during alter-type's build, then cancel", job="alter-type",
           cancelled_s=took, longest_app_write_s=round(app.longest, 3))
    assert done == "cancelled"
    assert _builds(db) == [], "a build of the job is still running"
    assert scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = :p", p=orphan) == 0
    assert app.errors == []
    assert app.longest < 2.0, f"an application write waited {app.longest:.1f}s"
    assert column_catalog(url) == before
    assert table_as_oracle(url) == app.oracle


def _ended(db, job_id: int, timeout: float) -> str:
    return _ended_as(db, job_id, "cancelled", timeout)


def _ended_as(db, job_id: int, expected: str, timeout: float) -> str:
    """The job's state once it ended; fails naming where it hangs."""
    def ended() -> str | None:
        state = scalar(db, "SELECT state FROM reorg.jobs WHERE id = :j", j=job_id)
        return state if state in TERMINAL else None

    try:
        return wait_until(ended, timeout, f"job {job_id} to be {expected}")
    except AssertionError as exc:
        (state, error), = rows(db, "SELECT state, error FROM reorg.jobs WHERE id = :j",
                               j=job_id)
        raise AssertionError(f"{exc}: it is {state} ({error})") from None


def test_the_next_holder_ends_a_frozen_holders_build_before_its_own(db, settings, workers):
    """A worker frozen (SIGSTOP) in alter-type's build keeps its socket open:
    its build goes on. Once its lease runs out, the next holder of the
    subtask ends that build before starting its own, so two never race; the
    job then succeeds with the one index."""
    url = settings.database_url
    _make_table(url)
    reader = _long_report(url)
    app = App(url)
    app.load()
    app.start()
    try:
        job_id = submit(db, SubmitRequest(
            "alter-type", {"table": "items", "column": "a", "type": "bigint"},
            rows_per_subtask=1_000, batch_rows=500)).job_id
        first = workers.start("w1", slots=1)
        wait_until(lambda: scalar(db, "SELECT count(*) FROM pg_stat_progress_create_index "
                                      "WHERE phase = 'waiting for old snapshots'"),
                   120, "the build waiting for the report's snapshot")
        (frozen, frozen_tag), = _builds(db)
        first.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        workers.start("w2", slots=1)
        # The heir's build waits for the report's snapshot in turn.
        (heir, heir_tag), = wait_until(
            lambda: (b := _builds(db)) and all(pid != frozen for pid, _ in b) and b,
            60, "the frozen holder's build ended and the heir's started")
        report("worker SIGSTOP during alter-type's build", job="alter-type",
               heir_building_s=round(time.monotonic() - frozen_at, 2))
    finally:
        reader.close()
    done = _ended_as(db, job_id, "succeeded", 60)
    app.stop(at_least_ops=20)
    assert done == "succeeded"
    assert frozen_tag.endswith("-epoch-1") and heir_tag.endswith("-epoch-2"), (frozen_tag,
                                                                                heir_tag)
    assert scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = :p", p=frozen) == 0
    assert _builds(db) == []
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    assert scalar(db, "SELECT count(*) FROM pg_index WHERE indrelid = 'items'::regclass "
                      "AND NOT indisvalid") == 0
