"""Alembic migrations for reorg's system tables. Run them with ``reorg db upgrade``."""
