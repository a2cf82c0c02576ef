"""A server that closes idle sessions (``idle_session_timeout``, as some
managed PostgreSQL services set it) closes a node's pooled connections
between jobs, its listener's and its heartbeat's too. The next job must
still run to the oracle: the pool hands out the connection returned last,
so the ones left at the bottom sit idle longest, and workers do not ping a
connection before using it (``framework/db.py``)."""

from __future__ import annotations

from support import TERMINAL, fill, make_items, scalar, wait_state, wait_until

from framework.submit import submit


def test_jobs_still_succeed_after_the_server_closes_idle_sessions_of_the_node(db, start_node):
    make_items(db, 4_000)
    with db.begin() as conn:
        name = conn.exec_driver_sql("SELECT current_database()").scalar()
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET idle_session_timeout = 500')
    try:
        start_node("n1", slots=2)
        for n in range(3):
            # The node idles until the server has closed some of its sessions.
            closed = _closed_by_the_server(db)
            wait_until(lambda: _closed_by_the_server(db) > closed, 30,  # noqa: B023
                       "sessions closed by idle_session_timeout")
            job_id = submit(db, fill(f"md5(b) || {n}", column=f"d{n}", rows_per_subtask=1_000,
                                     batch_rows=250)).job_id
            assert wait_state(db, job_id, TERMINAL, 60)["state"] == "succeeded", n
            assert scalar(db, f"SELECT count(*) FROM items "
                              f"WHERE d{n} IS DISTINCT FROM md5(b) || {n}") == 0
    finally:
        with db.begin() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" RESET idle_session_timeout')


def _closed_by_the_server(db) -> int:
    """Sessions of this database ended by a fatal error (an idle-session
    timeout is one), as the statistics count them."""
    with db.begin() as conn:
        conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
        return conn.exec_driver_sql(
            "SELECT sessions_fatal FROM pg_stat_database "
            "WHERE datname = current_database()").scalar()
