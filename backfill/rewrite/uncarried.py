"""What the swap cannot carry from T to the new table (``carry``), each
named in one line: refused at submit, and checked again under the swap's
lock (T may have gained it since).

- an object depending on T that ``carry`` does not make again: a
  materialized view, a function whose SQL body reads T, a policy of
  another table reading T, ...; or on T's row type (a function taking or
  returning it, a column of that type);
- a view, trigger, rule, policy, statistics object or publication that uses
  a column the new shape does not have;
- a foreign key of another table on a column of T the new shape does not
  have, or of a partitioned table before PostgreSQL 18 (which adds no
  foreign key NOT VALID there: the swap would scan it under its lock);
- a REPLICA IDENTITY USING INDEX whose index the new shape does not build;
- a NOT NULL constraint NOT VALID (PostgreSQL 18);
- a security label on T."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite.shadow import Plan
from framework import pgversion

HOW = "drop it before the rewrite and create it again after"


def of_plan(conn: Connection, plan: Plan) -> list[str]:
    """``refusals`` of T for the new shape of ``plan`` (at submit)."""
    return refusals(conn, plan.table, {c for c, _ in plan.shape}, plan.index_names())


def refusals(conn: Connection, table: str, kept: set[str], indexes: set[str]) -> list[str]:
    """One line per object of ``table`` the swap cannot carry, given the new
    shape's columns (``kept``) and its index names after the swap (``indexes``)."""
    found: list[str] = []
    params = {"t": table, "kept": sorted(kept)}
    for what, column in conn.execute(text(_DEPENDENTS), params):
        what = what.replace("rule _RETURN on ", "")
        if column is None:
            found.append(f"{what} depends on table {table}, and the swap cannot carry it over; "
                         f"{HOW}")
        else:
            found.append(f"{what} uses column {column} of table {table}, which the new shape "
                         f"does not have; {HOW}")
    for what in conn.execute(text(_ROW_TYPE_USERS), params).scalars():
        found.append(f"{what} uses the row type of table {table}, which the new table does not "
                     f"have (a rewrite makes a new type); {HOW}")
    for name, referencing, partitioned, missing in conn.execute(text(_REFERENCING), params):
        if missing:
            found.append(f"foreign key {name} on {referencing} references column {missing} of "
                         f"table {table}, which the new shape does not have; {HOW}")
        elif partitioned and pgversion.server_major(conn) < 18:
            # 18 adds a foreign key NOT VALID on a partitioned table too: carried.
            found.append(f"foreign key {name} on {referencing} (partitioned) references table "
                         f"{table}; PostgreSQL before 18 cannot add it NOT VALID, so the swap "
                         f"would check every row of it under its lock; {HOW}")
    identity = conn.execute(text(_REPLICA_INDEX), params).scalar()
    if identity is not None and identity not in indexes:
        found.append(f"table {table} has REPLICA IDENTITY USING INDEX {identity}, which the new "
                     "shape does not build; set another replica identity first, or keep the "
                     "index")
    # PostgreSQL 18: NOT NULL ... NOT VALID. The shadow's LIKE copies it valid:
    # the copy of a NULL would fail, and without one the swap would validate it.
    for name in conn.execute(text(_INVALID_NOT_NULLS), params).scalars():
        found.append(f"NOT NULL constraint {name} of table {table} is NOT VALID, which the new "
                     f"table would have valid; validate it first (ALTER TABLE ... VALIDATE "
                     f"CONSTRAINT {name}) or drop it")
    if conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_seclabel WHERE objoid = "
                         "to_regclass(:t) AND classoid = 'pg_class'::regclass)"), params).scalar():
        found.append(f"table {table} has a security label, which the swap cannot carry over; "
                     "remove it before the rewrite and set it again after")
    return found


# Objects depending on T (or on one of its columns, then named) that carry
# does not make again; or that carry makes again but which use a column the
# new shape drops. The table's own indexes and constraints are the build
# step's; its own defaults, sequences, TOAST table and row type go with it.
_DEPENDENTS = """
    WITH t AS (SELECT to_regclass(:t) AS oid),
    deps AS (
        SELECT d.classid, d.objid, d.refobjsubid,
               CASE d.classid
                 -- (d.objid = t.oid: PostgreSQL 14 records a generated column's use
                 -- of a column as the table's own; 15 on as its pg_attrdef's)
                 WHEN 'pg_class'::regclass THEN d.objid = t.oid OR EXISTS (
                   SELECT 1 FROM pg_class c WHERE c.oid = d.objid AND (c.relkind = 'S'
                     OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = t.oid)))
                 WHEN 'pg_constraint'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_constraint c WHERE c.oid = d.objid
                   AND (c.conrelid = t.oid OR (c.contype = 'f' AND c.confrelid = t.oid)))
                 WHEN 'pg_trigger'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_trigger g WHERE g.oid = d.objid AND g.tgrelid = t.oid)
                 WHEN 'pg_policy'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_policy p WHERE p.oid = d.objid AND p.polrelid = t.oid)
                 WHEN 'pg_rewrite'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_rewrite r JOIN pg_class v ON v.oid = r.ev_class
                   WHERE r.oid = d.objid AND (r.ev_class = t.oid OR v.relkind = 'v'))
                 WHEN 'pg_attrdef'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_attrdef a WHERE a.oid = d.objid AND a.adrelid = t.oid)
                 WHEN 'pg_statistic_ext'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_statistic_ext s WHERE s.oid = d.objid AND s.stxrelid = t.oid)
                 WHEN 'pg_publication_rel'::regclass THEN EXISTS (
                   SELECT 1 FROM pg_publication_rel p WHERE p.oid = d.objid
                   AND p.prrelid = t.oid)
                 ELSE false END AS carried,
               -- its own indexes, constraints and defaults: the build step's and the shape's
               (d.classid IN ('pg_attrdef'::regclass, 'pg_class'::regclass) OR
                (d.classid = 'pg_constraint'::regclass AND EXISTS (
                   SELECT 1 FROM pg_constraint c WHERE c.oid = d.objid
                   AND c.conrelid = t.oid AND c.contype <> 't'))) AS shaped
        FROM pg_depend d, t
        WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = t.oid
          AND d.deptype IN ('n', 'a'))
    SELECT DISTINCT pg_describe_object(deps.classid, deps.objid, 0),
           CASE WHEN deps.carried THEN a.attname END
    FROM deps LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(:t)
         AND a.attnum = deps.refobjsubid AND deps.refobjsubid > 0
    WHERE NOT deps.carried
       OR (NOT deps.shaped AND a.attname IS NOT NULL
           AND NOT a.attname = ANY(CAST(:kept AS name[])))
    ORDER BY 1, 2"""

_INVALID_NOT_NULLS = """
    SELECT conname FROM pg_constraint
    WHERE conrelid = to_regclass(:t) AND contype = 'n' AND NOT convalidated ORDER BY 1"""

_ROW_TYPE_USERS = """
    SELECT DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid) FROM pg_depend d
    WHERE d.refclassid = 'pg_type'::regclass
      AND d.refobjid = (SELECT reltype FROM pg_class WHERE oid = to_regclass(:t))
      AND d.deptype = 'n'
    ORDER BY 1"""

_REFERENCING = """
    SELECT c.conname, c.conrelid::regclass::text, r.relkind = 'p',
           (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.confrelid
            AND a.attnum = ANY(c.confkey) AND NOT a.attname = ANY(CAST(:kept AS name[]))
            ORDER BY a.attnum LIMIT 1)
    FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid
    WHERE c.contype = 'f' AND c.confrelid = to_regclass(:t) AND c.conrelid <> c.confrelid
    ORDER BY 1"""

_REPLICA_INDEX = """
    SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
    JOIN pg_class c ON c.oid = i.indrelid
    WHERE i.indrelid = to_regclass(:t) AND i.indisreplident AND c.relreplident = 'i'"""
