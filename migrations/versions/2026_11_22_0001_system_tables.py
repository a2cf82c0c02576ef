"""System tables: jobs, live and history subtasks, nodes, owner lease, job events.

Why: the first schema of reorg. Every lease time in these tables is written
from the database clock; the owner lease row carries the revision that fences
every owner write, and each subtask carries the lease epoch that fences every
worker write (DESIGN.md invariants 1, 2 and 4).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JOB_STATES = (
    "queued", "running", "pausing", "paused", "resuming", "cancelling",
    "failed", "reverting", "succeeded", "cancelled", "reverted",
)
SUBTASK_STATES = ("pending", "running", "succeeded", "failed", "cancelled")
NOW = sa.text("now()")


def _schema() -> str:
    return context.config.attributes["schema"]


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _subtask_columns() -> list[sa.schema.SchemaItem]:
    return [
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.BigInteger, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("start_key", sa.BigInteger, nullable=False),
        sa.Column("end_key", sa.BigInteger, nullable=False),
        sa.Column("curr_key", sa.BigInteger, nullable=False),
        sa.Column("exec_id", sa.Text),
        sa.Column("exec_expired", sa.DateTime(timezone=True)),
        sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("not_before", sa.DateTime(timezone=True)),
        sa.Column("row_count", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("error", sa.Text),
        sa.Column("meta", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(_in("state", SUBTASK_STATES), name="state_known"),
        sa.CheckConstraint("start_key < end_key", name="range_not_empty"),
        sa.CheckConstraint("curr_key BETWEEN start_key AND end_key", name="curr_in_range"),
    ]


def upgrade() -> None:
    s = _schema()
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_key", sa.Text, unique=True),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="queued"),
        sa.Column("step", sa.Integer, nullable=False, server_default="0"),
        sa.Column("params", JSONB, nullable=False),
        sa.Column("target_table", sa.Text, nullable=False),
        sa.Column("key_column", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("concurrency", sa.Integer, nullable=False, server_default="16"),
        sa.Column("batch_rows", sa.Integer, nullable=False, server_default="10000"),
        sa.Column("max_rows_per_sec", sa.Integer),
        sa.Column("row_estimate", sa.BigInteger),
        sa.Column("run_on_node", sa.Text),
        sa.Column("revert_target", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(_in("state", JOB_STATES), name="state_known"),
        sa.CheckConstraint("concurrency > 0 AND batch_rows > 0", name="limits_positive"),
        schema=s,
    )
    # Live jobs are few; this keeps "which jobs need the owner" cheap while the
    # table fills with finished ones.
    op.create_index(
        "jobs_live", "jobs", ["state"], schema=s,
        postgresql_where=sa.text("state NOT IN ('succeeded', 'cancelled', 'reverted')"),
    )
    # One active job per table, enforced by the database so two racing submits
    # cannot both win.
    op.create_index(
        "jobs_one_active_per_table", "jobs", ["target_table"], unique=True, schema=s,
        postgresql_where=sa.text("state NOT IN ('succeeded', 'cancelled', 'reverted')"),
    )

    op.create_table(
        "background_subtask",
        *_subtask_columns(),
        sa.ForeignKeyConstraint(["job_id"], [f"{s}.jobs.id"]),
        sa.UniqueConstraint("job_id", "step", "ordinal"),
        schema=s,
    )
    op.execute(f'CREATE SEQUENCE "{s}".subtask_id_seq OWNED BY "{s}".background_subtask.id')
    op.execute(
        f'ALTER TABLE "{s}".background_subtask '
        f"ALTER COLUMN id SET DEFAULT nextval('\"{s}\".subtask_id_seq')"
    )
    # Claiming looks for claimable subtasks of one job step; the partial index
    # skips the finished rows that pile up until the history move.
    op.create_index(
        "subtask_claimable", "background_subtask", ["job_id", "step", "ordinal"], schema=s,
        postgresql_where=sa.text("state IN ('pending', 'running')"),
    )
    op.create_index("subtask_job_state", "background_subtask", ["job_id", "state"], schema=s)

    op.create_table(
        "background_subtask_history",
        *_subtask_columns(),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        schema=s,
    )
    op.create_index("history_job", "background_subtask_history", ["job_id", "ordinal"], schema=s)
    op.create_index("history_moved_at", "background_subtask_history", ["moved_at"], schema=s)

    op.create_table(
        "nodes",
        sa.Column("node_id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="active"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.CheckConstraint("state IN ('active', 'draining', 'dead')", name="state_known"),
        schema=s,
    )

    op.create_table(
        "owner_lease",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("owner_id", sa.Text),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("elected_at", sa.DateTime(timezone=True)),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="single_row"),
        schema=s,
    )
    op.execute(
        f"INSERT INTO \"{s}\".owner_lease (id, revision, expires_at) VALUES (1, 0, 'epoch')"
    )

    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_id", sa.BigInteger, sa.ForeignKey(f"{s}.jobs.id"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("from_state", sa.Text),
        sa.Column("to_state", sa.Text, nullable=False),
        sa.Column("detail", sa.Text),
        schema=s,
    )
    op.create_index("job_events_job", "job_events", ["job_id", "id"], schema=s)


def downgrade() -> None:
    s = _schema()
    for table in ("job_events", "owner_lease", "nodes", "background_subtask_history",
                  "background_subtask", "jobs"):
        op.drop_table(table, schema=s)
