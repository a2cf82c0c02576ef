"""A node's /healthz and the connection errors an operator meets (issue 26),
on a PostgreSQL of the test's own that it stops, restarts and puts behind a
password:

- /healthz answers 200 with a short JSON body while the node's database
  answers and its heartbeat is fresh, 503 with the reason when either fails
  (the server stopped; the node's scheduler stuck), 200 again once healthy;
  /metrics is the Prometheus page, anything else 404;
- a wrong password says so in one line, and how to fix it, instead of
  "start it"."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import assert_one_error_line, reorg
from support import wait_until

from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.localpg.cluster import LocalPostgres, free_port
from framework.node import Node
from framework.status_server import StatusServer

OPERATIONAL = 5


@pytest.fixture
def own_server(scratch_dir: Path) -> Iterator[LocalPostgres]:
    server = LocalPostgres(scratch_dir, durable=False)
    server.init()
    server.start()
    try:
        server.create_database("app")
        yield server
    finally:
        server.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def health(base: str) -> tuple[int, dict]:
    status, body = get(base + "/healthz")
    return status, json.loads(body)


def test_healthz_is_200_while_the_database_and_heartbeat_are_fine_503_with_the_reason_else(
        own_server: LocalPostgres) -> None:
    settings = Settings(own_server.url("app"), lease_seconds=3, owner_lease_seconds=3,
                        poll_seconds=0.2, heartbeat_seconds=0.5)
    db = Database(settings)
    migrate.upgrade(db)
    db.dispose()
    server = StatusServer("127.0.0.1", free_port())
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    assert health(base) == (503, {"status": "unhealthy",
                                  "reason": "starting: the node has not started yet"})
    node = Node(settings, node_id="n1", slots=1, owner_tick_seconds=0.2)
    node.start()
    server.health = node.health
    try:
        status, body = health(base)
        assert status == 200 and body["status"] == "ok" and body["node"] == "n1", body
        assert body["state"] == "active" and body["heartbeat_age_seconds"] < 1.5
        status, page = get(base + "/metrics")
        assert status == 200 and "reorg_build_info{" in page and "reorg_is_owner" in page
        assert get(base + "/nope")[0] == 404

        # The node's scheduler stuck: no heartbeat for three intervals.
        node.scheduler.pause()
        status, body = wait_until(lambda: (h := health(base))[0] == 503 and h, 10,
                                  "unhealthy without heartbeats")
        assert body["status"] == "unhealthy" and body["node"] == "n1"
        assert body["reason"].startswith("heartbeat is ") and "(limit 1.5s)" in body["reason"]
        node.scheduler.resume()
        wait_until(lambda: health(base)[0] == 200, 10, "healthy again")

        # The database stopped: unhealthy, and why; healthy once it is back.
        own_server.stop()
        status, body = health(base)
        assert status == 503, body
        assert body["reason"].startswith(
            f"database unreachable: cannot reach PostgreSQL at 127.0.0.1:{own_server.port}/app"
        ), body
        own_server.start()
        wait_until(lambda: health(base)[0] == 200, 30, "healthy once the database is back")
    finally:
        node.drain(timeout=10)
        server.stop()


def test_a_wrong_password_is_named_as_such_not_as_a_server_to_start(
        own_server: LocalPostgres) -> None:
    import psycopg

    with psycopg.connect(own_server.url(), autocommit=True) as conn:
        conn.execute("CREATE ROLE alice LOGIN PASSWORD 'right-one'")
    hba = own_server.pgdata / "pg_hba.conf"
    hba.write_text("host all alice 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with psycopg.connect(own_server.url(), autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
    where = f"127.0.0.1:{own_server.port}/app"
    line = assert_one_error_line(
        reorg(f"postgresql://alice:wrong-one@{where}", "status"), OPERATIONAL)
    assert line == (f"error: authentication failed for user alice; check the password in "
                    f"--db / REORG_DATABASE_URL (PostgreSQL at {where})"), line
    assert "start it" not in line and "wrong-one" not in line
    line = assert_one_error_line(reorg(f"postgresql://alice@{where}", "db", "upgrade"),
                                 OPERATIONAL)
    assert f"PostgreSQL at {where} wants a password for user alice" in line, line
    # The right one gets through to the next question (the schema).
    line = assert_one_error_line(reorg(f"postgresql://alice:right-one@{where}", "status"),
                                 OPERATIONAL)
    assert "reorg db upgrade" in line, line
