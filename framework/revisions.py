"""The revisions of reorg's migrations, read off the migration files
(``migrations/versions``) without importing alembic: which one is the head
this code needs, and which ones this version knows. ``framework.db`` checks
a schema's revision against them; ``framework.migrate`` moves it."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

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
