"""The system tables through one psycopg connection, without SQLAlchemy: for
the CLI's short commands (``reorg status``, ``wait``, ``cancel``, ``alter``),
where importing SQLAlchemy and building an engine would be most of the
command's time (issue 9: ≤ 400 ms).

It runs the store functions that send only their own SQL text unchanged
(``jobs.state``, ``progress.jobs_progress``, ``jobs.request_cancel``): they
take what ``framework.db.SqlDatabase`` and ``SqlConnection`` describe.
Their ``:name`` parameters become psycopg's ``%(name)s`` exactly as
SQLAlchemy's psycopg dialect turns them (the same driver then binds the
same values), so both paths send the same statement and read back the same
Python values. A job type's own SQL, and whatever else builds SQLAlchemy
statements, uses ``framework.db.Database``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg
import psycopg.sql
from psycopg.conninfo import make_conninfo

from framework.config import Settings
from framework.db import (
    REVISION_SQL,
    check_current,
    revision_missing,
    session_options,
    socket_options,
    sqlalchemy_url,
    unreachable,
)

ISOLATION_LEVELS = frozenset({"READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"})
# SQLAlchemy's bind-parameter pattern for text(): ":name", not "::type" casts.
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


def psycopg_sql(template: str, schema: str) -> str:
    """A framework SQL template (``{s}``, ``:name``) as psycopg runs it."""
    return _psycopg_sql(template, schema)


@lru_cache(maxsize=128)
def _psycopg_sql(template: str, schema: str) -> str:
    sql = template.replace("{s}", f'"{schema}"').replace("%", "%%")
    return _BIND.sub(r"%(\1)s", sql)


class DirectResult:
    """The part of SQLAlchemy's result those store functions use."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def scalar(self) -> Any:
        row = self._cursor.fetchone() if self._cursor.description else None
        return row[0] if row else None

    def scalar_one(self) -> Any:
        rows = self._cursor.fetchall() if self._cursor.description else []
        if len(rows) != 1:
            raise LookupError(f"expected one row, got {len(rows)}")
        return rows[0][0]

    def mappings(self) -> DirectMappings:
        names = [c.name for c in self._cursor.description or ()]
        return DirectMappings(dict(zip(names, row, strict=True))
                              for row in self._cursor.fetchall())


class DirectMappings(list[dict[str, Any]]):
    """Rows as dicts, with the part of SQLAlchemy's ``MappingResult`` those
    store functions use besides iterating."""

    def first(self) -> dict[str, Any] | None:
        return self[0] if self else None

    def one(self) -> dict[str, Any]:
        if len(self) != 1:
            raise LookupError(f"expected one row, got {len(self)}")
        return self[0]


class DirectConnection:
    """One transaction on the direct connection (``SqlConnection``)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, statement: Any, parameters: Mapping[str, Any] | None = None) -> DirectResult:
        return DirectResult(self._conn.execute(statement, parameters or None))


class DirectDatabase:
    """A ``SqlDatabase`` of one psycopg connection, opened on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.schema = settings.schema
        self._conn: psycopg.Connection[Any] | None = None
        self._listening: psycopg.Connection[Any] | None = None  # LISTENs on its channel

    def sql(self, template: str) -> str:
        return psycopg_sql(template, self.schema)

    @contextmanager
    def begin(self, isolation_level: str | None = None) -> Iterator[DirectConnection]:
        """A transaction, committed at the end (rolled back on an error; on
        a Ctrl-C the connection is closed instead); at ``isolation_level``
        (e.g. ``"REPEATABLE READ"``: its reads one snapshot) as
        ``Database.begin``'s."""
        conn = self._connection()
        with conn.transaction():
            try:
                if isolation_level is not None:
                    if isolation_level not in ISOLATION_LEVELS:
                        raise ValueError(f"no isolation level {isolation_level!r}")
                    conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation_level}")
                yield DirectConnection(conn)
            except BaseException as stopped:
                if not isinstance(stopped, Exception):
                    # A Ctrl-C may have left a statement's result unread: a
                    # ROLLBACK would fail on it ("another command is already
                    # in progress", which psycopg prints as a warning). Closed,
                    # there is nothing to roll back; a next use connects again.
                    self.dispose()
                raise

    def schema_revision(self) -> str | None:
        try:
            with self.begin() as conn:
                revision = conn.execute(self.sql(REVISION_SQL)).scalar()
        except psycopg.errors.UndefinedTable as exc:
            if revision_missing(exc):
                return None
            raise
        return None if revision is None else str(revision)

    def check_schema_current(self) -> None:
        check_current(self.schema, self.schema_revision())

    def notified(self, channel: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a NOTIFY on ``channel``; True
        when one came. LISTENs from the first call on (and again on a new
        connection after a reconnect): a caller that reads what it waits for
        after that first call misses no notification sent after its read."""
        conn = self._connection()
        if self._listening is not conn:
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
            self._listening = conn
        # Closed in ``finally``: a generator left suspended (a Ctrl-C right
        # after a notification came) would keep holding the connection's lock.
        waiting = conn.notifies(timeout=max(timeout, 0.0), stop_after=1)
        try:
            return next(waiting, None) is not None
        finally:
            waiting.close()

    def dispose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None:
            # Pinged before reuse, as the engine's pool does: a `reorg wait`
            # outlives a database restart by connecting again.
            try:
                self._conn.execute("")
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
        if self._conn is None:
            # The same URL, session settings and socket limits as the engine's.
            url = sqlalchemy_url(self.settings.database_url).replace(
                "postgresql+psycopg://", "postgresql://", 1)
            conninfo = make_conninfo(url, options=session_options(self.settings, "cli"),
                                     **socket_options(self.settings))
            try:
                self._conn = psycopg.connect(conninfo, autocommit=True)
            except psycopg.OperationalError as exc:
                raise unreachable(self.settings.database_url, exc) from exc
        return self._conn
