"""Shared fixtures: one PostgreSQL server per test session, one empty database per test.

Server: a throwaway cluster from local binaries (framework.localpg.cluster.LocalPostgres)
of the major ``REORG_PG_BINDIR`` names when it is set (tests/support/pg_major.py
installs one), otherwise a testcontainers ``postgres:15`` when a Docker engine
answers, otherwise the machine's own binaries (find_binaries). The header of the
run names the server it uses.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.db import create_database, drop_database

from framework.localpg.cluster import BINDIR_ENV, LocalPostgres, binaries_version, find_binaries

# Framework fixtures (migrated database, settings, in-process nodes, worker
# processes) and the Spark data plane's (the SparkSession, an engine on a
# fresh database): see tests/support.
pytest_plugins = ["support.fixtures", "support.spark", "support.spark_archive"]

# Worker processes the tests start would each build a Spark class-data archive
# in the background on their first Spark start: CPU noise on a small machine,
# and files in the user's home. The first test marked ``spark`` builds one in
# a tmp dir for the rest of the session instead (support.spark_archive).
os.environ.setdefault("REORG_SPARK_CDS", "off")

# The tests' Spark drivers live seconds on a few thousand rows: the C2
# compiler's work never pays back there, and on 2 cores it competes with the
# test itself (a quarter less CPU per JVM, measured on two Spark tests).
# Production keeps the JVM's default tiers; a test that sets its own
# REORG_SPARK_CONF replaces this.
os.environ.setdefault("REORG_SPARK_CONF", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1")


def _docker_available() -> bool:
    """True when a Docker engine answers quickly; any failure means "no"."""
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """An empty directory the PostgreSQL server user can use.

    pytest's tmp_path lives under a root-only (0700) directory when we run as root,
    so the unprivileged server user could not reach it; mkdtemp under /tmp can be
    handed over (LocalPostgres chowns the directory itself).
    """
    path = Path(tempfile.mkdtemp(prefix="reorg-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the server -----------------------------------------------------------------

# The session's server keeps its files in memory where the machine has a tmpfs
# with room: on ext4 without a journal (CI's disk) the kernel scans past every
# recently deleted inode to allocate a new one, so each CREATE DATABASE of a
# test (~300 files, after the last test's ~300 were deleted) cost the backend
# 240-410 ms of CPU on /tmp against 13 ms on /dev/shm (perf: ext4
# recently_deleted), and every table, index and temporary table a test makes
# pays the same way. The server is a throwaway one with fsync off already; a
# killed postmaster loses nothing more on a tmpfs. TESTS_PG_DIR chooses.
_MEMORY_DIR = Path("/dev/shm")
_MEMORY_ROOM = 4 << 30  # bytes free: the largest tests' tables and WAL, three servers


def server_data_root() -> str:
    """Where the session's server keeps its data directory."""
    chosen = os.environ.get("TESTS_PG_DIR")
    if chosen:
        return chosen
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(line.split()[1:3] == [str(_MEMORY_DIR), "tmpfs"] for line in mounts)
        room = os.statvfs(_MEMORY_DIR)
    except OSError:
        return "/tmp"
    return str(_MEMORY_DIR) if tmpfs and room.f_bavail * room.f_frsize >= _MEMORY_ROOM else "/tmp"


def _use_docker() -> bool:
    # An explicit bin dir wins: it is how the suite runs on another major.
    return not os.environ.get(BINDIR_ENV) and _docker_available()


def pytest_report_header(config: pytest.Config) -> str:
    """Which PostgreSQL the run tests, so its log says which major passed."""
    if _use_docker():
        return "postgresql: postgres:15 (testcontainers)"
    try:
        bindir = find_binaries()
        return f"postgresql: {binaries_version(bindir)} ({bindir}), data under {server_data_root()}"
    except Exception as error:  # the fixture reports it at the first test that needs a server
        return f"postgresql: none ({error})"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Admin URL (superuser, database ``postgres``) of the session's server."""
    if _use_docker():
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.postgres import PostgresContainer

        container = PostgresContainer(
            "postgres:15", username="postgres", password="postgres", dbname="postgres", driver=None
        ).with_command("postgres -c max_connections=300 -c fsync=off")  # as LocalPostgres
        with container:
            yield container.get_connection_url()
        return

    data_dir = Path(tempfile.mkdtemp(prefix="reorg-pg-", dir=server_data_root()))  # see scratch_dir
    server = LocalPostgres(data_dir, durable=False)
    try:
        server.init()
        server.start()
        yield server.url()
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_major(pg_server: str) -> int:
    """The session's server's major version (e.g. 16), for a test of what
    differs between majors."""
    import psycopg

    with psycopg.connect(pg_server) as conn:
        return conn.info.server_version // 10_000


# -- databases ------------------------------------------------------------------
# An empty database here; one with reorg's system tables is ``migrated_db`` in
# framework_fixtures.py (copied from a template migrated once per session).


def _unique_db_name(request: pytest.FixtureRequest) -> str:
    # Test name in the database name makes leftovers easy to trace; max 63 bytes.
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    return f"t_{slug}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fresh_db(pg_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a new, empty database of its own; dropped after the test."""
    name = _unique_db_name(request)
    url = create_database(pg_server, name)
    try:
        yield url
    finally:
        drop_database(pg_server, name)


# Tests that build hosts out of network namespaces run one at a time when the
# suite runs in parallel (pytest-xdist, ``--dist loadgroup``): their
# namespaces and subnets are the machine's, not the test process's.
_ONE_AT_A_TIME = ("test_multihost", "test_partition", "test_postgres_crash_", "test_soak_smoke")
# The xdist group of those and of the tests that start Spark: one process.
ONE_PROCESS = "one-process"
# The files of the longest tests outside that group (mypy, 27 s; a rate over
# a window, 20 s; cold imports, 14 s). They are queued first: pytest-xdist
# hands out tests in collection order, and a parallel run whose last test was
# mypy ended 28 s after its other processes had finished.
_LONGEST_FIRST = ("test_static_checks.py", "test_throttle_rate.py", "test_command_imports.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--first-variant", action="store_true",
        help="run each parametrized test with its first parameters only (.ci/run's short "
             "form of the catalog tests on a second major; the README's loop runs them all)")


def _first_variant(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is None or not any(callspec.indices.values())


# First: pytest-xdist's own hook of this name (its worker's, registered after
# this file) reads the ``xdist_group`` markers into the test ids, and would
# read them before they are added here: every test then goes to any process,
# each of which builds its own Spark archive and session.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--first-variant"):
        later = [item for item in items if not _first_variant(item)]
        if later:
            config.hook.pytest_deselected(items=later)
            items[:] = [item for item in items if _first_variant(item)]
    for item in items:
        # Tests that start Spark (the in-process session, or workers and
        # commands with a JVM of their own) run one after another too: one
        # JVM at a time on the machine's cores, not three starting together,
        # one in-process session, and one Spark class-data archive built (a
        # minute of a core, support.spark_archive), not one a process. The
        # hosts tests share that process because some of them start Spark.
        if (item.path.name.startswith(_ONE_AT_A_TIME) or item.get_closest_marker("spark")
                or "spark" in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(ONE_PROCESS))
    items.sort(key=lambda item: item.path.name not in _LONGEST_FIRST)  # stable: else as collected


def pytest_collection_finish(session: pytest.Session) -> None:
    # A pytest-xdist worker under --dist loadgroup schedules by the group in
    # each test's id; a grouped test whose id lacks it would run beside the
    # others (a second Spark archive and session, namespaces shared): stop.
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if ungrouped:
        message = (f"{len(ungrouped)} tests lost their xdist group (first: {ungrouped[0]}): "
                   "conftest's marks came after pytest-xdist read them")
        print(message, file=sys.__stderr__)  # the controller shows an internal error only
        raise pytest.UsageError(message)
