"""Helpers shared by all test suites (import as ``from helpers import ...``;
pytest puts tests/ on sys.path because it holds conftest.py and no __init__.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

T = TypeVar("T")


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


def database_url(admin_url: str, dbname: str) -> str:
    """``admin_url`` pointed at another database on the same server."""
    return make_url(admin_url).set(database=dbname).render_as_string(hide_password=False)


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` (optionally as a copy of ``template``); return its URL."""
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(query)
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting anything still attached to it."""
    query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(query)
