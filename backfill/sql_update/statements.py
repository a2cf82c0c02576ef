"""The SQL of an ``sql-update`` batch and of its rollback (DESIGN 3, 8, 9).

One function builds the batch's statement, for the batch and for submit's
EXPLAIN of it: the user's ``--set`` and ``--where`` sit in the same place,
with the same parentheses, in both. The target carries its own name as an
alias, so the statement reads the same whether it names the user's table or
submit's temporary clone of it.

Before-images (overwrite mode) keep no copy of the new value: the batch's
update, its images and its checkpoint are one transaction, so a row the batch
wrote and nobody touched since still has ``xmin`` = that transaction's id.
Rollback restores exactly those rows (later application writes win) and needs
no ``=`` operator on the column's type (json, xml, point have none).
``images`` keeps (key, old value, xid) for non-NULL old values; ``batches``
keeps (range, xid) per batch, so rows whose old value was NULL are found by
range and xid without a row each. No savepoints in a batch: rows updated in
one would carry the subtransaction's id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
        """The batch: set the column on the range's rows matching ``where``,
        keeping before-images in overwrite mode. Binds ``lo`` and ``hi``."""
        t, a, k, col = self.table, self.alias, self.key, quote(self.column)
        matching = f"{a}.{k} >= :lo AND {a}.{k} < :hi AND {embed(self.where or 'TRUE')}"
        if self.images is None:
            return f"UPDATE {t} AS {a} SET {col} = {embed(self.expr)} WHERE {matching}"
        # Lock the rows first and read their old values from the locked
        # versions; the update then computes from those same versions (DESIGN 9).
        # num_nulls tests the value itself: a composite with a NULL field
        # "IS NULL" is false and "IS NOT NULL" too, and its old value is needed.
        return f"""
            WITH reorg_locked AS (
                SELECT {a}.{k} AS reorg_k, {a}.{col} AS reorg_old FROM {t} AS {a}
                WHERE {matching} FOR UPDATE OF {a}),
            reorg_updated AS (
                UPDATE {t} AS {a} SET {col} = {embed(self.expr)} FROM reorg_locked
                WHERE {a}.{k} = reorg_locked.reorg_k
                RETURNING reorg_locked.reorg_k, reorg_locked.reorg_old)
            INSERT INTO {self.images} (k, old, xid)
            SELECT reorg_k, reorg_old, pg_current_xact_id() FROM reorg_updated
            WHERE num_nulls(reorg_old) = 0"""

    def record_batch(self) -> str:
        return f"INSERT INTO {self.batches} (lo, hi, xid) VALUES (:lo, :hi, pg_current_xact_id())"

    def create_images(self, column_type: str, *, temporary: bool = False) -> list[str]:
        # No indexes: one append per row on the hot path; rollback joins by hash.
        create = "CREATE TEMP TABLE" if temporary else "CREATE TABLE IF NOT EXISTS"
        tail = " ON COMMIT DROP" if temporary else ""
        return [f"{create} {self.images} (k bigint NOT NULL, old {column_type}, "
                f"xid xid8 NOT NULL){tail}",
                f"{create} {self.batches} (lo bigint NOT NULL, hi bigint NOT NULL, "
                f"xid xid8 NOT NULL){tail}"]

    def drop_images(self) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self.images}", f"DROP TABLE IF EXISTS {self.batches}"]

    def restore(self) -> list[str]:
        """Put back the old values of rows the job wrote and nobody wrote since.
        Order matters: rows restored by the first statement get this
        transaction's xmin, so the second (old value NULL) skips them; and a
        retry after a crash finds every row as before (one transaction)."""
        t, a, k, col = self.table, self.alias, self.key, quote(self.column)
        return [
            f"UPDATE {t} AS {a} SET {col} = reorg_i.old FROM {self.images} reorg_i "
            f"WHERE {a}.{k} = reorg_i.k AND {a}.xmin = CAST(reorg_i.xid AS xid)",
            f"UPDATE {t} AS {a} SET {col} = NULL FROM {self.batches} reorg_b "
            f"WHERE {a}.{k} >= reorg_b.lo AND {a}.{k} < reorg_b.hi "
            f"AND {a}.xmin = CAST(reorg_b.xid AS xid)",
        ]
