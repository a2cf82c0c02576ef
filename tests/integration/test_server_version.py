"""The PostgreSQL majors reorg runs on (framework.pgversion): a server older
than the oldest supported is refused in one line where reorg first meets it,
``reorg db upgrade`` and a worker's start, and nothing is changed.

No server of an unsupported major runs here, so the refusal is shown on the
session's server with the minimum raised above its major, through the real
command line (``cli.main.run``) in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa
from support import scalar

from framework import pgversion

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def test_the_session_server_is_supported_and_its_major_is_known(db, pg_major):
    with db.begin() as conn:
        assert pgversion.server_major(conn) == pg_major
        pgversion.check_supported(conn, "here")  # raises for an unsupported one
    assert pg_major >= pgversion.MIN_MAJOR


def _reorg_with_minimum(minimum: int, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = ("import sys; import framework.pgversion as v; "
              f"v.MIN_MAJOR = {minimum}; from cli.main import run; "
              f"sys.exit(run(['--db', {url!r}, *{list(args)!r}]))")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def _schemas(url: str) -> list[str]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT nspname FROM pg_namespace ORDER BY 1"))
                        .scalars())
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", [["db", "upgrade"], ["worker", "--slots", "1"]])
def test_an_older_major_is_refused_in_one_line_and_nothing_changes(fresh_db, db, pg_major,
                                                                    command):
    url = fresh_db if command[0] == "db" else db.settings.database_url  # a worker needs the schema
    before = _schemas(url)
    result = _reorg_with_minimum(pg_major + 1, url, *command)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: PostgreSQL {pg_major}."), lines[0]
    assert (f"is not supported: reorg runs on PostgreSQL {pg_major + 1} or newer; upgrade the "
            "server") in lines[0]
    assert result.returncode == 5
    assert _schemas(url) == before  # `db upgrade` installed nothing
    assert scalar(db, "SELECT count(*) FROM {s}.nodes") == 0  # no worker registered


def test_the_oldest_supported_major_itself_is_let_through(fresh_db, pg_major):
    result = _reorg_with_minimum(pg_major, fresh_db, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    assert "reorg" in _schemas(fresh_db)
