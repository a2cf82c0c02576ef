"""The shadow's indexes and constraints, made by the build step after the
copy (an index built once over all rows is cheaper than one kept up to date
row by row): T's own, mapped through an --alter (one on a dropped column is
not built; one on a column of a new type is built on the new type), and
those an --alter or --like file adds.

An index (and a PRIMARY KEY, UNIQUE or EXCLUDE constraint, named like its
index) is built under a temporary name, since index names are unique per
schema and T keeps its own until the swap, which renames them. A CHECK or
FOREIGN KEY (names unique per table) is added NOT VALID under its final
name and validated after, which does not block the copy's reads of T.

The builds run at once, one subtask each, in any order, but for one
dependency (``needed_by``): a foreign key of T to T is one of the shadow
to itself, which PostgreSQL refuses until the shadow has a unique index on
the referenced columns, made by another build. Every other build needs
only the shadow and its rows: a PRIMARY KEY or UNIQUE constraint is made
USING the index its own build creates, an EXCLUDE constraint makes its own
index, a foreign key to another table needs that table's key, there
already."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pglast import ast, parse_sql
from pglast.stream import RawStream
from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import names
from backfill.rewrite.alter import AddedConstraint
from backfill.rewrite.like import LikeIndex
from framework.keys import quote


@dataclass(frozen=True)
class Build:
    final: str  # the name after the swap (unquoted)
    temp: str  # its name on the shadow until the swap (the final one for CHECK / FK)
    kind: str  # "index" or "constraint"
    statements: tuple[str, ...]
    validate: str | None = None  # ALTER TABLE ... VALIDATE CONSTRAINT, after the statements
    unique: bool = False  # it makes a unique index, which a foreign key may reference
    self_reference: bool = False  # a foreign key of the shadow to itself

    @property
    def makes_index(self) -> bool:
        """An index, or a constraint with one (named apart until the swap)."""
        return self.temp != self.final

    def to_param(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_param(value: dict[str, Any]) -> Build:
        # (unique and self_reference are missing from plans stored before them)
        return Build(value["final"], value["temp"], value["kind"], tuple(value["statements"]),
                     value.get("validate"), value.get("unique", False),
                     value.get("self_reference", False))


def in_order(made: list[Build]) -> list[Build]:
    """``made`` with the builds that need others last: their subtasks are
    claimed after those (in order of their ordinals), and the submit's
    trial runs them after (``shadow._check_builds``)."""
    return sorted(made, key=lambda b: bool(needed_by(b, made)))


def needed_by(made: Build, builds: Sequence[Build]) -> list[Build]:
    """The builds that must be made before ``made``. A foreign key of the
    shadow to itself needs a unique index of the shadow on the columns it
    references; PostgreSQL takes any one that fits, so it waits for every
    unique index of the shadow: a rule that cannot miss the one it needs,
    at the cost of waiting for the few others."""
    if made.self_reference:
        return [b for b in builds if b.unique]
    return []


@dataclass(frozen=True)
class Shadow:
    """Where the builds go: the shadow table, and its facts the builds depend on."""

    job_id: int
    schema: str  # unquoted
    name: str  # unquoted
    partitioned: bool

    @property
    def qualified(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name)}"

    def range_var(self) -> ast.RangeVar:
        return ast.RangeVar(schemaname=self.schema, relname=self.name, inh=True,
                            relpersistence="p")


def of_table(conn: Connection, table: str, shadow: Shadow, columns: set[str],
             not_built: set[str]) -> tuple[list[Build], list[str]]:
    """T's valid indexes and its constraints on the shadow, and one line for
    each that is not built (a column of it is not in the new shape, an
    --alter drops it, or it is a failed build of the user's)."""
    builds: list[Build] = []
    notes: list[str] = []
    for row in conn.execute(text(_INDEXES), {"t": table}).mappings():
        name = row["constraint"] or row["name"]
        gone = sorted(set(row["columns"]) - columns)
        if name in not_built:
            notes.append(f"{_what(row)} {name}: dropped by --alter")
        elif gone:
            notes.append(f"{_what(row)} {name}: not built, column {gone[0]} is not in the new shape")
        elif not row["valid"]:
            notes.append(f"index {name}: not built, it is invalid on the table (a failed build)")
        else:
            builds.append(_index(shadow, row))
    for row in conn.execute(text(_CONSTRAINTS), {"t": table}).mappings():
        gone = sorted(set(row["columns"]) - columns)
        if row["name"] in not_built:
            notes.append(f"constraint {row['name']}: dropped by --alter")
        elif gone:
            notes.append(f"constraint {row['name']}: not built, column {gone[0]} is not in the "
                         "new shape")
        else:
            definition = row["definition"].removesuffix(" NOT VALID")
            builds.append(_checked(shadow, row["name"], definition, row["validated"],
                                   self_reference=row["self_reference"]))
    return builds, notes


def of_constraint(shadow: Shadow, added: AddedConstraint) -> Build:
    """A constraint an --alter or the --like file adds."""
    if added.contype in ("c", "f"):
        return _checked(shadow, added.name, added.definition, True,
                        self_reference=added.self_reference)
    temp = names.build_name(shadow.job_id, added.name)
    return Build(added.name, temp, "constraint", (
        f"ALTER TABLE {shadow.qualified} ADD CONSTRAINT {quote(temp)} {added.definition}",),
        unique=added.contype in ("p", "u"))


def of_like_index(shadow: Shadow, index: LikeIndex) -> Build:
    temp = names.build_name(shadow.job_id, index.name)
    return Build(index.name, temp, "index", (index.named(temp),), unique=bool(index.tree.unique))


def _index(shadow: Shadow, row: Any) -> Build:
    final = row["constraint"] or row["name"]
    temp = names.build_name(shadow.job_id, final)
    if row["contype"] == "x":
        return Build(final, temp, "constraint", (
            f"ALTER TABLE {shadow.qualified} ADD CONSTRAINT {quote(temp)} {row['condef']}",))
    stmt = parse_sql(row["definition"])[0].stmt
    assert isinstance(stmt, ast.IndexStmt)
    stmt.idxname = temp
    stmt.relation = shadow.range_var()
    stmt.tableSpace = row["tablespace"]
    statements = [str(RawStream()(stmt))]
    if row["contype"] in ("p", "u"):
        kind = "PRIMARY KEY" if row["contype"] == "p" else "UNIQUE"
        timing = (" DEFERRABLE INITIALLY DEFERRED" if row["deferred"]
                  else " DEFERRABLE" if row["deferrable"] else "")
        statements.append(f"ALTER TABLE {shadow.qualified} ADD CONSTRAINT {quote(temp)} "
                          f"{kind} USING INDEX {quote(temp)}{timing}")
    return Build(final, temp, "index", tuple(statements), unique=row["is_unique"])


def _checked(shadow: Shadow, name: str, definition: str, validated: bool, *,
             self_reference: bool) -> Build:
    """A CHECK or FOREIGN KEY: NOT VALID, then VALIDATE (PostgreSQL 15 takes
    no NOT VALID foreign key on a partitioned table: it is checked at once)."""
    statement = f"ALTER TABLE {shadow.qualified} ADD CONSTRAINT {quote(name)} {definition}"
    if self_reference:  # a foreign key of T to T: after the swap, of the new T to itself
        stmt = parse_sql(statement)[0].stmt
        assert isinstance(stmt, ast.AlterTableStmt) and stmt.cmds
        stmt.cmds[0].def_.pktable = shadow.range_var()
        statement = str(RawStream()(stmt))
    if shadow.partitioned:
        return Build(name, name, "constraint", (statement,), self_reference=self_reference)
    validate = (f"ALTER TABLE {shadow.qualified} VALIDATE CONSTRAINT {quote(name)}"
                if validated else None)
    return Build(name, name, "constraint", (f"{statement} NOT VALID",), validate,
                 self_reference=self_reference)


def _what(row: Any) -> str:
    return {"p": "primary key", "u": "unique constraint", "x": "exclusion constraint"}.get(
        row["contype"], "index")


# Every index of the table, with the constraint it backs and the columns it
# uses (as keys, in expressions or in its predicate).
_INDEXES = """
    SELECT ic.relname AS name, pg_get_indexdef(i.indexrelid) AS definition,
           i.indisvalid AS valid, i.indisunique AS is_unique, ts.spcname AS tablespace,
           con.conname AS constraint, con.contype, con.condeferrable AS deferrable,
           con.condeferred AS deferred, pg_get_constraintdef(con.oid) AS condef,
           ARRAY(SELECT a.attname FROM pg_attribute a
                 WHERE a.attrelid = i.indrelid AND a.attnum > 0 AND (a.attnum = ANY(i.indkey)
                   OR a.attnum IN (SELECT d.refobjsubid FROM pg_depend d
                                   WHERE d.classid = 'pg_class'::regclass
                                     AND d.objid = i.indexrelid
                                     AND d.refobjid = i.indrelid))) AS columns
    FROM pg_index i
    JOIN pg_class ic ON ic.oid = i.indexrelid
    LEFT JOIN pg_tablespace ts ON ts.oid = ic.reltablespace
    LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
         AND con.contype IN ('p', 'u', 'x')
    WHERE i.indrelid = to_regclass(:t)
    ORDER BY ic.relname"""

_CONSTRAINTS = """
    SELECT c.conname AS name, pg_get_constraintdef(c.oid) AS definition,
           c.convalidated AS validated, c.confrelid = c.conrelid AS self_reference,
           ARRAY(SELECT a.attname FROM pg_attribute a
                 WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)) AS columns
    FROM pg_constraint c
    WHERE c.conrelid = to_regclass(:t) AND c.contype IN ('c', 'f')
    ORDER BY c.conname"""
