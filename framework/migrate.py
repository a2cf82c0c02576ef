"""Run reorg's alembic migrations programmatically (no alembic.ini needed).

Alembic is imported only to upgrade or downgrade: every command checks the
schema's revision against ``head_revision``, which reads the revision ids off
the migration files instead (importing alembic costs ~0.4 s a command).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from framework.db import Database

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_REVISION = re.compile(r'^revision = "([^"]+)"$', re.M)
_DOWN_REVISION = re.compile(r'^down_revision = (?:"([^"]+)"|None)$', re.M)


@lru_cache(maxsize=1)
def _revision_graph() -> tuple[frozenset[str], frozenset[str]]:
    """(every revision id, every id some migration revises), off the files."""
    revisions, revised = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        source = path.read_text()
        found = _REVISION.search(source)
        if found:
            revisions.add(found.group(1))
            down = _DOWN_REVISION.search(source)
            if down and down.group(1):
                revised.add(down.group(1))
    return frozenset(revisions), frozenset(revised)


def head_revision() -> str:
    """The one revision no other migration revises (alembic's head)."""
    revisions, revised = _revision_graph()
    heads = revisions - revised
    assert len(heads) == 1, f"migrations must have a single head, found {sorted(heads)}"
    return next(iter(heads))


def known_revisions() -> frozenset[str]:
    """Every revision this version's migrations know: a schema at any other
    was upgraded by a newer version of reorg."""
    return _revision_graph()[0]


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


def upgrade(db: Database, revision: str = "head") -> None:
    """Apply migrations. Two processes upgrading at once (e.g. the first two
    commands on a new embedded database) take turns; the second finds nothing
    left to do."""
    from alembic import command
    from sqlalchemy import text

    cfg = alembic_config(db.schema)
    with db.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(db: Database, revision: str) -> None:
    from alembic import command

    cfg = alembic_config(db.schema)
    with db.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
