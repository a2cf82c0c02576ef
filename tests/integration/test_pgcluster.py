"""LocalPostgres and the embedded default database, against real server binaries."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support import wait_until

from framework.localpg import cluster as pgcluster
from framework.localpg import embedded
from framework.localpg.cluster import LocalPostgres, PostgresNotFound, accepts_tcp, free_port
from framework.localpg.embedded import embedded_database_url, stop_embedded

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

REPO_ROOT = Path(__file__).resolve().parents[2]


def _query(url: str, query: str) -> object:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]


def test_find_binaries_returns_a_complete_bin_dir() -> None:
    bindir = pgcluster.find_binaries()
    for name in ("initdb", "pg_ctl", "postgres"):
        assert (bindir / name).is_file(), f"{name} missing in {bindir}"


def test_find_binaries_explains_how_to_install(
    monkeypatch: pytest.MonkeyPatch, scratch_dir: Path
) -> None:
    monkeypatch.delenv(pgcluster.BINDIR_ENV, raising=False)
    monkeypatch.setenv("PATH", str(scratch_dir))
    monkeypatch.setattr(pgcluster, "DEBIAN_PG_ROOT", scratch_dir)
    monkeypatch.setattr(pgcluster, "_pgserver_bindir", lambda: None)
    with pytest.raises(PostgresNotFound) as info:
        pgcluster.find_binaries()
    message = str(info.value)
    assert "\n" not in message
    assert "apt-get install postgresql" in message
    assert "pip install pgserver" in message


def _fake_bindir(directory: Path, names: tuple[str, ...]) -> Path:
    directory.mkdir()
    for name in names:
        (directory / name).write_text("#!/bin/sh\n")
    return directory


def test_find_binaries_takes_the_bindir_override_first(
    monkeypatch: pytest.MonkeyPatch, scratch_dir: Path
) -> None:
    # A machine with binaries of its own (PATH, Debian's) still runs the named ones.
    chosen = _fake_bindir(scratch_dir / "other-major", ("initdb", "pg_ctl", "postgres"))
    monkeypatch.setenv(pgcluster.BINDIR_ENV, str(chosen))
    assert pgcluster.find_binaries() == chosen


def test_an_incomplete_bindir_override_is_refused_not_passed_over(
    monkeypatch: pytest.MonkeyPatch, scratch_dir: Path
) -> None:
    wrong = _fake_bindir(scratch_dir / "client-only", ("psql",))
    monkeypatch.setenv(pgcluster.BINDIR_ENV, str(wrong))
    with pytest.raises(PostgresNotFound) as info:
        pgcluster.find_binaries()
    message = str(info.value)
    assert "\n" not in message
    assert f"REORG_PG_BINDIR={wrong} has no initdb, pg_ctl, postgres" in message


def test_the_session_server_runs_the_chosen_binaries(pg_server: str) -> None:
    # What `REORG_PG_BINDIR=... pytest` promises: the suite's server is that major,
    # and the header (pytest_report_header) names its version.
    if not os.environ.get(pgcluster.BINDIR_ENV):
        pytest.skip("REORG_PG_BINDIR not set: the server may be a container")
    version = pgcluster.binaries_version(pgcluster.find_binaries())
    assert _query(pg_server, "SHOW server_version") == version


def test_local_postgres_lifecycle(scratch_dir: Path) -> None:
    server = LocalPostgres(scratch_dir, durable=False)
    assert isinstance(server.port, int)
    assert not server.is_running()
    server.init()
    try:
        server.start()
        assert server.is_running()
        assert server.running_port() == server.port
        url = server.url()
        assert url == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        assert _query(url, "SELECT 1") == 1
        # Over TCP on loopback, not through the unix socket.
        assert str(_query(url, "SELECT inet_server_addr()")) == "127.0.0.1"
        assert _query(url, "SHOW listen_addresses") == "127.0.0.1"
        assert _query(url, "SHOW max_connections") == "300"
        assert _query(url, "SHOW server_encoding") == "UTF8"
        assert _query(url, "SHOW fsync") == "off"  # durable=False
        assert _query(url, "SHOW synchronous_commit") == "off"
        assert _query(url, "SHOW full_page_writes") == "off"
        assert Path(str(_query(url, "SHOW unix_socket_directories"))) == scratch_dir / "run"
        # Trust only for the local socket and 127.0.0.1/32: nothing else may connect.
        rules = _query(
            url,
            "SELECT array_agg(coalesce(address, type) || '/' || coalesce(netmask, '') "
            "ORDER BY line_number) FROM pg_hba_file_rules",
        )
        assert rules == ["local/", "127.0.0.1/255.255.255.255"]

        server.create_database("app")
        server.create_database("app")  # idempotent
        assert _query(server.url("app"), "SELECT current_database()") == "app"
    finally:
        server.stop()
    assert not server.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.url(), connect_timeout=2)
    server.stop()  # stopping a stopped server is a no-op


def test_fresh_db_is_empty_and_private(fresh_db: str, pg_server: str) -> None:
    assert _query(fresh_db, "SELECT current_database()") != "postgres"
    tables = _query(
        fresh_db, "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN "
        "('pg_catalog', 'information_schema')",
    )  # fmt: skip
    assert tables == 0


# -- embedded -------------------------------------------------------------------


@pytest.fixture
def embedded_env(monkeypatch: pytest.MonkeyPatch, scratch_dir: Path) -> Iterator[Path]:
    """Point the embedded database at a scratch dir; always stop it afterwards."""
    monkeypatch.setenv("REORG_EMBEDDED_DIR", str(scratch_dir))
    monkeypatch.setenv("REORG_EMBEDDED_PORT", str(free_port()))
    try:
        yield scratch_dir
    finally:
        stop_embedded()  # runs before monkeypatch restores the environment


def _embedded_url_in_subprocess() -> subprocess.Popen[str]:
    code = "from framework.localpg.embedded import embedded_database_url as f; print(f())"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_embedded_initialises_once_and_then_is_fast(
    embedded_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = int(os.environ["REORG_EMBEDDED_PORT"])
    expected = f"postgresql://postgres@127.0.0.1:{port}/reorg"

    # Two processes racing on a fresh directory: the lock makes one initialise
    # and the other reuse it (without it, the second initdb fails).
    racers = [_embedded_url_in_subprocess() for _ in range(2)]
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        assert out.strip() == expected

    # Already running: same URL, quick, and neither a subprocess nor the lock
    # (the slow path, which connects to create the database).
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"slow path taken although the server runs: {args}")

    with monkeypatch.context() as patch:
        patch.setattr(pgcluster.subprocess, "run", forbidden)
        patch.setattr(pgcluster.subprocess, "Popen", forbidden)
        patch.setattr(embedded, "_locked", forbidden)
        started = time.monotonic()
        assert embedded_database_url() == expected
        assert time.monotonic() - started < 0.5

    assert _query(expected, "SELECT current_database()") == "reorg"
    assert _query(expected, "SHOW fsync") == "on"  # the embedded cluster is durable

    stop_embedded()
    assert not accepts_tcp(port)
    assert not LocalPostgres(embedded_env, port).is_running()
    stop_embedded()  # no-op when stopped


def test_embedded_avoids_a_taken_port_and_remembers_it(
    embedded_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        taken = stranger.getsockname()[1]
        monkeypatch.setenv("REORG_EMBEDDED_PORT", str(taken))

        url = embedded_database_url()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert port != taken
        assert (embedded_env / embedded.PORT_FILE).read_text().strip() == str(port)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")

        # Restart after a stop: the remembered port, and the data survived.
        stop_embedded()
        wait_until(lambda: not accepts_tcp(port), 10, f"embedded server to leave port {port}")
        assert embedded_database_url() == url
        assert _query(url, "SELECT v FROM kept") == 42
