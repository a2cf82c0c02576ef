"""The SQL of a ranged UPDATE batch (``sql-update``, ``add-column``) and of
its rollback (DESIGN 3, 8, 9), shared by the job types that set a column
from a PostgreSQL expression range by range.

One function builds the batch's statement, for the batch and for submit's
EXPLAIN of it: the user's ``--set`` and ``--where`` sit in the same place,
with the same parentheses, in both. The target carries its own name as an
alias, so the statement reads the same whether it names the user's table or
submit's temporary clone of it. Before-images: ``backfill.before_images``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.before_images import BeforeImages
from backfill.expressions import embed
from backfill.tables import TableInfo, explain_or_fail, quote
from framework.keys import KeySpec

_LAST_IDENT = re.compile(r'("(?:[^"]|"")*")$')

# Submit's stand-ins for the table and the job's work tables (temporary,
# dropped with the validation savepoint).
_CLONE, _CLONE_IMAGES, _CLONE_BATCHES = (
    "pg_temp.reorg_check_target", "pg_temp.reorg_check_images", "pg_temp.reorg_check_batches")


def alias_of(qualified: str) -> str:
    """The relation part of a quoted ``"schema"."table"``, quoted."""
    match = _LAST_IDENT.search(qualified)
    assert match, qualified
    return match.group(1)


@dataclass(frozen=True)
class UpdateSql:
    table: str  # quoted, schema-qualified (or submit's temporary clone)
    alias: str  # quoted name of the user's table
    key: KeySpec
    column: str  # unquoted target column
    expr: str  # checked by expressions.one_expression
    where: str | None  # likewise
    images: str | None  # quoted; None: the job added the column, nothing to keep
    batches: str | None = None
    # False for a range that ends at END (framework.keys): no upper bound.
    bounded: bool = True
    # True: the statement finds the batch's upper bound itself, the first
    # ``:n`` keys from ``:lo`` below ``:end`` (a single integer key only), and
    # returns it (``hi``) with the keys it holds (``scanned``): no key scan
    # of its own per batch (``backfill.batch_bounds``).
    scanning: bool = False
    # Overwrite mode: the statement writes only if every matching row's old
    # value is NULL, which needs no image (``_null_old_values``); else it
    # writes nothing and ``update`` with ``skip_written`` does the batch.
    only_null_old: bool = False
    # ``only_null_old`` without the probe, on fixed bounds of a single unique
    # integer key: the bare UPDATE of the rows whose old value is NULL. The
    # range holds at most ``hi - lo`` rows whatever commits meanwhile, so a
    # batch that wrote that many is done (``backfill.update_batch``); else
    # ``skip_written`` does the rest. One read of the range, not two.
    without_probe: bool = False
    # Overwrite mode: leave out rows this transaction already wrote (those of
    # an ``only_null_old`` statement before it in the batch).
    skip_written: bool = False

    def update(self) -> str:
        """The batch: set the column on the range's rows matching ``where``.
        Binds ``lo`` and ``hi`` (``scanning``: ``lo``, ``end`` and ``n``, and
        returns ``hi`` and ``scanned``). In overwrite mode it keeps
        before-images and returns the rows it saw (``seen``), the rows it
        wrote (``written``) and the old values it kept (``kept``); fewer
        written means some changed under it, and ``update_locked`` does
        those. A plain update on fixed bounds is the bare UPDATE."""
        t, a, col = self.table, self.alias, quote(self.column)
        ctes = [self._bound_ctes()] if self.scanning else []
        returned = ["hi", "scanned"] if self.scanning else []
        if self.images is None:
            plain = self._plain_update(self._matching())
            if not self.scanning:
                return plain  # its rows are the command tag's count
            # Not referenced, still run to completion (PostgreSQL runs every
            # data-modifying CTE); no RETURNING, nothing to hold.
            ctes.append(f"reorg_written AS ({plain})")
        elif self.without_probe:
            assert self.only_null_old and not self.scanning, "on fixed bounds only"
            # Its rows are the command tag's count (``written``).
            return self._plain_update(f"{self._matching()} AND num_nulls({a}.{col}) = 1")
        elif self.only_null_old:
            ctes += self._null_old_values()
            returned += ["(SELECT seen FROM reorg_probe) AS seen",
                         "(SELECT count(*) FROM reorg_written) AS written",
                         "(SELECT kept FROM reorg_probe) AS kept"]
        else:
            # No row locks: the old values are read in the statement's
            # snapshot, and the update joins them by ctid, so it writes only
            # the very version it took the image of (DESIGN 8, 9). A row an
            # application changed after that snapshot has a new version at
            # another ctid: READ COMMITTED re-checks that version
            # (EvalPlanQual) against the same image row, the ctid differs,
            # and the row is skipped, so no value is computed from, nor an
            # image taken of, a version this statement did not overwrite.
            # (The old version cannot be vacuumed and its slot reused while
            # this snapshot is open.) Locking every row first (FOR UPDATE)
            # cost 1.66x a plain ranged UPDATE (docs/benchmarks.md): each
            # lock is a write of its own.
            ctes += [
                f"""reorg_read AS (
                SELECT {self._read_keys()}, {a}.{col} AS reorg_old, {a}.ctid AS reorg_tid
                FROM {t} AS {a} WHERE {self._matching()}{self._unwritten()})""",
                f"""reorg_updated AS (
                UPDATE {t} AS {a} SET {col} = {embed(self.expr)} FROM reorg_read
                WHERE {a}.ctid = reorg_read.reorg_tid AND {self._in_range()}
                RETURNING {self._kept_keys("reorg_read")}, reorg_read.reorg_old AS old)""",
                f"reorg_kept AS ({self.kept.keep('reorg_updated')})",
                """reorg_seen AS (
                SELECT count(*) AS seen, count(*) FILTER (WHERE num_nulls(reorg_old) = 0) AS kept
                FROM reorg_read)"""]
            returned += ["(SELECT seen FROM reorg_seen) AS seen",
                         "(SELECT count(*) FROM reorg_updated) AS written",
                         "(SELECT kept FROM reorg_seen) AS kept"]
        source = " FROM reorg_bound" if self.scanning else ""
        joined = ",\n            ".join(ctes)
        return f"WITH {joined}\n            SELECT {', '.join(returned)}{source}"

    def _null_old_values(self) -> list[str]:
        """``only_null_old``: the bare UPDATE, guarded. ``reorg_probe`` counts
        the matching rows and those with an old value in the statement's
        snapshot; the UPDATE runs only when none has one (a one-time filter:
        otherwise it reads no row), and then every row it writes had NULL in
        the very version it overwrote: a row an application gave a value
        after the snapshot fails ``num_nulls(...) = 1`` on the re-check of
        its new version (EvalPlanQual) and is skipped, so ``written`` <
        ``seen`` and the image statement does it (``skip_written``). A NULL
        old value needs no image: the batch's record (range and xid) puts
        NULL back (``BeforeImages.restore_range``). ``without_probe`` keeps
        the re-check and drops the probe's second read of the range
        (docs/benchmarks.md, "100M rows")."""
        t, a, col = self.table, self.alias, quote(self.column)
        return [
            f"""reorg_probe AS (
                SELECT count(*) AS seen, count(*) FILTER (WHERE num_nulls({a}.{col}) = 0) AS kept
                FROM {t} AS {a} WHERE {self._matching()})""",
            f"""reorg_written AS (
                UPDATE {t} AS {a} SET {col} = {embed(self.expr)}
                WHERE (SELECT kept FROM reorg_probe) = 0 AND {self._matching()}
                AND num_nulls({a}.{col}) = 1
                RETURNING 1)"""]

    def _unwritten(self) -> str:
        if not self.skip_written:
            return ""
        return f"\n                AND NOT {self.alias}.xmin = CAST(pg_current_xact_id() AS xid)"

    def update_locked(self) -> str:
        """Overwrite mode, after ``update`` wrote fewer rows than it saw: the
        range's matching rows this transaction has not written yet (a row it
        wrote carries its xid as ``xmin``), locked first and their old values
        read from the locked versions; the update then computes from those
        same versions (DESIGN 9). Rare: only rows an application changed
        while the batch ran. Binds ``lo`` and ``hi``."""
        t, a, col = self.table, self.alias, quote(self.column)
        read = self.key.renamed("reorg_k")
        # The range on the update's side too: without it PostgreSQL merge-joins
        # from the index's first key, so a batch's cost grows with its key.
        return f"""
            WITH reorg_locked AS (
                SELECT {self._read_keys()}, {a}.{col} AS reorg_old FROM {t} AS {a}
                WHERE {self._matching()}
                AND NOT {a}.xmin = CAST(pg_current_xact_id() AS xid)
                FOR UPDATE OF {a}),
            reorg_updated AS (
                UPDATE {t} AS {a} SET {col} = {embed(self.expr)} FROM reorg_locked
                WHERE {self.key.expr(a)} = {read.expr("reorg_locked")} AND {self._in_range()}
                RETURNING {self._kept_keys("reorg_locked")}, reorg_locked.reorg_old AS old)
            {self.kept.keep("reorg_updated")}"""

    def _in_range(self) -> str:
        if self.scanning:
            # The bound as an InitPlan parameter: an index range scan still,
            # and [:lo, :end) keeps the planner's row estimate to the range.
            k = self.key.expr(self.alias)
            return (f"{k} >= :lo AND {k} < :end AND {k} < (SELECT hi FROM reorg_bound)")
        return self.key.in_range(self.alias, bounded=self.bounded)

    def _bound_ctes(self) -> str:
        """``reorg_bound``: one row, the batch's upper bound ``hi`` (``:end``
        when fewer than ``:n`` keys are left) and the keys below it
        (``scanned``), read in the statement's snapshot from the key index."""
        assert self.key.arithmetic, "the bound found in the statement is the last key + 1"
        k = self.key.expr(self.alias)
        t, a = self.table, self.alias
        return f"""reorg_keys AS (
                SELECT {k} AS k FROM {t} AS {a} WHERE {k} >= :lo AND {k} < :end
                ORDER BY {k} LIMIT :n),
            reorg_bound AS (
                SELECT count(*) AS scanned,
                       CASE WHEN count(*) < :n THEN CAST(:end AS bigint)
                            ELSE max(k) + 1 END AS hi
                FROM reorg_keys)"""

    def _matching(self, in_range: str | None = None) -> str:
        return f"{in_range or self._in_range()} AND {embed(self.where or 'TRUE')}"

    def _plain_update(self, matching: str) -> str:
        return (f"UPDATE {self.table} AS {self.alias} SET {quote(self.column)} = "
                f"{embed(self.expr)} WHERE {matching}")

    def _read_keys(self) -> str:
        """The key's columns read as ``reorg_k0``, ``reorg_k1``, ..."""
        return ", ".join(f"{name} AS reorg_k{i}"
                         for i, name in enumerate(self.key.names(self.alias)))

    def _kept_keys(self, cte: str) -> str:
        """``_read_keys`` of ``cte`` named as the images name them."""
        return ", ".join(f"{cte}.reorg_k{i} AS {name}"
                         for i, name in enumerate(self.kept.key_columns))

    @property
    def kept(self) -> BeforeImages:
        assert self.images is not None and self.batches is not None
        return BeforeImages(self.images, self.batches, self.key)

    def record_batch(self) -> str:
        return self.kept.record_batch()

    def create_images(self, column_type: str, *, temporary: bool = False) -> list[str]:
        return self.kept.create(column_type, temporary=temporary)

    def drop_images(self) -> list[str]:
        return self.kept.drop()


    def restore_range(self) -> list[str]:
        """``restore`` for one batch ``[:lo, :hi)`` of a revert subtask."""
        return self.kept.restore_range(f"{self.table} AS {self.alias}", self.alias,
                                       self.column, bounded=self.bounded)


def check_update_statement(conn: Connection, table: TableInfo, column: str, expr: str,
                           where: str | None, type_: str, *, adding: bool,
                           option: str = "--set") -> None:
    """EXPLAIN the batch's statement on a clone of the table (LIKE takes ACCESS
    SHARE only), with the column added when the job will add it. The predicate
    first, with the column set to itself, so an error names the right option
    (``option``: the one that gave ``expr``)."""
    like = "INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY"
    probe = UpdateSql(_CLONE, alias_of(table.qualified), table.key_spec, column, expr, where,
                      None if adding else _CLONE_IMAGES, None if adding else _CLONE_BATCHES)
    with conn.begin_nested() as savepoint:
        conn.execute(text(f"CREATE TEMP TABLE {_CLONE} (LIKE {table.qualified} {like}) "
                          "ON COMMIT DROP"))
        if adding:
            conn.execute(text(f"ALTER TABLE {_CLONE} ADD COLUMN {quote(column)} {type_}"))
        else:
            for stmt in probe.create_images(type_, temporary=True):
                conn.execute(text(stmt))
        if where:
            _explain(conn, UpdateSql(**{**probe.__dict__, "expr": quote(column)}), "--where",
                     where, table.display)
        shown = f"{column}={expr}" if option == "--set" else expr
        _explain(conn, probe, option, shown, table.display)
        savepoint.rollback()


def _explain(conn: Connection, sql: UpdateSql, option: str, shown: str, display: str) -> None:
    statements = [sql.update()] if sql.images is None else [
        sql.update(), replace(sql, only_null_old=True).update(), sql.update_locked()]
    for statement in statements:
        # NULL bounds: planned, never evaluated against a key's type.
        explain_or_fail(conn, statement, {"lo": None, "hi": None},
                        f"{option} {shown!r} does not work on {display}")
