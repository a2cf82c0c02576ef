"""A batch as one statement: ``fenced_batch`` runs a batch's UPDATE and its
fenced checkpoint, and raises when the checkpoint is refused.

Why: an ``add-column`` batch (and any ``sql-update`` batch on fixed bounds
with nothing to keep) took four round trips: BEGIN, the UPDATE, the
checkpoint, COMMIT. Each is a network round trip when the worker runs on
another host than PostgreSQL. On one machine the saving was within its noise
(docs/benchmarks.md: medians 1.24 against 1.28 of chunked SQL). The
checkpoint could not go into the UPDATE's statement as a CTE without the
UPDATE returning every row it wrote to count them (~9 % of a batch). Here
the count is the UPDATE's own (``GET DIAGNOSTICS``), and the whole call is
one statement, so in autocommit it is one transaction: a refused checkpoint
raises, and the batch's rows roll back with it (DESIGN 2, 3).

``batch`` binds ``$1`` and ``$2`` (the range), ``checkpoint`` binds ``$1``
the rows, ``$2`` the new key (jsonb), ``$3`` the subtask, ``$4`` its
``exec_id``, ``$5`` its epoch, and returns the subtask's state when it holds
the lease (``framework.store.subtasks.fenced_batch``). Both are built by
reorg; the function runs them as its caller (SECURITY INVOKER), with the
caller's privileges and nothing more.

Revision ID: 0017_fenced_batch
Revises: 0016_scale4
Create Date: 2026-11-24
"""

from alembic import context, op

revision = "0017_fenced_batch"
down_revision = "0016_scale4"
branch_labels = None
depends_on = None

# The SQLSTATE of a refused checkpoint (framework.store.subtasks.LEASE_LOST_SQLSTATE).
LEASE_LOST_SQLSTATE = "RG001"


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    op.execute(f"""
        CREATE FUNCTION "{s}".fenced_batch(
            batch text, lo bigint, hi bigint, checkpoint text, new_key jsonb,
            subtask bigint, holder text, holder_epoch bigint,
            OUT written bigint, OUT subtask_state text)
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        BEGIN
            EXECUTE batch USING lo, hi;
            GET DIAGNOSTICS written = ROW_COUNT;
            EXECUTE checkpoint INTO subtask_state
                USING written, new_key, subtask, holder, holder_epoch;
            IF subtask_state IS NULL THEN
                RAISE EXCEPTION 'checkpoint of subtask % refused: lease lost', subtask
                    USING ERRCODE = '{LEASE_LOST_SQLSTATE}';
            END IF;
        END $$""")


def downgrade() -> None:
    op.execute(f'DROP FUNCTION "{_schema()}".fenced_batch(text, bigint, bigint, text, jsonb, '
               "bigint, text, bigint)")
