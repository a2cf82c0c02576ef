"""Fixtures for tests of the framework on a real PostgreSQL: a migrated
database per test (copied from a template migrated once per session), settings
with short leases, and in-process nodes that are always drained."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from helpers import create_database, database_url, drop_database

from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.node import Node

TEMPLATE = "reorg_template"


@pytest.fixture(scope="session")
def migrated_template(pg_server: str) -> str:
    drop_database(pg_server, TEMPLATE)
    url = create_database(pg_server, TEMPLATE)
    db = Database(Settings(url))
    migrate.upgrade(db)
    db.dispose()
    return TEMPLATE


@pytest.fixture
def migrated_db(pg_server: str, migrated_template: str) -> Iterator[str]:
    """URL of a new database with reorg's system tables installed."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    create_database(pg_server, name, template=migrated_template)
    try:
        yield database_url(pg_server, name)
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def settings(migrated_db: str) -> Settings:
    """Short leases so takeovers happen within a test's patience."""
    return Settings(migrated_db, lease_seconds=3, owner_lease_seconds=3, poll_seconds=0.2,
                    heartbeat_seconds=0.5, retry_backoff_seconds=0.2, local_job_max_subtasks=0)


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.dispose()


@pytest.fixture
def start_node(settings: Settings) -> Iterator[Callable[..., Node]]:
    """Start in-process nodes; every one is drained at teardown."""
    started: list[Node] = []

    def start(node_id: str | None = None, slots: int = 2, **overrides) -> Node:
        s = Settings(**{**settings.__dict__, **overrides}) if overrides else settings
        node = Node(s, node_id=node_id or f"node-{len(started)}", slots=slots,
                    owner_tick_seconds=0.2)
        node.start()
        started.append(node)
        return node

    yield start
    for node in started:
        if not node.stopped.is_set():
            node.drain(timeout=10)


def make_items(db: Database, rows: int, *, table: str = "items", step: int = 1) -> None:
    """items(id bigint pk, a int, b text, c text) with keys 1, 1+step, ..."""
    with db.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        conn.execute(sa.text(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, a int, b text, c text)"))
        conn.execute(sa.text(
            f"INSERT INTO {table} SELECT 1 + (g - 1) * :step, g % 97, 'v' || g, NULL "
            "FROM generate_series(1, :n) g"), {"n": rows, "step": step})


def table_rows(db: Database, table: str = "items") -> list[tuple]:
    with db.begin() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1"))]
