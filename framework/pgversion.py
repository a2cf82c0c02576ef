"""Which PostgreSQL majors reorg runs on, checked where it first meets a
server: ``reorg db upgrade`` and a worker's start (``Database.schema_revision``,
which both read first).

Supported: 14 to 18, each tested (README, "Supported PostgreSQL"). 13 and
older are untested and past their end of life (13's was November 2025), so
they are refused in one line rather than left to fail later, mid-job, on a
catalog column or a statement they lack. A newer major than tested is let
through.

Where behaviour differs between supported majors, the code says so at the
spot (search for "PostgreSQL 1" in backfill/ and framework/)."""

from __future__ import annotations

from typing import Any

# The oldest major reorg runs on.
MIN_MAJOR = 14


class UnsupportedServer(RuntimeError):
    """The server is of a PostgreSQL major reorg does not run on."""


def server_version(conn: Any) -> tuple[int, ...]:
    """The server's version, e.g. ``(16, 4)``, of a SQLAlchemy connection (read
    by the dialect when it connected: no round trip)."""
    return tuple(conn.dialect.server_version_info)


def server_major(conn: Any) -> int:
    return server_version(conn)[0]


def check_supported(conn: Any, where: str) -> None:
    """Refuse a server older than ``MIN_MAJOR``; ``where`` names it (host:port/db)."""
    version = server_version(conn)
    if version[0] < MIN_MAJOR:
        shown = ".".join(str(part) for part in version)
        raise UnsupportedServer(
            f"PostgreSQL {shown} at {where} is not supported: reorg runs on PostgreSQL "
            f"{MIN_MAJOR} or newer; upgrade the server, or point --db / REORG_DATABASE_URL "
            "at one that is")
