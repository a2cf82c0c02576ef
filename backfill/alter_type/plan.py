"""The DDL of each schema state of an ``alter-type`` job, as the job runs it
and as ``--dry-run`` prints it: built from the catalogue facts of the
column (``backfill.schema.catalog``) and the job's names (``names``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Connection

from backfill.alter_type import names
from backfill.schema import catalog, rewrite
from backfill.tables import quote
from framework.records import Job


@dataclass(frozen=True)
class IndexBuild:
    original: str
    name: str
    statement: str  # CREATE INDEX CONCURRENTLY IF NOT EXISTS ...


@dataclass(frozen=True)
class ConstraintClone:
    original: str
    name: str
    statement: str  # ALTER TABLE ... ADD CONSTRAINT ... NOT VALID
    validate: bool  # the original is validated: so must the clone be


def expression(params: dict) -> str:
    """The shadow column's value computed from a row: ``USING`` or a cast of the column."""
    source = params.get("using") or quote(params["column"])
    return f"CAST(({source}\n) AS {params['type']})"


def index_builds(conn: Connection, job: Job, attnum: int) -> list[IndexBuild]:
    """Every valid index covering the column, rebuilt on the shadow column."""
    p = job.params
    builds = []
    for index in catalog.covering_indexes(conn, job.target_table, attnum):
        if not index.valid:
            continue  # a failed build of the user's: the old column's drop takes it along
        name = names.index_for(job, index.name)
        builds.append(IndexBuild(index.name, name, rewrite.index_on_column(
            index.definition, p["column"], p["shadow"], name, index.tablespace)))
    return builds


def constraint_clones(conn: Connection, job: Job, attnum: int) -> list[ConstraintClone]:
    """Every CHECK / FOREIGN KEY of the table on the column, moved to the shadow column."""
    p = job.params
    clones = []
    for constraint in catalog.covering_constraints(conn, job.target_table, attnum):
        name = names.constraint_for(job, constraint.name)
        clones.append(ConstraintClone(constraint.name, name, rewrite.constraint_on_column(
            job.target_table, constraint.definition, p["column"], p["shadow"], name),
            constraint.validated))
    return clones


def index_marks(table: str, index: catalog.IndexFacts) -> list[str]:
    """What the cut-over sets on the copy of ``index`` once it has the old
    one's name: the old index went with the old column, and with it its
    statistics targets and its marks as the table's clustered index and
    replica identity (a published table without its replica identity fails
    every UPDATE and DELETE)."""
    name = quote(index.name)
    marks = [f"ALTER INDEX {table.split('.')[0]}.{name} ALTER COLUMN {number} "
             f"SET STATISTICS {target}" for number, target in index.statistics]
    if index.clustered:
        marks.append(f"ALTER TABLE {table} CLUSTER ON {name}")
    if index.replica_identity:
        marks.append(f"ALTER TABLE {table} REPLICA IDENTITY USING INDEX {name}")
    return marks


def sequence_widenings(conn: Connection, job: Job, facts: catalog.ColumnFacts) -> list[str]:
    """``ALTER SEQUENCE ... AS TYPE`` of each sequence the column owns (``serial``)
    whose integer type is narrower than the column's new one: int to bigint
    would otherwise leave the table's keys stopping at 2,147,483,647. A
    MAXVALUE that was the old type's largest becomes the new type's
    (PostgreSQL does that itself); one the user set stays."""
    widened = []
    for sequence in facts.owned_sequences:
        wider = catalog.narrower_sequence(conn, sequence, job.params["type"])
        if wider is not None:
            widened.append(f"ALTER SEQUENCE {sequence} AS {wider}")
    return widened


def identity_statements(table: str, column: str, identity: catalog.IdentityFacts) -> list[str]:
    """The identity of the old column re-created on the new one (its sequence
    went with the old column's drop): the same kind, sequence name and
    settings, at the value the old sequence had, so no key is handed out
    twice. On a wider type a default MAXVALUE becomes the wider type's, as
    a plain ``ALTER TABLE ... TYPE`` makes it."""
    return [f"ALTER TABLE {table} ALTER COLUMN {column} ADD GENERATED {identity.kind} "
            f"AS IDENTITY ({identity.options()})",
            f"SELECT setval('{identity.sequence}', {identity.last_value}, "
            f"{'true' if identity.is_called else 'false'})"]


def prepare_statements(job: Job, not_null: bool, clones: list[ConstraintClone]) -> list[str]:
    """Write-only: the shadow column, its NOT VALID checks (the trigger comes next)."""
    t, p = job.target_table, job.params
    shadow = quote(p["shadow"])
    statements = [f"ALTER TABLE {t} ADD COLUMN {shadow} {p['type']}"]
    if not_null:
        # NO INHERIT: a child table made during the job (which the cut-over
        # refuses) must not refuse its application's writes for a NULL shadow.
        statements.append(f"ALTER TABLE {t} ADD CONSTRAINT {quote(names.not_null_check(job))} "
                          f"CHECK ({shadow} IS NOT NULL) NO INHERIT NOT VALID")
    statements += [clone.statement for clone in clones]
    return statements


def describe(conn: Connection, job: Job) -> list[str]:
    """What ``--dry-run`` prints: each state's DDL, in order (job id shown as 0)."""
    p, t = job.params, job.target_table
    facts = catalog.column_facts(conn, t, p["column"])
    assert facts is not None  # validate found it
    clones = constraint_clones(conn, job, facts.attnum)
    builds = index_builds(conn, job, facts.attnum)
    settings = catalog.column_settings(conn, t, facts.attnum)
    identity = catalog.identity(conn, t, facts.attnum)
    shadow = quote(p["shadow"])
    lines = ["write-only (prepare, one short transaction):"]
    lines += [f"  {s}" for s in prepare_statements(job, facts.not_null, clones)]
    lines.append(f"  CREATE TRIGGER {names.trigger(job)} BEFORE INSERT OR UPDATE ON {t} "
                 f"FOR EACH ROW: NEW.{shadow} := {' '.join(expression(p).split())}")
    lines.append("write-reorg (step backfill, by range): "
                 f"UPDATE {t} SET {shadow} = {' '.join(expression(p).split())} "
                 "WHERE key in [lo, hi)")
    lines.append(f"write-reorg (step verify, by range): every row's {shadow} IS NOT DISTINCT "
                 "FROM the expression")
    lines.append("write-reorg (step build-indexes, one subtask each):")
    lines += [f"  {b.statement}" for b in builds]
    validated = ([names.not_null_check(job)] if facts.not_null else []) + [
        c.name for c in clones if c.validate]
    lines += [f"  ALTER TABLE {t} VALIDATE CONSTRAINT {quote(n)}" for n in validated]
    lines.append(f"  ANALYZE {t} ({shadow})")
    lines.append("public (cut-over, one transaction, bounded lock_timeout, retried):")
    lines.append(f"  LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE; " + "; ".join(filter(None, [
        *(f"ALTER SEQUENCE {s} OWNED BY {t}.{shadow}" for s in facts.owned_sequences),
        *sequence_widenings(conn, job, facts),
        f"ALTER TABLE {t} ALTER COLUMN {shadow} SET NOT NULL" if facts.not_null else "",
        f"DROP TRIGGER {names.trigger(job)}",
        f"ALTER TABLE {t} DROP COLUMN {quote(p['column'])}",
        f"ALTER TABLE {t} RENAME COLUMN {shadow} TO {quote(p['column'])}",
        f"SET DEFAULT {facts.default}" if facts.default else "",
        *(identity_statements(t, quote(p["column"]), identity) if identity else []),
        "indexes and constraints renamed to their old names"
        + (" (PRIMARY KEY / UNIQUE attached USING INDEX)" if builds else ""),
        *(mark for index in catalog.covering_indexes(conn, t, facts.attnum) if index.valid
          for mark in index_marks(t, index)),
        "COMMENT ON COLUMN" if facts.comment else "",
        *(g.on(t, quote(p["column"])) for g in settings.grants),
        f"SET STATISTICS {settings.statistics}" if settings.statistics is not None else "",
        f"SET ({', '.join(settings.options)})" if settings.options else "",
    ])))
    lines.append(f"note: column {p['column']} moves to the end of SELECT * (a swap of columns)")
    return lines
