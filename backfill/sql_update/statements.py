"""The SQL of an ``sql-update`` batch and of its rollback (DESIGN 3, 8, 9).

One function builds the batch's statement, for the batch and for submit's
EXPLAIN of it: the user's ``--set`` and ``--where`` sit in the same place,
with the same parentheses, in both. The target carries its own name as an
alias, so the statement reads the same whether it names the user's table or
submit's temporary clone of it. Before-images: ``backfill.before_images``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backfill.before_images import BeforeImages
from backfill.expressions import embed
from backfill.tables import quote

_LAST_IDENT = re.compile(r'("(?:[^"]|"")*")$')


def alias_of(qualified: str) -> str:
    """The relation part of a quoted ``"schema"."table"``, quoted."""
    match = _LAST_IDENT.search(qualified)
    assert match, qualified
    return match.group(1)


@dataclass(frozen=True)
class UpdateSql:
    table: str  # quoted, schema-qualified (or submit's temporary clone)
    alias: str  # quoted name of the user's table
    key: str  # quoted
    column: str  # unquoted target column
    expr: str  # checked by expressions.one_expression
    where: str | None  # likewise
    images: str | None  # quoted; None: the job added the column, nothing to keep
    batches: str | None = None

    def update(self) -> str:
        """The batch: set the column on the range's rows matching ``where``.
        Binds ``lo`` and ``hi``. In overwrite mode it keeps before-images and
        returns one row: the rows it saw, the rows it wrote; fewer written
        means some changed under it, and ``update_locked`` does those."""
        t, a, k, col = self.table, self.alias, self.key, quote(self.column)
        if self.images is None:
            return f"UPDATE {t} AS {a} SET {col} = {embed(self.expr)} WHERE {self._matching()}"
        # No row locks: the old values are read in the statement's snapshot,
        # and the update joins them by ctid, so it writes only the very
        # version it took the image of (DESIGN 8, 9). A row an application
        # changed after that snapshot has a new version at another ctid:
        # READ COMMITTED re-checks that version (EvalPlanQual) against the
        # same image row, the ctid differs, and the row is skipped, so no
        # value is computed from, nor an image taken of, a version this
        # statement did not overwrite. (The old version cannot be vacuumed
        # and its slot reused while this snapshot is open.) Locking every
        # row first (FOR UPDATE) cost 1.3-1.7x a plain ranged UPDATE
        # (docs/benchmarks.md): each lock is a write of its own.
        return f"""
            WITH reorg_read AS (
                SELECT {a}.{k} AS reorg_k, {a}.{col} AS reorg_old, {a}.ctid AS reorg_tid
                FROM {t} AS {a} WHERE {self._matching()}),
            reorg_updated AS (
                UPDATE {t} AS {a} SET {col} = {embed(self.expr)} FROM reorg_read
                WHERE {a}.ctid = reorg_read.reorg_tid AND {a}.{k} >= :lo AND {a}.{k} < :hi
                RETURNING reorg_read.reorg_k AS k, reorg_read.reorg_old AS old),
            reorg_kept AS ({self.kept.keep("reorg_updated")})
            SELECT (SELECT count(*) FROM reorg_read) AS seen,
                   (SELECT count(*) FROM reorg_updated) AS written"""

    def update_locked(self) -> str:
        """Overwrite mode, after ``update`` wrote fewer rows than it saw: the
        range's matching rows this transaction has not written yet (a row it
        wrote carries its xid as ``xmin``), locked first and their old values
        read from the locked versions; the update then computes from those
        same versions (DESIGN 9). Rare: only rows an application changed
        while the batch ran. Binds ``lo`` and ``hi``."""
        t, a, k, col = self.table, self.alias, self.key, quote(self.column)
        # The range on the update's side too: without it PostgreSQL merge-joins
        # from the index's first key, so a batch's cost grows with its key.
        return f"""
            WITH reorg_locked AS (
                SELECT {a}.{k} AS reorg_k, {a}.{col} AS reorg_old FROM {t} AS {a}
                WHERE {self._matching()}
                AND NOT {a}.xmin = CAST(pg_current_xact_id() AS xid)
                FOR UPDATE OF {a}),
            reorg_updated AS (
                UPDATE {t} AS {a} SET {col} = {embed(self.expr)} FROM reorg_locked
                WHERE {a}.{k} = reorg_locked.reorg_k AND {a}.{k} >= :lo AND {a}.{k} < :hi
                RETURNING reorg_locked.reorg_k AS k, reorg_locked.reorg_old AS old)
            {self.kept.keep("reorg_updated")}"""

    def _matching(self) -> str:
        a, k = self.alias, self.key
        return f"{a}.{k} >= :lo AND {a}.{k} < :hi AND {embed(self.where or 'TRUE')}"

    @property
    def kept(self) -> BeforeImages:
        assert self.images is not None and self.batches is not None
        return BeforeImages(self.images, self.batches)

    def record_batch(self) -> str:
        return self.kept.record_batch()

    def create_images(self, column_type: str, *, temporary: bool = False) -> list[str]:
        return self.kept.create(column_type, temporary=temporary)

    def drop_images(self) -> list[str]:
        return self.kept.drop()


    def restore_range(self) -> list[str]:
        """``restore`` for one batch ``[:lo, :hi)`` of a revert subtask."""
        return self.kept.restore_range(f"{self.table} AS {self.alias}", self.alias, self.key,
                                       self.column)
