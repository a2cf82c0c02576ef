"""The cut-over of ``alter-type`` (TiDB's public state): in the owner's one
fenced transaction that also marks the job succeeded, under a bounded
``lock_timeout`` (a timeout rolls it all back; the owner tries again later,
the job stays running). Either all of it happened, with the job succeeded,
or none of it: an owner killed in the middle leaves the job running in its
last step, and its heir runs the cut-over again (DESIGN 12).

First, under its lock, it checks again what the submit refuses, and that
every index and constraint on the column has its copy: anything made during
the job that the swap would drop, or recurse into (a child table), fails
the job by name, and its rollback leaves the table as it was (DESIGN 15).

The shadow column takes the old column's place and keeps what it had: name,
NOT NULL (proved by the validated CHECK, so SET NOT NULL does not scan),
default, the sequences it owns (widened to the new integer type, ``plan.
sequence_widenings``), its identity (made again on it with the old
sequence's name, settings and value, ``plan.identity_statements``), its
indexes (built beforehand, in their tablespace, renamed to the old names;
a PRIMARY KEY or UNIQUE constraint attached USING INDEX; statistics
targets, CLUSTER ON and REPLICA IDENTITY set again), its
CHECK and FOREIGN KEY constraints (validated beforehand, renamed), the
comments of all of them, the privileges granted on the column itself, its
statistics target and its attribute options (``n_distinct``). It moves to
the end of ``SELECT *``. Its collation, storage and compression are the new
type's defaults, as with ``ALTER TABLE ... TYPE`` without ``COLLATE``."""

from __future__ import annotations

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from backfill.alter_type import checks, names, plan
from backfill.schema import catalog, trigger, user_triggers
from backfill.schema.catalog import IndexFacts
from backfill.schema.sql import literal, run
from backfill.tables import quote
from framework import faults
from framework.errors import InvalidParams
from framework.records import Job

# Long enough to get in between application transactions, short enough that
# statements queued behind the cut-over's lock wait no longer than this.
CUTOVER_LOCK_TIMEOUT = "2s"


class CutOverBlocked(RuntimeError):
    """Something changed under the job that the cut-over cannot carry over:
    not retryable, so the job fails and its rollback drops what it added."""


def cut_over(conn: Connection, job: Job) -> None:
    p, t = job.params, job.target_table
    column, shadow = quote(p["column"]), quote(p["shadow"])
    run(conn, f"SET LOCAL lock_timeout = '{CUTOVER_LOCK_TIMEOUT}'")
    run(conn, f"LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE")
    user_triggers.check_still_last(conn, t, p["table"])
    old = catalog.column_facts(conn, t, p["column"])
    new = catalog.column_facts(conn, t, p["shadow"])
    if old is None or new is None:
        raise CutOverBlocked(f"column {p['column'] if old is None else p['shadow']} of "
                             f"{p['table']} is gone; the job cannot finish")
    settings = catalog.column_settings(conn, t, old.attnum)
    identity = catalog.identity(conn, t, old.attnum)  # read before the drop takes it
    indexes = catalog.covering_indexes(conn, t, old.attnum)
    constraints = catalog.covering_constraints(conn, t, old.attnum)
    _refuse_what_changed(conn, job, old, new, indexes, constraints)
    for sequence in old.owned_sequences:  # else the drop of the old column drops them
        run(conn, f"ALTER SEQUENCE {sequence} OWNED BY {t}.{shadow}")
    for statement in plan.sequence_widenings(conn, job, old):
        run(conn, statement)
    if old.not_null:
        run(conn, f"ALTER TABLE {t} ALTER COLUMN {shadow} SET NOT NULL")
    trigger.remove(conn, table=t, function=names.function(job), triggers=names.triggers(job))
    run(conn, f"ALTER TABLE {t} DROP COLUMN {column}")
    run(conn, f"ALTER TABLE {t} RENAME COLUMN {shadow} TO {column}")
    faults.hit("alter_type.in_cutover")
    if old.default is not None:
        _set_default(conn, t, column, old.default, p["type"])
    if identity is not None:
        for statement in plan.identity_statements(t, column, identity):
            run(conn, statement)
    _set_settings(conn, t, column, settings)
    for index in indexes:
        if index.valid:
            _take_over_index(conn, t, names.index_for(job, index.name), index)
    if old.not_null_constraint is not None:
        _take_over_not_null(conn, t, p["column"], old)
    for constraint in constraints:
        run(conn, f"ALTER TABLE {t} RENAME CONSTRAINT "
                          f"{quote(names.constraint_for(job, constraint.name))} "
                          f"TO {quote(constraint.name)}")
        _comment(conn, f"CONSTRAINT {quote(constraint.name)} ON {t}", constraint.comment)
    run(conn, f"ALTER TABLE {t} DROP CONSTRAINT IF EXISTS "
                      f"{quote(names.not_null_check(job))}")
    # Always: the shadow column's own comment (its mark) must not survive.
    run(conn, f"COMMENT ON COLUMN {t}.{column} IS "
              f"{'NULL' if old.comment is None else literal(old.comment)}")


def _refuse_what_changed(conn: Connection, job: Job, old: catalog.ColumnFacts,
                         new: catalog.ColumnFacts, indexes: list[IndexFacts],
                         constraints: list[catalog.ConstraintFacts]) -> None:
    reason = _not_carried(conn, job, old, new, indexes, constraints)
    if reason is not None:
        raise CutOverBlocked(f"{job.params['table']} changed during the job: {reason}; the "
                             "cut-over refused it and the job is rolled back, the table as it "
                             "was: resolve that, then submit the job again")


def _not_carried(conn: Connection, job: Job, old: catalog.ColumnFacts,
                 new: catalog.ColumnFacts, indexes: list[IndexFacts],
                 constraints: list[catalog.ConstraintFacts]) -> str | None:
    """Under the cut-over's lock, whatever the submit refuses is checked
    again (a child table, a view on the column, ... made while the job ran),
    and every index and constraint on the column must have its copy on the
    shadow column: the DROP COLUMN would otherwise drop it, or recurse into
    a child whose rows the job never converted. What cannot be carried, or None."""
    p = job.params
    try:
        checks.check_swappable(conn, job.target_table, p["table"], old)
    except InvalidParams as exc:
        return str(exc)
    built = {i.name: i for i in catalog.covering_indexes(conn, job.target_table, new.attnum)}
    for index in indexes:
        replacement = built.get(names.index_for(job, index.name))
        if index.valid and (replacement is None or not replacement.valid):
            return f"index {index.name} on {p['column']} has no copy built on {p['shadow']}"
    copies = set(catalog.constraint_names(conn, job.target_table))
    for constraint in constraints:
        if names.constraint_for(job, constraint.name) not in copies:
            return f"constraint {constraint.name} on {p['column']} has no copy on {p['shadow']}"
    return None


def _set_default(conn: Connection, table: str, column: str, default: str, type_: str) -> None:
    """The old default, coerced to the new type as ALTER TABLE ... TYPE does;
    where it does not coerce implicitly (text '7' to integer), with a cast."""
    try:
        with conn.begin_nested():
            run(conn, f"ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT {default}")
    except sa_exc.ProgrammingError:
        run(conn, f"ALTER TABLE {table} ALTER COLUMN {column} "
                          f"SET DEFAULT CAST(({default}) AS {type_})")


def _set_settings(conn: Connection, table: str, column: str,
                  settings: catalog.ColumnSettings) -> None:
    for grant in settings.grants:
        run(conn, grant.on(table, column))
    if settings.statistics is not None:
        run(conn, f"ALTER TABLE {table} ALTER COLUMN {column} "
                  f"SET STATISTICS {settings.statistics}")
    if settings.options:
        run(conn, f"ALTER TABLE {table} ALTER COLUMN {column} "
                  f"SET ({', '.join(settings.options)})")


def _take_over_not_null(conn: Connection, table: str, column: str,
                        old: catalog.ColumnFacts) -> None:
    """PostgreSQL 18 on: the SET NOT NULL above made a constraint named after
    the shadow column (``items_a_reorg_1_not_null``); it takes the old one's
    name and comment, as the DROP COLUMN freed both."""
    new = catalog.column_facts(conn, table, column)
    if new is None or new.not_null_constraint is None:
        return
    if new.not_null_constraint != old.not_null_constraint:
        run(conn, f"ALTER TABLE {table} RENAME CONSTRAINT {quote(new.not_null_constraint)} "
                  f"TO {quote(old.not_null_constraint or '')}")
    _comment(conn, f"CONSTRAINT {quote(old.not_null_constraint or '')} ON {table}",
             old.not_null_comment)


def _take_over_index(conn: Connection, table: str, built: str, old: IndexFacts) -> None:
    """The index built on the new column gets the old one's name, constraint,
    comment, statistics targets, and its marks as the table's clustered
    index and replica identity."""
    schema = table.split(".")[0]
    if old.constraint_type in ("p", "u"):
        kind = "PRIMARY KEY" if old.constraint_type == "p" else "UNIQUE"
        timing = (" DEFERRABLE INITIALLY DEFERRED" if old.deferred
                  else " DEFERRABLE" if old.deferrable else "")
        run(conn, f"ALTER TABLE {table} ADD CONSTRAINT {quote(old.constraint or '')} "
                          f"{kind} USING INDEX {quote(built)}{timing}")
        _comment(conn, f"CONSTRAINT {quote(old.constraint or '')} ON {table}",
                 old.constraint_comment)
        # USING INDEX renamed the index to the constraint's name.
        index = f"{schema}.{quote(old.constraint or '')}"
        if old.constraint != old.name:
            run(conn, f"ALTER INDEX {index} RENAME TO {quote(old.name)}")
            index = f"{schema}.{quote(old.name)}"
    else:
        run(conn, f"ALTER INDEX {schema}.{quote(built)} RENAME TO {quote(old.name)}")
        index = f"{schema}.{quote(old.name)}"
    _comment(conn, f"INDEX {index}", old.comment)
    for statement in plan.index_marks(table, old):
        run(conn, statement)


def _comment(conn: Connection, target: str, comment: str | None) -> None:
    if comment is not None:
        run(conn, f"COMMENT ON {target} IS {literal(comment)}")
