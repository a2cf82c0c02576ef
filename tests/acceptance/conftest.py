"""Fixtures of the ``reorg`` acceptance tests."""

from __future__ import annotations

import pytest
from cli_support import seed_items_db
from security_support import installation  # noqa: F401 (a fixture: docs/security.md's roles)


@pytest.fixture
def items_db(migrated_db: str, request: pytest.FixtureRequest) -> str:
    """A migrated database with ``items`` (the test module's ``ITEMS_ROWS``
    rows, 1,000 unless it says) and a queued job on ``other``, so the system
    tables have rows a bad command could touch."""
    return seed_items_db(migrated_db, getattr(request.module, "ITEMS_ROWS", 1_000))
