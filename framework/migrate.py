"""Run reorg's alembic migrations programmatically (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text

from framework.db import Database

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(schema: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["schema"] = schema
    return cfg


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("reorg")).get_heads()
    assert len(heads) == 1, f"migrations must have a single head, found {heads}"
    return heads[0]


# Any fixed number: it serialises concurrent upgrades of one database.
_UPGRADE_LOCK = 0x7265_6F72_6700


def upgrade(db: Database, revision: str = "head") -> None:
    """Apply migrations. Two processes upgrading at once (e.g. the first two
    commands on a new embedded database) take turns; the second finds nothing
    left to do."""
    cfg = alembic_config(db.schema)
    with db.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(db: Database, revision: str) -> None:
    cfg = alembic_config(db.schema)
    with db.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
