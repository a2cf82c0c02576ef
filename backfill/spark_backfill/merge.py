"""The SQL of a batch's merge transaction and of rollback (DESIGN 3, 8, 9).

Merge: staged rows land in the target only where the row's ``xmin`` still
equals the version Spark read, i.e. nobody wrote the row since. Rows that
changed are found afterwards as staged keys whose ``xmin`` is not this
transaction's id (rows this transaction updated carry its id) and are
recomputed. No savepoints in a merge transaction: rows updated inside one
would carry the subtransaction's id and look changed.

Before-images (overwrite mode, ``backfill.before_images``) are taken by
PostgreSQL in the merge statement itself, never from what Spark read: Spark's
types do not carry every PostgreSQL value exactly (unconstrained numeric is
decimal(38,18) there), and rollback must put back the exact old value
(DESIGN 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from backfill.before_images import BeforeImages
from backfill.spark.landing import stage_columns, staging_name
from backfill.tables import quote
from framework.keys import KeySpec

XID = "CAST(pg_current_xact_id() AS xid)"


@dataclass(frozen=True)
class MergeSql:
    job_id: int
    table: str  # quoted, schema-qualified
    keys: KeySpec  # the table's key: every column with its type
    column: str  # unquoted target column
    column_type: str  # its PostgreSQL type
    work_schema: str
    overwrite: bool  # True: keep before-images; False: the job added the column

    @property
    def stage_columns(self) -> list[str]:
        """What Spark computes, in the staging table's order: the key, the
        row version read, the new value; never the old value."""
        return stage_columns(self.keys)

    @property
    def _staged_key(self) -> KeySpec:
        return self.keys.work_key()

    @property
    def stage(self) -> str:
        return quote(staging_name(self.column_type, self.keys))

    @property
    def images(self) -> str:
        return f"{quote(self.work_schema)}.{quote(f'backfill_{self.job_id}_images')}"

    @property
    def batches(self) -> str:
        return f"{quote(self.work_schema)}.{quote(f'backfill_{self.job_id}_batches')}"

    def merge(self, bounded: bool = True) -> str:
        """Apply staged rows still at their read version. In overwrite mode it
        also keeps their before-images and returns the count applied in a row;
        otherwise the statement's rowcount is it. The key range (on ``o`` too:
        PostgreSQL does not carry ranges across the join's equality) lets the
        planner scan only the batch's slice of the index (``bounded`` False:
        the batch ends at END, no upper bound)."""
        t, col, key, staged = self.table, quote(self.column), self.keys, self._staged_key
        where = (f"{key.in_range('t', bounded=bounded)} AND {key.expr('t')} = {staged.expr('s')} "
                 "AND t.xmin = s.ver")
        if not self.overwrite:
            return f"UPDATE {t} t SET {col} = s.new FROM {self.stage} s WHERE {where}"
        # RETURNING shows only the new value, so ``o`` joins the target again
        # by key to give the old one. ``o`` is read in the statement's snapshot,
        # like ``t``: for a row updated here both are the one version visible
        # to it, the one whose xmin = s.ver. If a concurrent writer changed the
        # row after that snapshot, READ COMMITTED waits for it and re-checks
        # the row's newest version (EvalPlanQual) against the same s and o
        # rows; that version's xmin is the writer's, never s.ver (Spark read a
        # committed version, and a committed transaction writes no more), so
        # the row is skipped, found by ``changed`` and recomputed, and no image
        # is taken from a version this statement did not overwrite. (PostgreSQL
        # 18's self-join elimination never removes the result relation, so
        # ``o`` stays a read of the old version.)
        returned = ", ".join(f"{name} AS {kept}" for name, kept in
                             zip(key.names("t"), self.kept.key_columns, strict=True))
        return (f"WITH applied AS (UPDATE {t} t SET {col} = s.new FROM {self.stage} s, {t} o "
                f"WHERE {where} AND {key.expr('o')} = {key.expr('t')} "
                f"AND {key.in_range('o', bounded=bounded)} "
                f"RETURNING {returned}, o.{col} AS old), "
                f"img AS ({self.kept.keep('applied')}) "
                f"SELECT count(*) FROM applied")

    def changed(self) -> str:
        """Staged keys this transaction did not write: changed or deleted since
        the read, as stored keys (``KeySpec.read``)."""
        key, staged = self.keys, self._staged_key
        return (f"SELECT {staged.read('s')} FROM {self.stage} s "
                f"LEFT JOIN {self.table} t ON {key.expr('t')} = {staged.expr('s')} "
                f"WHERE t.xmin IS DISTINCT FROM {XID} ORDER BY {staged.order_by('s')}")

    def clear_stage(self) -> str:
        return f"DELETE FROM {self.stage}"

    def lock(self) -> str:
        """Lock the rows still changing under us, in key order (no deadlock among
        reorg workers); a concurrent writer now waits for this batch to commit.
        Binds ``keys`` (``KeySpec.bind_all``)."""
        key = self.keys
        return (f"SELECT 1 FROM {self.table} WHERE {key.among('keys')} "
                f"ORDER BY {key.order_by()} FOR UPDATE")

    @property
    def kept(self) -> BeforeImages:
        return BeforeImages(self.images, self.batches, self.keys)

    def record_batch(self) -> str:
        return self.kept.record_batch()

    # --- schema steps (prepare / advance / rollback) -------------------------

    def create_images(self) -> list[str]:
        return self.kept.create(self.column_type)

    def drop_images(self) -> list[str]:
        return self.kept.drop()

    def restore_range(self, bounded: bool = True) -> list[str]:
        """``restore`` for one batch ``[:lo, :hi)`` of a revert subtask."""
        return self.kept.restore_range(f"{self.table} t", "t", self.column, bounded=bounded)
