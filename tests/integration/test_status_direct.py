"""``reorg status`` reads through psycopg alone (framework.directdb): the same
rows as through SQLAlchemy, the same refusals, and a ``reorg status JOB
--json`` process that never imports SQLAlchemy, pydantic, rich or alembic
(issue 9: status as a command ≤ 400 ms; importing them was most of it)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import psycopg
import pytest
from support import TERMINAL, fill, make_items, wait_state, wait_until

from framework import control
from framework.db import SchemaBehind
from framework.directdb import DirectDatabase, psycopg_sql
from framework.errors import InvalidParams
from framework.submit import submit


def test_both_paths_read_the_same_status(db, settings, start_node):
    make_items(db, 2_000)
    make_items(db, 1_000, table="other")
    done = submit(db, fill("md5(b)", rows_per_subtask=500, batch_rows=100)).job_id
    start_node("n1")
    wait_state(db, done, TERMINAL)
    direct = DirectDatabase(settings)
    try:
        direct.check_schema_current()
        for job_id in (done, None):
            # Read between two reads of the engine's path that agree: the
            # owner may still be at the finished job (its subtasks' move to
            # history) and change the status between two reads.
            pair: list = []

            def settled(job_id=job_id, pair=pair) -> bool:
                before = control.status(db, job_id)
                pair[:] = [control.status(direct, job_id), before]
                return control.status(db, job_id) == before

            wait_until(settled, 30, "the status to hold still for three reads")
            assert pair[0] == pair[1]
        with pytest.raises(InvalidParams, match="job 999 does not exist"):
            control.status(direct, 999)
    finally:
        direct.dispose()


def test_a_schema_not_installed_is_refused_like_the_engine_refuses_it(settings):
    direct = DirectDatabase(settings.__class__(**{**settings.__dict__, "schema": "nowhere"}))
    try:
        with pytest.raises(SchemaBehind, match="'nowhere' are not installed"):
            direct.check_schema_current()
    finally:
        direct.dispose()


def test_parameters_become_psycopg_placeholders_and_casts_stay():
    assert psycopg_sql("SELECT x::int, :a, CAST(:b AS bigint), '%' FROM {s}.t WHERE y = :a",
                       "reorg") == ('SELECT x::int, %(a)s, CAST(%(b)s AS bigint), \'%%\' '
                                    'FROM "reorg".t WHERE y = %(a)s')


def test_status_as_a_command_loads_no_sqlalchemy_pydantic_rich_or_alembic(db, settings):
    make_items(db, 100)
    job_id = submit(db, fill("md5(b)")).job_id
    script = ("import json, sys; from cli.main import run; "
              f"code = run(['--db', {settings.database_url!r}, 'status', '{job_id}', '--json']); "
              "print(json.dumps([code, sorted({m.split('.')[0] for m in sys.modules} "
              "& {'sqlalchemy', 'pydantic', 'rich', 'alembic'})]))")
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout.strip().splitlines()
    shown = json.loads("\n".join(lines[:-1]))
    assert [j["id"] for j in shown] == [job_id] and shown[0]["state"] == "queued"
    assert json.loads(lines[-1]) == [0, []]


def test_wait_hears_the_job_end_instead_of_polling_for_it(db, settings, start_node,
                                                          monkeypatch):
    """``reorg wait`` on the direct connection LISTENs for job moves: with
    its fallback poll an hour away, it still returns once the job succeeds."""
    from cli import progress

    monkeypatch.setattr(progress, "WAIT_LISTENING_POLL_SECONDS", 3600.0)
    make_items(db, 2_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=500, batch_rows=100)).job_id
    direct = DirectDatabase(settings)
    waited: list[dict] = []
    waiter = threading.Thread(
        target=lambda: waited.append(progress.wait_ended(direct, job_id, None)), daemon=True)
    try:
        waiter.start()
        wait_until(lambda: direct._listening is not None, timeout=30,
                   message="wait never started listening")
        start_node("n1")
        waiter.join(120)
        assert not waiter.is_alive(), "wait did not hear the job end"
        assert waited[0]["state"] == "succeeded"
    finally:
        direct.dispose()


def test_a_ctrl_c_inside_a_transaction_closes_the_connection_without_a_rollback(
        settings, caplog):
    """A Ctrl-C can leave a statement's result unread (it lands between the
    statement's send and its read). A ROLLBACK on that connection failed, and
    psycopg printed that as a warning: a second line under `reorg wait`'s
    one. Closed instead, and the next read connects again."""
    direct = DirectDatabase(settings)
    try:
        with pytest.raises(KeyboardInterrupt), direct.begin() as conn:
            assert conn.execute("SELECT 1").scalar() == 1
            pgconn = direct._conn.pgconn
            pgconn.send_query(b"SELECT pg_sleep(0.1)")  # sent, its result never read
            raise KeyboardInterrupt
        assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
        assert pgconn.status != psycopg.pq.ConnStatus.OK  # closed
        with direct.begin() as conn:
            assert conn.execute("SELECT 2").scalar() == 2
    finally:
        direct.dispose()
