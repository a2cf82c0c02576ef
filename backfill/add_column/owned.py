"""The keys whose new column the application wrote (DESIGN 9, 14): from
prepare on the column is the application's to write, and what it writes
there stays, whatever the job's trigger or backfill would compute.

One row per owned key in a work table of the job (``add_column_<id>_owned``
in reorg's schema, keyed like before-images: ``k`` for one integer key, else
``k0``, ``k1``, ... of the key's types), with whether the application's
value is NULL. The job's triggers (``ddl``) keep it exact: a row is owned
once an INSERT gives the column a non-NULL value or an UPDATE changes it or
names it in its SET list; a key update carries the ownership to the new key;
a DELETE ends it. An INSERT that gives NULL counts as not giving the column
(a row trigger cannot tell an explicit NULL from an omitted column): the row
gets ``--value``.

The backfill fills only rows whose column IS NULL. That test is on the row
itself, so PostgreSQL re-checks it on the newest version of a row updated
while the batch ran (EvalPlanQual) and skips a value the application wrote
meanwhile; a test of this table in the batch's statement would read the
statement's older snapshot. What it cannot see is an explicit NULL: a row
the application set to NULL (owned, NULL) is filled like any other. So
after its UPDATE the batch sets back to NULL, in a statement of its own (a
new snapshot), the rows of its range owned with NULL that now hold a value:
only the batch can have written them, since it holds their row locks until
it commits. One index probe of this small table per batch.

The table is written by the triggers on behalf of any role that writes the
user's table: the functions that touch it are SECURITY DEFINER, owned by
reorg's role, with a fixed search_path, and run no SQL of the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

from backfill.tables import quote
from framework.keys import KeySpec


@dataclass(frozen=True)
class OwnedKeys:
    table: str  # quoted, schema-qualified
    key: KeySpec  # the user's table's

    @property
    def columns(self) -> list[str]:
        """The table's key columns (``KeySpec.work_key``)."""
        return list(self.own_key.columns)

    @property
    def own_key(self) -> KeySpec:
        return self.key.work_key()

    def create(self) -> list[str]:
        keys = ", ".join(f"{c} {t} NOT NULL"
                         for c, t in zip(self.columns, self.key.types, strict=True))
        return [f"CREATE TABLE {self.table} ({keys}, is_null boolean NOT NULL, "
                f"PRIMARY KEY ({', '.join(self.columns)}))"]

    def drop(self) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self.table}"]

    def book_body(self, column: str) -> str:
        """The body of the trigger function that books ownership (``column``
        quoted), for every trigger of ``ddl`` that calls it: an INSERT giving
        the column, an UPDATE naming it (argument ``written``) or changing it
        or the key (a row's ownership moves with its key), a DELETE."""
        own, old, new = self.own_key.expr(), self.key.expr("OLD"), self.key.expr("NEW")
        values = ", ".join(self.key.names("NEW"))
        return f"""
DECLARE
  reorg_null boolean;
BEGIN
  IF TG_OP = 'DELETE' THEN
    DELETE FROM {self.table} WHERE {own} = {old};
    RETURN OLD;
  END IF;
  IF TG_OP = 'INSERT' THEN
    reorg_null := NEW.{column} IS NULL;
  ELSE
    IF {old} IS DISTINCT FROM {new} THEN
      DELETE FROM {self.table} WHERE {own} = {old} RETURNING is_null INTO reorg_null;
    END IF;
    IF TG_ARGV[0] = 'written' OR NEW.{column} IS DISTINCT FROM OLD.{column} THEN
      reorg_null := NEW.{column} IS NULL;
    END IF;
  END IF;
  IF reorg_null IS NOT NULL THEN
    INSERT INTO {self.table} AS reorg_o ({', '.join(self.columns)}, is_null)
    VALUES ({values}, reorg_null)
    ON CONFLICT ({', '.join(self.columns)}) DO UPDATE SET is_null = EXCLUDED.is_null
    WHERE reorg_o.is_null IS DISTINCT FROM EXCLUDED.is_null;
  END IF;
  RETURN NEW;
END"""

    def owned_body(self) -> str:
        """The body of ``owned(key...)``, a SQL function of the key's columns."""
        args = [f"${i + 1}" for i in range(len(self.columns))]
        given = args[0] if len(args) == 1 else f"({', '.join(args)})"
        return f"SELECT EXISTS (SELECT 1 FROM {self.table} WHERE {self.own_key.expr()} = {given})"

    def parameters(self) -> str:
        """``owned``'s parameter types."""
        return ", ".join(self.key.types)

    def fix_up(self, target: str, alias: str, column: str, *, bounded: bool) -> str:
        """Set back to NULL the rows of the batch ``[:lo, :hi)`` the
        application owns with NULL that hold a value (only the batch's write
        can have given them one). Binds ``lo`` and ``hi``."""
        col = quote(column)
        return (f"UPDATE {target} AS {alias} SET {col} = NULL FROM {self.table} AS reorg_o "
                f"WHERE reorg_o.is_null AND {self.own_key.in_range('reorg_o', bounded=bounded)} "
                f"AND {self.key.expr(alias)} = {self.own_key.expr('reorg_o')} "
                f"AND {alias}.{col} IS NOT NULL")
