"""Keys of any type: subtask keys become jsonb, jobs name their key columns.

Why: a table keyed by text, uuid, numeric, a timestamp or several columns
could not be split, because ``start_key``/``end_key``/``curr_key`` were
bigint. They are jsonb now (``framework.keys``): a single integer key keeps
its value as a JSON number (``to_jsonb`` of the bigint), any other key is a
JSON array of its columns' values, and a last range without an upper bound
ends at ``{}``. jsonb's own order keeps the range checks meaningful for every
kind. ``job_split_pending`` keeps its waiting ranges the same way.
``jobs.key_columns``/``key_types`` name the key's columns and types; NULL on
older jobs, whose key is the single integer ``key_column``.

Downgrade: only while every stored key is a number (no job on another kind
of key is live or in history); it fails otherwise rather than lose them.

Revision ID: 0010_keys
Revises: 0009_bigtable
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0010_keys"
down_revision = "0009_bigtable"
branch_labels = None
depends_on = None

SUBTASK_TABLES = ("background_subtask", "background_subtask_history")
KEY_COLUMNS = ("start_key", "end_key", "curr_key")


def _schema() -> str:
    return context.config.attributes["schema"]


def _retype(table: str, to: str, using: str) -> None:
    s = _schema()
    changes = ", ".join(f"ALTER COLUMN {c} TYPE {to} USING {using.format(c=c)}"
                        for c in KEY_COLUMNS)
    op.execute(f'ALTER TABLE "{s}".{table} {changes}')


def upgrade() -> None:
    s = _schema()
    for table in SUBTASK_TABLES:
        _retype(table, "jsonb", "to_jsonb({c})")
    op.execute(f'ALTER TABLE "{s}".job_split_pending '
               "ALTER COLUMN los TYPE jsonb[] USING CAST(CAST(los AS text[]) AS jsonb[]), "
               "ALTER COLUMN his TYPE jsonb[] USING CAST(CAST(his AS text[]) AS jsonb[])")
    op.add_column("jobs", sa.Column("key_columns", postgresql.ARRAY(sa.Text)), schema=s)
    op.add_column("jobs", sa.Column("key_types", postgresql.ARRAY(sa.Text)), schema=s)


def downgrade() -> None:
    s = _schema()
    op.drop_column("jobs", "key_types", schema=s)
    op.drop_column("jobs", "key_columns", schema=s)
    op.execute(f'ALTER TABLE "{s}".job_split_pending '
               "ALTER COLUMN los TYPE bigint[] USING CAST(CAST(los AS text[]) AS bigint[]), "
               "ALTER COLUMN his TYPE bigint[] USING CAST(CAST(his AS text[]) AS bigint[])")
    for table in SUBTASK_TABLES:
        _retype(table, "bigint", "CAST({c} AS bigint)")
