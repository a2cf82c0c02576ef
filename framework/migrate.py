"""Run reorg's alembic migrations programmatically (no alembic.ini needed).

Alembic is imported only to upgrade or downgrade: every command checks the
schema's revision against ``framework.revisions.head_revision``, which reads
the revision ids off the migration files instead (importing alembic costs
~0.4 s a command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.db import Database
from framework.revisions import MIGRATIONS_DIR

if TYPE_CHECKING:
    from alembic.config import Config

def alembic_config(schema: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["schema"] = schema
    return cfg


def alembic_head() -> str:
    """Alembic's own view of the head (tests check ``head_revision`` against it)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config("reorg")).get_heads()
    assert len(heads) == 1, f"migrations must have a single head, found {heads}"
    return heads[0]


# Any fixed number: it serialises concurrent upgrades of one database.
_UPGRADE_LOCK = 0x7265_6F72_6700


class UpgradeBlocked(RuntimeError):
    """A migration waited out the session's lock timeout: nothing changed."""


# SQLSTATE lock_not_available: a lock wait ran past lock_timeout.
_LOCK_NOT_AVAILABLE = "55P03"


def upgrade(db: Database, revision: str = "head") -> None:
    """Apply migrations. Two processes upgrading at once (e.g. the first two
    commands on a new embedded database) take turns; the second finds nothing
    left to do.

    Every lock a migration takes waits at most the session's lock timeout
    (5 s for the CLI): a migration queued behind a transaction left open on
    reorg's tables would otherwise hold up every worker's statement queued
    behind it, for as long as that transaction stays open. Past the timeout
    the whole upgrade rolls back and ``UpgradeBlocked`` names the sessions
    holding locks on the schema."""
    from alembic import command
    from sqlalchemy import exc, text

    cfg = alembic_config(db.schema)
    try:
        with db.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except exc.DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
        raise UpgradeBlocked(_blocked(db)) from error


# The sessions holding a granted lock on a table of the schema, oldest
# transaction first (the one a migration most likely waited for).
_LOCK_HOLDERS = """
    SELECT a.pid, a.usename, a.application_name, a.state,
           floor(extract(epoch FROM clock_timestamp() - a.xact_start))::bigint AS open_seconds,
           string_agg(DISTINCT c.relname, ', ') AS tables
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.granted AND c.relnamespace = CAST(:schema AS regnamespace)
      AND l.pid <> pg_backend_pid()
    GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start
    ORDER BY a.xact_start NULLS LAST
    LIMIT 3"""


def _blocked(db: Database) -> str:
    """The one line of an upgrade that gave up waiting for a lock."""
    from sqlalchemy import text

    with db.begin() as conn:
        timeout = conn.execute(text("SHOW lock_timeout")).scalar()
        holders = conn.execute(text(_LOCK_HOLDERS), {"schema": db.schema}).mappings().all()
    head = (f"the upgrade of schema {db.schema} waited {timeout} (lock_timeout) for a lock "
            "on its tables and gave up; nothing changed")
    if not holders:
        return (f"{head}; no session holds a lock there now (the transaction it waited for "
                "has ended): run `reorg db upgrade` again")
    sessions = "; ".join(
        f"pid {h['pid']} (user {h['usename']}, application {h['application_name'] or '-'}, "
        f"{h['state'] or 'state hidden'}, transaction open {h['open_seconds']} s, on "
        f"{h['tables']})" for h in holders)
    return (f"{head}. Holding locks there, oldest transaction first: {sessions}. End the "
            f"transaction that stays open (or SELECT pg_terminate_backend({holders[0]['pid']})) "
            "and run `reorg db upgrade` again")


def downgrade(db: Database, revision: str) -> None:
    from alembic import command

    cfg = alembic_config(db.schema)
    with db.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
