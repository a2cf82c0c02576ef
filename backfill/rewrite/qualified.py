"""Definitions read from the catalogue with every name schema-qualified
(``pg_get_indexdef``, ``pg_get_constraintdef``, ``pg_get_viewdef``,
``pg_get_triggerdef``, ... qualify a name only where the session's
search_path would not find it): read with only ``pg_catalog`` on the path,
they mean the same objects in any later session, whatever its path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.engine import Connection


@contextmanager
def qualified_names(conn: Connection) -> Iterator[None]:
    before = conn.execute(text("SELECT current_setting('search_path')")).scalar()
    conn.execute(text("SELECT set_config('search_path', 'pg_catalog', true)"))
    try:
        yield
    finally:
        conn.execute(text("SELECT set_config('search_path', :p, true)"), {"p": before})
