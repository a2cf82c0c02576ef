"""The table's own triggers, as a schema change meets them (DESIGN 14).

Order. PostgreSQL fires a table's BEFORE ROW triggers in the byte order of
their names, each on the row as the ones before it left it. A schema
change's triggers compute what reaches the new column from the row being
written, so they must fire after every trigger of the user's: their names
start with ``PREFIX`` (``~`` sorts after every ASCII letter, digit and
punctuation mark). A user BEFORE ROW trigger whose name
sorts after that prefix (a name starting with ``~`` and a later character,
or with a non-ASCII letter) is refused: at submit, in prepare, and at the
cut-over, since one may be created or renamed during the job.

Triggers an UPDATE fires. A backfill is an UPDATE of every row of the
table, batch by batch, so it fires the table's own UPDATE triggers: a row
trigger on each row (an ``updated_at`` stamp changes on every row, an audit
trigger logs every row as changed), a statement trigger on each batch,
where a plain ``ALTER TABLE`` fires none. A table with such triggers is
refused at submit and in prepare unless the user accepts that
(``--allow-user-triggers``, the ``allow_user_triggers`` param). Triggers
that cannot fire on the job's UPDATE are not refused: disabled ones, those
for replicas only, and those ``UPDATE OF`` named columns (the job's column
is new).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework.errors import InvalidParams

PREFIX = "~reorg_"
# reorg's own triggers: the prefix, and the names of jobs prepared by
# versions before it (in flight across an upgrade).
_OURS = r"^(~reorg_|reorg_add_column_[0-9]+$|reorg_[0-9]+_alter_type$)"
ALLOW = "allow_user_triggers"

# pg_trigger.tgtype bits
_ROW, _BEFORE, _INSERT, _DELETE, _UPDATE = 1, 2, 4, 8, 16

# pg_trigger rows of the user's triggers on table :t that fire in an
# ordinary session (tgenabled 'D': disabled, 'R': for replicas only).
_USERS = f"""
    tgrelid = to_regclass(:t) AND NOT tgisinternal AND tgname !~ '{_OURS}'
    AND tgenabled IN ('O', 'A')
"""


class FiresAfterReorg(RuntimeError):
    """At the cut-over: a user BEFORE trigger now fires after the job's."""


def allowed(params: dict[str, Any]) -> bool:
    """The ``allow_user_triggers`` param, checked: True, False or absent."""
    value = params.get(ALLOW, False)
    if not isinstance(value, bool):
        raise InvalidParams(f"{ALLOW} must be true or false, got {value!r}; "
                            "give --allow-user-triggers or leave it out")
    return value


def check(conn: Connection, table: str, display: str, params: dict[str, Any]) -> None:
    """Submit's and prepare's checks: no user BEFORE trigger fires after the
    job's, and no user row trigger fires on the backfill unless accepted."""
    late = later_before_triggers(conn, table)
    if late:
        raise InvalidParams(f"{_named(late, display)} {_fires_after_ours(late)}: rename "
                            f"{'them' if len(late) > 1 else 'it'} to sort before '{PREFIX}' "
                            "(ALTER TRIGGER ... RENAME TO), or drop it, and submit again")
    if allowed(params):
        return
    fired = update_triggers(conn, table)
    if fired:
        rows = [name for name, per_row in fired if per_row]
        statements = [name for name, per_row in fired if not per_row]
        kind = ("row trigger" if not statements else "statement trigger" if not rows
                else "trigger")
        names = rows + [f"{name} (for each statement)" if rows else name for name in statements]
        example = f"ALTER TABLE {display} DISABLE TRIGGER {fired[0][0]}"
        raise InvalidParams(
            f"{display} has {kind}{'s' if len(fired) > 1 else ''} an UPDATE fires: "
            f"{', '.join(names)}; the job's backfill updates every row, so "
            f"{'they' if len(fired) > 1 else 'it'} would fire on each "
            f"{'row' if rows else 'batch'}{' or batch' if rows and statements else ''} "
            "(a plain ALTER TABLE fires none): give --allow-user-triggers to accept "
            f"that, or disable them while the job runs ({example}; the application's writes "
            "skip them too meanwhile) and enable them after")


def check_still_last(conn: Connection, table: str, display: str) -> None:
    """The cut-over's check (under its lock): the job's triggers fired after
    every user BEFORE trigger all along, or the values it kept may miss what
    such a trigger set. Raises FiresAfterReorg: the job fails and rolls back."""
    late = later_before_triggers(conn, table)
    if late:
        raise FiresAfterReorg(
            f"the cut-over found {_named(late, display)} (made, renamed or enabled during the "
            f"job) that "
            f"{_fires_after_ours(late)}: the new column may miss what it set, so the job is "
            f"rolled back; rename it to sort before '{PREFIX}', or drop it, and submit again")


def later_before_triggers(conn: Connection, table: str) -> list[str]:
    """The user's BEFORE ROW triggers that fire after reorg's (DELETE too:
    one that skips a delete after ``add-column``'s booked it would leave the
    row without its ownership)."""
    return list(conn.execute(text(
        f"SELECT tgname FROM pg_trigger WHERE {_USERS} "
        f"AND tgtype & {_ROW} <> 0 AND tgtype & {_BEFORE} <> 0 "
        f"AND tgtype & {_INSERT | _UPDATE | _DELETE} <> 0 "
        "AND tgname::text COLLATE \"C\" > :prefix COLLATE \"C\" ORDER BY 1"),
        {"t": table, "prefix": PREFIX}).scalars())


def update_triggers(conn: Connection, table: str) -> list[tuple[str, bool]]:
    """The user's triggers (row or statement, BEFORE or AFTER) that an UPDATE
    of a column they do not name fires: (name, for each row), by name."""
    return [(name, per_row) for name, per_row in conn.execute(text(
        f"SELECT tgname, tgtype & {_ROW} <> 0 FROM pg_trigger WHERE {_USERS} "
        f"AND tgtype & {_UPDATE} <> 0 AND cardinality(tgattr::int2[]) = 0 ORDER BY 1"),
        {"t": table})]


def _named(names: list[str], display: str) -> str:
    return f"trigger{'s' if len(names) > 1 else ''} {', '.join(names)} on {display}"


def _fires_after_ours(names: list[str]) -> str:
    verb = "are BEFORE triggers that fire" if len(names) > 1 else "is a BEFORE trigger that fires"
    return (f"{verb} after reorg's own (PostgreSQL fires them in name order; reorg's start "
            f"with '{PREFIX}'), so what reaches the new column would miss what "
            f"{'they set' if len(names) > 1 else 'it sets'}")
