"""Every statement and commit reorg sends through SQLAlchemy in this
process, timed as it runs: what the batch profiles
(``batch_profile``, ``spark_batch_profile``) classify."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def timing_statements(on_statement: Callable[[str, float], None],
                      on_commit: Callable[[float], None]) -> Iterator[None]:
    """While open, ``on_statement(statement, seconds)`` after each statement
    and ``on_commit(seconds)`` after each commit, on the thread that ran it
    (the caller picks the threads it counts)."""
    from sqlalchemy import event
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
    from sqlalchemy.engine import Engine

    local = threading.local()

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        local.began = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        on_statement(statement, time.perf_counter() - local.began)

    # A commit is no statement SQLAlchemy's cursor events see.
    original = PGDialect_psycopg.do_commit

    def do_commit(dialect: Any, dbapi_connection: Any) -> None:
        began = time.perf_counter()
        original(dialect, dbapi_connection)
        on_commit(time.perf_counter() - began)

    event.listen(Engine, "before_cursor_execute", before)
    event.listen(Engine, "after_cursor_execute", after)
    PGDialect_psycopg.do_commit = do_commit  # type: ignore[method-assign]
    try:
        yield
    finally:
        PGDialect_psycopg.do_commit = original  # type: ignore[method-assign]
        event.remove(Engine, "before_cursor_execute", before)
        event.remove(Engine, "after_cursor_execute", after)
