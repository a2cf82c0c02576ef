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
nor on the forward path: indexed from prepare on, they slow every forward
batch, where a one-off build at rollback is paid only by the jobs that roll
back and costs a small share of that (``python -m bench.images_index``;
docs/benchmarks.md, "Cancel").
Built in the owner's fenced revert plan, as they were, a big job's index was
one long statement in the owner's tick (issue 12).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backfill.tables import quote
from framework.keys import KeySpec

_RELATION = re.compile(r'"((?:[^"]|"")*)"$')


@dataclass(frozen=True)
class BeforeImages:
    images: str  # quoted, schema-qualified
    batches: str
    key: KeySpec  # the target table's

    @property
    def key_columns(self) -> list[str]:
        """The images' key columns (``KeySpec.work_key``); ``keep``'s input
        names them the same."""
        return list(self._image_key.columns)

    @property
    def _image_key(self) -> KeySpec:
        """The images' key columns as a key, for range predicates on them."""
        return self.key.work_key()

    @property
    def _by_range(self) -> bool:
        """A batch's record is found by its key range (``int8range`` overlap,
        a gist index) where keys have arithmetic; other keys have no range
        type, and their batch records are found by transaction id."""
        return self.key.arithmetic

    def create(self, column_type: str, *, temporary: bool = False) -> list[str]:
        # No indexes: one append per row on the hot path; a rollback's
        # revert subtasks index them once (``index_for_restore``).
        create = "CREATE TEMP TABLE" if temporary else "CREATE TABLE IF NOT EXISTS"
        tail = " ON COMMIT DROP" if temporary else ""
        kept = self._image_key
        keys = ", ".join(f"{c} {t} NOT NULL" for c, t in zip(kept.columns, kept.types, strict=True))
        bound = self.key.bound_type
        return [f"{create} {self.images} ({keys}, old {column_type}, xid xid8 NOT NULL){tail}",
                f"{create} {self.batches} (subtask_id bigint NOT NULL, lo {bound} NOT NULL, "
                f"hi {bound} NOT NULL, xid xid8 NOT NULL){tail}"]

    def drop(self) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self.images}", f"DROP TABLE IF EXISTS {self.batches}"]

    def keep(self, written: str) -> str:
        """Keep the images of ``written`` (a CTE with the ``key_columns`` and
        ``old``). ``num_nulls`` tests the value itself: a composite with a
        NULL field is neither ``IS NULL`` nor ``IS NOT NULL``, and its old
        value is needed."""
        keys = ", ".join(self.key_columns)
        return (f"INSERT INTO {self.images} ({keys}, old, xid) "
                f"SELECT {keys}, old, pg_current_xact_id() FROM {written} "
                f"WHERE num_nulls(old) = 0")

    def record_batch(self) -> str:
        """The batch's range and transaction id. Binds ``subtask``, ``lo``,
        ``hi`` (as ``KeySpec.bind`` gives them)."""
        lo, hi = self.key.bound_param("lo"), self.key.bound_param("hi")
        return (f"INSERT INTO {self.batches} (subtask_id, lo, hi, xid) "
                f"VALUES (:subtask, {lo}, {hi}, pg_current_xact_id())")

    def index_for_restore(self) -> list[str]:
        """Indexes a range's restore batches look up by key: the images by
        key, the batches by their key range (built once, when a rollback
        needs them; the forward writes never pay for them). A key of any type
        has no range type: its batches are found by transaction id."""
        return [f"CREATE INDEX IF NOT EXISTS {_index_name(self.images, 'k')} "
                f"ON {self.images} ({', '.join(self.key_columns)})",
                f"CREATE INDEX IF NOT EXISTS {_index_name(self.batches, self._batches_index)} "
                + (f"ON {self.batches} USING gist (int8range(lo, hi))" if self._by_range
                   else f"ON {self.batches} USING hash ((CAST(xid AS xid)))")]

    @property
    def _batches_index(self) -> str:
        return "range" if self._by_range else "xid"

    def indexed_for_restore(self) -> str:
        """One boolean: both ``index_for_restore`` indexes exist (committed)."""
        return (f"SELECT to_regclass('{_qualified_index(self.images, 'k')}') IS NOT NULL "
                f"AND to_regclass('{_qualified_index(self.batches, self._batches_index)}') "
                "IS NOT NULL")

    def restore_range(self, target: str, ref: str, column: str, *,
                      bounded: bool = True) -> list[str]:
        """Put back the old values of rows in ``[:lo, :hi)`` (one batch of a
        revert subtask; no upper bound unless ``bounded``) that the job wrote
        and nobody wrote since (``target``: the table as the statement names
        it, ``ref``: how its columns are referred to). Order matters: rows
        restored by the first statement get this transaction's xmin, so the
        second (old value NULL) skips them; a retry after a crash finds every
        row as before (one transaction)."""
        col, key, kept = quote(column), self.key, self._image_key
        # The bounds on both sides of each join, as constants: the planner
        # then reads the table, the images and the batch records by index.
        rows_in = key.in_range(ref, bounded=bounded)
        restore = (f"UPDATE {target} SET {col} = reorg_i.old FROM {self.images} reorg_i "
                   f"WHERE {key.expr(ref)} = {kept.expr('reorg_i')} "
                   f"AND {ref}.xmin = CAST(reorg_i.xid AS xid) "
                   f"AND {kept.in_range('reorg_i', bounded=bounded)} AND {rows_in}")
        if not self._by_range:
            return [restore, f"UPDATE {target} SET {col} = NULL FROM {self.batches} reorg_b "
                             f"WHERE {rows_in} AND {ref}.xmin = CAST(reorg_b.xid AS xid)"]
        k = key.expr(ref)
        return [
            restore,
            f"UPDATE {target} SET {col} = NULL FROM {self.batches} reorg_b "
            f"WHERE int8range(reorg_b.lo, reorg_b.hi) && int8range(:lo, :hi) AND {rows_in} "
            f"AND {k} >= reorg_b.lo AND {k} < reorg_b.hi "
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
