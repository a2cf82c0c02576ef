"""The DDL of an ``add-column`` job, state by state, built in one place for
the owner's steps and for ``--dry-run``.

The column is the application's to write from prepare on, and a value it
writes there stays (DESIGN 9, 14; ``owned``: which rows it wrote). The
job's triggers, named to fire after every trigger of the user's
(``backfill.schema.user_triggers``) and in this order among themselves:

- ``1_written`` (BEFORE UPDATE OF the column): the UPDATE names the column,
  even with the value it had: the row is the application's from now on;
- ``2_changed`` (BEFORE UPDATE, when the column or the key changes),
  ``2_given`` (BEFORE INSERT of a non-NULL value), ``2_deleted`` (BEFORE
  DELETE): the rest of the ownership's bookkeeping;
- ``3_fill`` (BEFORE UPDATE that leaves the column as it was, of a row the
  application does not own) and ``3_fill_new`` (BEFORE INSERT of NULL):
  the column gets EXPR computed on the row being written.

EXPR is evaluated as ``(SELECT EXPR FROM (SELECT (NEW).*) AS t)``, aliased
as the table, so it sees the row's columns under the names (and the table
name) it was written with: the same EXPR serves the backfill's UPDATE and
the trigger. Every trigger skips the job's own statements (the batch sets
``reorg.job`` to the job's id for its transaction, ``skip_own_triggers``),
and only them: another job's writes are the application's to this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backfill.add_column.owned import OwnedKeys
from backfill.expressions import embed
from backfill.ranged_update import alias_of
from backfill.schema.user_triggers import PREFIX
from backfill.tables import quote
from framework.keys import KeySpec

# The dollar quote of the trigger function's body; submit refuses a --value
# that contains it, so the body cannot be closed early.
BODY_QUOTE = "$reorg_body$"
# The setting a batch's transaction sets to its job's id: its triggers skip it.
JOB_SETTING = "reorg.job"


@dataclass(frozen=True)
class AddColumnDdl:
    table: str  # quoted, schema-qualified
    job_id: int
    params: dict[str, Any]
    key: KeySpec

    @property
    def column(self) -> str:
        return quote(self.params["column"])

    def _work(self, name: str) -> str:
        return f"{quote(self.params['work_schema'])}.{quote(f'add_column_{self.job_id}{name}')}"

    @property
    def function(self) -> str:
        """The trigger function that fills the column (EXPR: runs as whoever writes)."""
        return self._work("")

    @property
    def book_function(self) -> str:
        """The trigger function that books ownership (reorg's role: SECURITY DEFINER)."""
        return self._work("_book")

    @property
    def owned_function(self) -> str:
        """``owned(key...)``: whether the application owns the row of that key."""
        return self._work("_owns")

    @property
    def owned(self) -> OwnedKeys:
        return OwnedKeys(self._work("_owned"), self.key)

    def trigger(self, role: str) -> str:
        return quote(f"{PREFIX}{self.job_id}_add_column_{role}")

    @property
    def triggers(self) -> list[str]:
        """Every trigger of the job, and the one of versions before these
        (``reorg_add_column_<id>``: a job in flight across an upgrade)."""
        return [*(self.trigger(role) for role in _TRIGGERS), quote(f"reorg_add_column_{self.job_id}")]

    @property
    def constraint(self) -> str:
        return quote(f"reorg_{self.job_id}_{self.params['column']}_not_null"[:63])

    def prepare(self) -> list[str]:
        """write-only: the column (nullable, no default: no rewrite), the
        ownership table and the triggers, in one transaction, so no write
        falls between them."""
        col, expr, owned = self.column, embed(self.params["expr"]), self.owned
        # reorg's own functions: nothing of the user's on their search_path.
        own = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
        return [
            f"ALTER TABLE {self.table} ADD COLUMN {col} {self.params['column_type']}",
            *owned.create(),
            # The search_path of the job's sessions, not of whichever application
            # session fires it: EXPR names the same functions in both.
            f"""CREATE FUNCTION {self.function}() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS {BODY_QUOTE}
BEGIN
  NEW.{col} := (SELECT {expr} FROM (SELECT (NEW).*) AS {alias_of(self.table)});
  RETURN NEW;
END {BODY_QUOTE}""",
            f"CREATE FUNCTION {self.book_function}() RETURNS trigger LANGUAGE plpgsql {own} "
            f"AS {BODY_QUOTE}{owned.book_body(col)} {BODY_QUOTE}",
            # Nobody else may attach it to a table of theirs and write the job's bookings.
            f"REVOKE EXECUTE ON FUNCTION {self.book_function}() FROM PUBLIC",
            # VOLATILE: it sees what the triggers before it booked in the same statement.
            f"CREATE FUNCTION {self.owned_function}({owned.parameters()}) RETURNS boolean "
            f"LANGUAGE sql VOLATILE {own} AS {BODY_QUOTE}{owned.owned_body()}{BODY_QUOTE}",
            # Called in a trigger's WHEN, as whoever writes the table.
            f"GRANT EXECUTE ON FUNCTION {self.owned_function}({owned.parameters()}) TO PUBLIC",
            *(self._create_trigger(role) for role in _TRIGGERS),
        ]

    def _create_trigger(self, role: str) -> str:
        event, when = _TRIGGERS[role]
        col, old, new = self.column, self.key.expr("OLD"), self.key.expr("NEW")
        condition = when.format(col=col, old=old, new=new, owned=self.owned_function,
                                new_args=", ".join(self.key.names("NEW")))
        skip_own = f"current_setting('{JOB_SETTING}', true) IS DISTINCT FROM '{self.job_id}'"
        call = (f"{self.book_function}('written')" if role == "1_written" else
                f"{self.book_function}()" if role.startswith("2_") else f"{self.function}()")
        return (f"CREATE TRIGGER {self.trigger(role)} {event.format(col=col)} ON {self.table} "
                f"FOR EACH ROW WHEN ({skip_own}{f' AND {condition}' if condition else ''}) "
                f"EXECUTE FUNCTION {call}")

    def add_check(self) -> list[str]:
        """Entering the not-null step: enforced on new writes, not yet checked."""
        if not self.params["not_null"]:
            return []
        return [f"ALTER TABLE {self.table} ADD CONSTRAINT {self.constraint} "
                f"CHECK ({self.column} IS NOT NULL) NOT VALID"]

    def validate_check(self) -> str:
        """The scan, on a worker; it takes SHARE UPDATE EXCLUSIVE: writes go on."""
        return f"ALTER TABLE {self.table} VALIDATE CONSTRAINT {self.constraint}"

    def lock(self) -> str:
        """The cut-over's lock, taken first so that what it checks (no child
        table) holds until it commits: the lock its own DDL needs, which also
        keeps out CREATE TABLE ... INHERITS (SHARE UPDATE EXCLUSIVE)."""
        mode = ("ACCESS EXCLUSIVE" if self.params.get("default") or self.params["not_null"]
                else "SHARE ROW EXCLUSIVE")
        return f"LOCK TABLE {self.table} IN {mode} MODE"

    def cut_over(self) -> list[str]:
        """public, one transaction. SET NOT NULL is a statement of its own,
        before the check is dropped: it finds the valid check and skips its
        scan (PostgreSQL 12+); in one ALTER with the DROP it would scan."""
        stmts = []
        if self.params.get("default"):
            stmts.append(f"ALTER TABLE {self.table} ALTER COLUMN {self.column} "
                         f"SET DEFAULT {embed(self.params['default'])}")
        if self.params["not_null"]:
            stmts.append(f"ALTER TABLE {self.table} ALTER COLUMN {self.column} SET NOT NULL")
            stmts.append(f"ALTER TABLE {self.table} DROP CONSTRAINT {self.constraint}")
        return stmts + self.drop_triggers() + self.drop_work()

    def drop_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {trigger} ON {self.table}" for trigger in self.triggers]

    def drop_work(self) -> list[str]:
        """The job's functions and its ownership table, in reorg's schema."""
        return [f"DROP FUNCTION IF EXISTS {self.function}()",
                f"DROP FUNCTION IF EXISTS {self.book_function}()",
                f"DROP FUNCTION IF EXISTS {self.owned_function}",
                *self.owned.drop()]

    def rollback(self) -> list[str]:
        """From any state: the column goes, and its check with it."""
        return [*self.drop_triggers(), *self.drop_work(),
                f"ALTER TABLE IF EXISTS {self.table} DROP COLUMN IF EXISTS {self.column}"]


# role -> (the trigger's timing and events, its WHEN beyond skipping the
# job's own statements). Triggers 1_ and 2_ book ownership, 3_ fill.
_TRIGGERS = {
    "1_written": ("BEFORE UPDATE OF {col}", ""),
    "2_changed": ("BEFORE UPDATE",
                  "(NEW.{col} IS DISTINCT FROM OLD.{col} OR {new} IS DISTINCT FROM {old})"),
    "2_given": ("BEFORE INSERT", "NEW.{col} IS NOT NULL"),
    "2_deleted": ("BEFORE DELETE", ""),
    "3_fill": ("BEFORE UPDATE",
               "NEW.{col} IS NOT DISTINCT FROM OLD.{col} AND NOT {owned}({new_args})"),
    "3_fill_new": ("BEFORE INSERT", "NEW.{col} IS NULL"),
}
