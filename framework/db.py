"""Engines, session settings and the schema-revision check.

Every SQL statement of the framework is a ``text()`` template with ``{s}``
standing for the quoted system schema; ``Database.sql`` formats and caches it.

SQLAlchemy is imported when a ``Database`` is made, not with this module: a
short read command (``reorg status``) reads through psycopg alone
(``framework.directdb``), and importing SQLAlchemy is most of its time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from framework import pgversion
from framework.config import ConfigError, Settings
from framework.errors import is_stale_plan, one_line
from framework.revisions import head_revision, known_revisions

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine


class DatabaseUnreachable(RuntimeError):
    pass


class SchemaBehind(RuntimeError):
    pass


def sqlalchemy_url(url: str) -> str:
    """Map a user's ``postgresql://`` URL onto SQLAlchemy's psycopg 3 dialect."""
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if scheme == "postgresql+psycopg":
        return url
    raise ConfigError(
        f"database URL must start with postgresql://, got {scheme or 'no scheme'}://...; "
        "e.g. --db postgresql://user@host:5432/dbname"
    )


def describe_url(url: str) -> str:
    """host:port/db of a URL, without credentials, for error messages."""
    parts = urlsplit(url)
    try:
        port = parts.port or 5432
    except ValueError:  # not a number: shown as written, still without credentials
        return parts.netloc.rpartition("@")[2] + parts.path
    return f"{parts.hostname or 'localhost'}:{port}{parts.path}"


def session_options(settings: Settings, role: str) -> str:
    """libpq ``options`` for a process's sessions.

    Workers and the owner keep their timeouts below their lease length: a
    paused process can sit in an open transaction holding row locks (or the
    owner lease row), and its successor must not wait for it longer than the
    lease it is taking over (DESIGN invariants 3 and 4).
    """
    opts = {"application_name": f"reorg-{role}", "timezone": "UTC"}
    if role == "worker":
        ms = int(settings.lease_seconds * 1000)
        opts |= {
            "idle_in_transaction_session_timeout": str(ms // 3),
            "lock_timeout": str(ms // 3),
            "statement_timeout": str(ms // 2),
        }
    elif role == "owner":
        # No statement timeout: the split scans a whole key column.
        ms = int(settings.owner_lease_seconds * 1000)
        opts |= {"idle_in_transaction_session_timeout": str(ms // 3), "lock_timeout": str(ms // 3)}
    else:
        opts |= {"lock_timeout": "5000", "idle_in_transaction_session_timeout": "60000"}
    return " ".join(f"-c {k}={v}" for k, v in opts.items())


def socket_options(settings: Settings) -> dict[str, int]:
    """libpq socket settings so a partitioned connection fails instead of
    hanging: a blackholed socket otherwise blocks a worker for hours."""
    lease_ms = int(min(settings.lease_seconds, settings.owner_lease_seconds) * 1000)
    return {
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": max(lease_ms, 1000),
    }


# The revision of the system tables: one statement, no catalogue probe first.
# A schema without the table (not installed) fails it with UndefinedTable.
REVISION_SQL = "SELECT version_num FROM {s}.alembic_version"
UNDEFINED_TABLE = "42P01"


def revision_missing(error: BaseException) -> bool:
    """Whether ``error`` (psycopg's, or SQLAlchemy's around it) says the
    revision table does not exist: the system tables are not installed."""
    return getattr(getattr(error, "orig", error), "sqlstate", None) == UNDEFINED_TABLE


class SqlConnection(Protocol):
    """What the store functions that send only their own SQL text
    (``jobs.state``, ``progress``, the user's requests: cancel, pause,
    resume, retry, alter) need of a connection: SQLAlchemy's, or
    ``framework.directdb``'s."""

    def execute(self, statement: Any, parameters: Any = None) -> Any: ...


class SqlDatabase(Protocol):
    """What those store functions need of a database."""

    schema: str

    def sql(self, template: str) -> Any: ...


class Database:
    """The system tables of one reorg installation (one URL, one schema)."""

    def __init__(self, settings: Settings, role: str = "cli", pool_size: int = 5) -> None:
        import sqlalchemy as sa

        self.settings = settings
        self.schema = settings.schema
        self.engine: Engine = sa.create_engine(
            sqlalchemy_url(settings.database_url),
            pool_size=pool_size,
            max_overflow=pool_size,
            # A worker checks a connection out for every claim and every batch;
            # a ping there is a round trip each, a fifth of a quick subtask's
            # time. Without it a connection broken since its last use (a
            # database restart) fails its statement instead: a claim is simply
            # tried again, a batch retried, and SQLAlchemy then replaces every
            # pooled connection older than the failure.
            pool_pre_ping=role != "worker",
            # The connection returned last goes out first: a worker slot runs
            # batch after batch on one backend. Handed out in turn (FIFO), a
            # slot's batches rotated over three backends, whose CPU for the
            # same UPDATEs was ~20 % above chunked SQL's two connections
            # (`python -m bench.dataplane.backend_cpu`); with LIFO, within 5 %.
            pool_use_lifo=True,
            connect_args={"options": session_options(settings, role), **socket_options(settings)},
        )
        sa.event.listen(self.engine, "handle_error", _replace_stale_connections)

    def sql(self, template: str) -> sa.TextClause:
        return _compiled(template, self.schema)

    def connect(self, **execution_options: object) -> Connection:
        """A connection; translates 'cannot connect' into DatabaseUnreachable."""
        from sqlalchemy.exc import OperationalError

        try:
            return self.engine.connect().execution_options(**execution_options)
        except OperationalError as exc:
            raise unreachable(self.settings.database_url, exc.orig) from exc

    @contextmanager
    def begin(self, **execution_options: object) -> Iterator[Connection]:
        """A transaction on a new connection (see ``connect``)."""
        with self.connect(**execution_options) as conn, conn.begin():
            yield conn

    def schema_revision(self) -> str | None:
        from sqlalchemy.exc import ProgrammingError

        try:
            with self.begin() as conn:
                # Read first by `reorg db upgrade` and at a worker's start: the
                # place to refuse a server reorg does not run on.
                pgversion.check_supported(conn, describe_url(self.settings.database_url))
                return conn.execute(self.sql(REVISION_SQL)).scalar()
        except ProgrammingError as exc:
            if revision_missing(exc):
                return None
            raise

    def check_schema_current(self) -> None:
        check_current(self.schema, self.schema_revision())

    def check_schema_not_newer(self) -> str | None:
        return check_not_newer(self.schema, self.schema_revision())

    def dispose(self) -> None:
        self.engine.dispose()


def _replace_stale_connections(context: sa.engine.ExceptionContext) -> None:
    """A statement prepared before its table's shape changed (a column's type,
    by a job or by anyone: ``errors.is_stale_plan``) fails on every pooled
    connection that prepared it, again and again: psycopg keeps its prepared
    statements for the connection's life. Treated as a lost connection, the
    pool replaces this one now and every other one at its next checkout, so
    the retried statement is planned afresh against the table as it is."""
    if is_stale_plan(context.original_exception):
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = True


# PostgreSQL's words for a wrong password (SQLSTATE 28P01), whatever the
# method (password, md5, scram-sha-256), and libpq's for none given.
_WRONG_PASSWORD = re.compile(r'authentication failed for user "([^"]*)"')
_NO_PASSWORD = "no password supplied"


def unreachable(url: str, error: BaseException | None) -> DatabaseUnreachable:
    """The one line of a failed connection: a server that answered and
    refused the password says so (starting it would not help)."""
    where = describe_url(url)
    text = str(error or "")
    wrong = _WRONG_PASSWORD.search(text)
    if wrong or getattr(error, "sqlstate", None) == "28P01":
        user = wrong.group(1) if wrong else urlsplit(url).username or "?"
        return DatabaseUnreachable(
            f"authentication failed for user {user}; check the password in --db / "
            f"REORG_DATABASE_URL (PostgreSQL at {where})")
    if _NO_PASSWORD in text:
        return DatabaseUnreachable(
            f"PostgreSQL at {where} wants a password for user "
            f"{urlsplit(url).username or 'the default user'}; give it in --db / "
            "REORG_DATABASE_URL (postgresql://USER:PASSWORD@HOST/DB) or in ~/.pgpass")
    return DatabaseUnreachable(
        f"cannot reach PostgreSQL at {where}: "
        f"{one_line(error, empty='no answer')}; start it or pass --db / REORG_DATABASE_URL")


def check_current(schema: str, current: str | None) -> None:
    """Raise SchemaBehind unless ``current`` is the revision this code needs."""
    head = head_revision()
    if check_not_newer(schema, current) != head:
        where = f"at revision {current}" if current else "not installed"
        raise SchemaBehind(
            f"reorg's system tables in schema {schema!r} are {where}, this version "
            f"needs {head}: run `reorg db upgrade`"
        )


def check_not_newer(schema: str, current: str | None) -> str | None:
    """``current``, unless a newer reorg upgraded the schema past what this
    version knows (its workers still running an older version keep working:
    migrations only add; a command of this version refuses)."""
    if current is not None and current not in known_revisions():
        raise SchemaBehind(
            f"reorg's system tables in schema {schema!r} are at revision {current}, "
            f"newer than this version of reorg knows (its newest is {head_revision()}): "
            "install the version that ran `reorg db upgrade` on this host"
        )
    return current


@lru_cache(maxsize=512)
def _compiled(template: str, schema: str) -> sa.TextClause:
    import sqlalchemy as sa

    return sa.text(template.replace("{s}", f'"{schema}"'))
