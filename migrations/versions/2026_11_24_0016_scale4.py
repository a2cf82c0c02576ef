"""An index of each job's running subtasks, for the running count of every
claim and lease renewal.

Why: the count (``subtasks.running_of``: the job's subtasks under a live
lease, which its ``concurrency`` caps) asks for ``job_id`` and state
``running``. Three indexes could answer it: ``subtask_job_state``, and the
partial ``subtask_claimable`` and ``subtask_exhausted`` (pending or running),
whose predicate the count's implies. Until the live table is analysed (a
100,000-subtask job runs its first minute on the statistics of an empty
table) the planner takes the smallest, ``subtask_exhausted``, and walks every
pending subtask of the job to count the running ones: ~50,000 rows and
26 ms a claim half way through a 100,000-subtask job, most of the server's
time in the framework benchmark (issue 9). This partial index holds the
running subtasks only, so it is the smallest index that answers the count
and reads only them, whatever the statistics say.

The claim's candidate scan had the same trap: on those statistics the
planner may read the job's pending subtasks through ``subtask_exhausted``
and sort them all by ordinal (100,000 rows a claim) instead of walking
``subtask_claimable`` in order. A pending subtask that was never claimed is
no longer in ``subtask_exhausted`` (only a claimed subtask can have used up
its attempts; its readers now say ``attempts > 0``), so neither the claim nor
the count can be answered from it, and the split inserts one index entry
less per range.

Revision ID: 0016_scale4
Revises: 0015_throughput
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0016_scale4"
down_revision = "0015_throughput"
branch_labels = None
depends_on = None


def _schema() -> str:
    return context.config.attributes["schema"]


LIVE = "state IN ('pending', 'running')"


def upgrade() -> None:
    s = _schema()
    op.create_index("subtask_running", "background_subtask", ["job_id"], schema=s,
                    postgresql_where=sa.text("state = 'running'"))
    _exhausted(s, f"{LIVE} AND attempts > 0")


def downgrade() -> None:
    s = _schema()
    _exhausted(s, LIVE)
    op.drop_index("subtask_running", "background_subtask", schema=s)


def _exhausted(s: str, where: str) -> None:
    op.drop_index("subtask_exhausted", "background_subtask", schema=s)
    op.create_index("subtask_exhausted", "background_subtask", ["job_id", "attempts"],
                    schema=s, postgresql_where=sa.text(where))
