"""Drop ``fenced_batch``: a batch commits in one way only.

Why: migration 0017 made a batch of one bare UPDATE and its fenced
checkpoint one statement in autocommit, one round trip instead of four. Its
own measurement put the gain within this machine's noise, and it was one of
four ways a batch committed, chosen in five places. Every batch now commits
through ``framework.subtask.SubtaskContext.commit``: its write and its fenced
checkpoint in one transaction (DESIGN 3). A worker of an older version that
still calls the function finds it gone: its batch fails and is retried by a
worker of this version.

Revision ID: 0018_one_batch_commit
Revises: 0017_fenced_batch
Create Date: 2026-11-27
"""

import importlib.util
from pathlib import Path

from alembic import context, op

revision = "0018_one_batch_commit"
down_revision = "0017_fenced_batch"
branch_labels = None
depends_on = None


def upgrade() -> None:
    s = context.config.attributes["schema"]
    op.execute(f'DROP FUNCTION IF EXISTS "{s}".fenced_batch(text, bigint, bigint, text, jsonb, '
               "bigint, text, bigint)")


def downgrade() -> None:
    """The function back, as migration 0017 made it."""
    path = Path(__file__).with_name("2026_11_24_0017_fenced_batch.py")
    spec = importlib.util.spec_from_file_location("reorg_migration_0017", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.upgrade()
