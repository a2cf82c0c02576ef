"""Where a job step's claimable subtasks begin, kept by the owner so a claim
does not walk the finished ones.

Why: the claim takes a job step's candidates from one ordered scan of the
partial index ``subtask_claimable`` (state pending or running). A subtask that
finished leaves its old entries in that index (one per row version: pending,
running, each lease renewal) until vacuum removes them, and they all sit in
front of the first claimable ordinal. Autovacuum on a table churning thousands
of updates a second comes by rarely (once a minute at most, per database), so
every claim of a 100,000-subtask job walked tens of thousands of dead entries
(up to 12,800 buffers a claim at half way): the rate fell with the job's size
(issue 9). Now the owner writes, once a tick, the lowest ordinal of the step
that is pending or running (``claim_from``, for the step ``claim_from_step``),
and the claim scans from there. Subtasks only ever leave the claimable set
(except a retry of failed ones, which resets it), and new ranges come with
higher ordinals, so nothing claimable is below it; a stale value (another
step, or NULL) means "from the start".

The live subtask table also gets its own autovacuum thresholds: by default
it is vacuumed once a fifth of it is dead, 20,000 row versions for a job of
100,000 subtasks (each subtask leaves two or more), while every other
statement that reads it by state (the running count of claims and renewals,
the owner's probes) walks those dead entries too. Vacuum still comes at most
once per ``autovacuum_naptime``; this makes it come at each.

Revision ID: 0015_throughput
Revises: 0010_keys
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0015_throughput"
down_revision = "0010_keys"
branch_labels = None
depends_on = None

AUTOVACUUM = "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 2000"


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    op.add_column("jobs", sa.Column("claim_from_step", sa.Integer), schema=s)
    op.add_column("jobs", sa.Column("claim_from", sa.Integer), schema=s)
    op.execute(f'ALTER TABLE "{s}".background_subtask SET ({AUTOVACUUM})')


def downgrade() -> None:
    s = _schema()
    names = ", ".join(option.split(" = ")[0] for option in AUTOVACUUM.split(", "))
    op.execute(f'ALTER TABLE "{s}".background_subtask RESET ({names})')
    op.drop_column("jobs", "claim_from", schema=s)
    op.drop_column("jobs", "claim_from_step", schema=s)
