"""The DDL of an ``add-column`` job, state by state, built in one place for
the owner's steps and for ``--dry-run``.

The trigger computes the value on the row being written: ``(SELECT (NEW).*)``
aliased as the table gives EXPR the row's columns under the names (and the
table name) it was written with, so the same EXPR serves the backfill's
UPDATE and the trigger. An INSERT gets EXPR unless it gives the column a
value itself; an UPDATE gets EXPR recomputed whatever columns it touches
(``BEFORE ... UPDATE`` with no column list: an UPDATE of a column EXPR reads
must refresh the value, and one of no such column recomputes the same
value), unless it sets the column itself: an application write wins over
the job's (DESIGN 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backfill.expressions import embed
from backfill.ranged_update import alias_of
from backfill.tables import quote

# The dollar quote of the trigger function's body; submit refuses a --value
# that contains it, so the body cannot be closed early.
BODY_QUOTE = "$reorg_body$"


@dataclass(frozen=True)
class AddColumnDdl:
    table: str  # quoted, schema-qualified
    job_id: int
    params: dict[str, Any]

    @property
    def column(self) -> str:
        return quote(self.params["column"])

    @property
    def function(self) -> str:
        return f"{quote(self.params['work_schema'])}.{quote(f'add_column_{self.job_id}')}"

    @property
    def trigger(self) -> str:
        return quote(f"reorg_add_column_{self.job_id}")

    @property
    def constraint(self) -> str:
        return quote(f"reorg_{self.job_id}_{self.params['column']}_not_null"[:63])

    def prepare(self) -> list[str]:
        """write-only: the column (nullable, no default: no rewrite) and the
        trigger, in one transaction, so no write falls between them."""
        col, expr = self.column, embed(self.params["expr"])
        return [
            f"ALTER TABLE {self.table} ADD COLUMN {col} {self.params['column_type']}",
            # The search_path of the job's sessions, not of whichever application
            # session fires it: EXPR names the same functions in both.
            f"""CREATE FUNCTION {self.function}() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS {BODY_QUOTE}
BEGIN
  IF (TG_OP = 'INSERT' AND NEW.{col} IS NULL)
     OR (TG_OP = 'UPDATE' AND NEW.{col} IS NOT DISTINCT FROM OLD.{col}) THEN
    NEW.{col} := (SELECT {expr} FROM (SELECT (NEW).*) AS {alias_of(self.table)});
  END IF;
  RETURN NEW;
END {BODY_QUOTE}""",
            f"CREATE TRIGGER {self.trigger} BEFORE INSERT OR UPDATE ON {self.table} "
            f"FOR EACH ROW EXECUTE FUNCTION {self.function}()",
        ]

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
        return stmts + self.drop_trigger()

    def drop_trigger(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {self.trigger} ON {self.table}",
                f"DROP FUNCTION IF EXISTS {self.function}()"]

    def rollback(self) -> list[str]:
        """From any state: the column goes, and its check with it."""
        return [*self.drop_trigger(),
                f"ALTER TABLE IF EXISTS {self.table} DROP COLUMN IF EXISTS {self.column}"]
