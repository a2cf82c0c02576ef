"""Before-images of a job that overwrites a column, and the rollback that puts
them back (DESIGN 8, 9); shared by ``sql-update`` and ``backfill``.

An image needs no copy of the new value: a batch's write, its images and its
checkpoint are one transaction, so a row the batch wrote and nobody touched
since still has ``xmin`` = that transaction's id. Rollback restores exactly
those rows (later application writes win) and needs no ``=`` on the column's
type (json, xml and point have none). ``images`` keeps (key, old value, xid)
for old values that are not NULL; ``batches`` keeps (range, xid) per batch,
so rows whose old value was NULL are found by range and xid without a row
each. No savepoints in a batch: rows updated in one would carry the
subtransaction's id.

Restore batches look the images up by key, so a rollback needs them
indexed. The indexes are built when a rollback needs them, by the revert
subtasks (``backfill.restore.index_before_restoring``), never by the owner
nor on the forward path: ``python -m bench.images_index`` (three runs,
2026-11-23) measured forward batches 1.05-1.13x as slow in all with the
images indexed from prepare on, against a one-off build at rollback of
0.03-0.06x the forward batches' time, paid only by the jobs that roll back.
Built in the owner's fenced revert plan, as they were, a big job's index was
one long statement in the owner's tick (issue 12).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backfill.tables import quote

_RELATION = re.compile(r'"((?:[^"]|"")*)"$')


@dataclass(frozen=True)
class BeforeImages:
    images: str  # quoted, schema-qualified
    batches: str

    def create(self, column_type: str, *, temporary: bool = False) -> list[str]:
        # No indexes: one append per row on the hot path; a rollback's
        # revert subtasks index them once (``index_for_restore``).
        create = "CREATE TEMP TABLE" if temporary else "CREATE TABLE IF NOT EXISTS"
        tail = " ON COMMIT DROP" if temporary else ""
        return [f"{create} {self.images} (k bigint NOT NULL, old {column_type}, "
                f"xid xid8 NOT NULL){tail}",
                f"{create} {self.batches} (subtask_id bigint NOT NULL, lo bigint NOT NULL, "
                f"hi bigint NOT NULL, xid xid8 NOT NULL){tail}"]

    def drop(self) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self.images}", f"DROP TABLE IF EXISTS {self.batches}"]

    def keep(self, written: str) -> str:
        """Keep the images of ``written`` (a CTE with columns ``k``, ``old``).
        ``num_nulls`` tests the value itself: a composite with a NULL field is
        neither ``IS NULL`` nor ``IS NOT NULL``, and its old value is needed."""
        return (f"INSERT INTO {self.images} (k, old, xid) "
                f"SELECT k, old, pg_current_xact_id() FROM {written} WHERE num_nulls(old) = 0")

    def record_batch(self) -> str:
        """The batch's range and transaction id. Binds ``subtask``, ``lo``, ``hi``."""
        return (f"INSERT INTO {self.batches} (subtask_id, lo, hi, xid) "
                f"VALUES (:subtask, :lo, :hi, pg_current_xact_id())")

    def index_for_restore(self) -> list[str]:
        """Indexes a range's restore batches look up by key: the images by
        ``k``, the batches by their key range (built once, when a rollback
        needs them; the forward writes never pay for them)."""
        return [f"CREATE INDEX IF NOT EXISTS {_index_name(self.images, 'k')} "
                f"ON {self.images} (k)",
                f"CREATE INDEX IF NOT EXISTS {_index_name(self.batches, 'range')} "
                f"ON {self.batches} USING gist (int8range(lo, hi))"]

    def indexed_for_restore(self) -> str:
        """One boolean: both ``index_for_restore`` indexes exist (committed)."""
        return (f"SELECT to_regclass('{_qualified_index(self.images, 'k')}') IS NOT NULL "
                f"AND to_regclass('{_qualified_index(self.batches, 'range')}') IS NOT NULL")

    def restore_range(self, target: str, ref: str, key: str, column: str) -> list[str]:
        """Put back the old values of rows in ``[:lo, :hi)`` (one batch of a
        revert subtask) that the job wrote and nobody wrote since
        (``target``: the table as the statement names it, ``ref``: how its
        columns are referred to). Order matters: rows restored by the first
        statement get this transaction's xmin, so the second (old value NULL)
        skips them; a retry after a crash finds every row as before (one
        transaction)."""
        col = quote(column)
        # The bounds on both sides of each join, as constants: the planner
        # then reads the table, the images and the batch records by index.
        rows_in = f"{ref}.{key} >= :lo AND {ref}.{key} < :hi"
        return [
            f"UPDATE {target} SET {col} = reorg_i.old FROM {self.images} reorg_i "
            f"WHERE {ref}.{key} = reorg_i.k AND {ref}.xmin = CAST(reorg_i.xid AS xid) "
            f"AND reorg_i.k >= :lo AND reorg_i.k < :hi AND {rows_in}",
            f"UPDATE {target} SET {col} = NULL FROM {self.batches} reorg_b "
            f"WHERE int8range(reorg_b.lo, reorg_b.hi) && int8range(:lo, :hi) AND {rows_in} "
            f"AND {ref}.{key} >= reorg_b.lo AND {ref}.{key} < reorg_b.hi "
            f"AND {ref}.xmin = CAST(reorg_b.xid AS xid)",
        ]


def _index_name(table: str, column: str) -> str:
    """``"schema"."t"`` -> ``"t_<column>"`` (an index lives in its table's schema)."""
    match = _RELATION.search(table)
    assert match, table
    name = match.group(1).replace('""', '"')
    return quote(f"{name}_{column}")


def _qualified_index(table: str, column: str) -> str:
    """``"schema"."t"`` -> ``"schema"."t_<column>"``, as a SQL string literal's
    contents (quotes doubled)."""
    match = _RELATION.search(table)
    assert match, table
    return (table[:match.start()] + _index_name(table, column)).replace("'", "''")
