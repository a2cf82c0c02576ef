"""``--like FILE``: the new shape as a CREATE TABLE of any form (e.g.
``PARTITION BY RANGE`` with its partitions, each a ``CREATE TABLE ...
PARTITION OF``), parsed by PostgreSQL's own parser (pglast) and created
under the shadow's name. Its constraints (PRIMARY KEY, UNIQUE, CHECK,
FOREIGN KEY, EXCLUDE) and ``CREATE INDEX`` statements are taken out: the
build step makes them after the copy. NOT NULL, defaults, identity and
generated columns stay in the CREATE."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from backfill.rewrite.alter import AddedConstraint, names_table
from framework.errors import InvalidParams

FIX = ("give one CREATE TABLE of the new shape, its partitions (CREATE TABLE ... PARTITION "
       "OF) and its indexes (CREATE INDEX name ON ...)")
_C = enums.ConstrType
_CONTYPES = {_C.CONSTR_PRIMARY: "p", _C.CONSTR_UNIQUE: "u", _C.CONSTR_CHECK: "c",
             _C.CONSTR_FOREIGN: "f", _C.CONSTR_EXCLUSION: "x"}
_SUFFIX = {"p": "pkey", "u": "key", "c": "check", "f": "fkey", "x": "excl"}


@dataclass(frozen=True)
class LikeIndex:
    name: str  # as the file names it: the index's name after the swap
    statement: str  # CREATE INDEX <placeholder> ON <shadow or a partition> ...; see ``named``
    tree: ast.IndexStmt

    def named(self, name: str) -> str:
        self.tree.idxname = name
        return str(RawStream()(self.tree))


@dataclass(frozen=True)
class Like:
    create: tuple[str, ...]  # the shadow, then its partitions
    constraints: tuple[AddedConstraint, ...]
    indexes: tuple[LikeIndex, ...]
    partitioned: bool


def parse(text: str, schema: str, shadow_name: str, table_name: str) -> Like:
    """The file's statements with its table renamed to the shadow (in T's
    schema, as is every unqualified partition); names of unnamed constraints
    as PostgreSQL would give them on ``table_name``."""
    try:
        statements = [s.stmt for s in parse_sql(text or "")]
    except ParseError as exc:
        raise InvalidParams(f"--like: the file does not parse ({exc}); {FIX}") from None
    tables = [s for s in statements if isinstance(s, ast.CreateStmt) and s.partbound is None]
    if len(tables) != 1 or tables[0].inhRelations:
        raise InvalidParams(f"--like: the file has {len(tables)} plain CREATE TABLE "
                            f"statements; {FIX}")
    main = tables[0]
    main_name = _relation(main).relname
    creates, constraints, indexes = [], [], []
    for stmt in statements:
        if isinstance(stmt, ast.CreateStmt):
            if stmt is main:
                constraints += _take_constraints(stmt, table_name,
                                                 _relation(stmt).schemaname or schema)
                stmt.relation = _shadow(schema, shadow_name)
            else:
                parent = stmt.inhRelations[0] if stmt.inhRelations else None
                if stmt.partbound is None or parent is None:
                    raise InvalidParams(f"--like: table {_relation(stmt).relname} is neither the "
                                        f"new table nor a partition; {FIX}")
                if parent.relname == main_name:
                    stmt.inhRelations = (_shadow(schema, shadow_name),)
                if not _relation(stmt).schemaname:
                    _relation(stmt).schemaname = schema
            creates.append(str(RawStream()(stmt)))
        elif isinstance(stmt, ast.IndexStmt):
            if not stmt.idxname:
                raise InvalidParams(f"--like: an index of the file has no name; name it "
                                    f"(CREATE INDEX name ON {_relation(stmt).relname} ...)")
            if _relation(stmt).relname == main_name:
                stmt.relation = _shadow(schema, shadow_name)
            elif not _relation(stmt).schemaname:
                _relation(stmt).schemaname = schema
            indexes.append(LikeIndex(stmt.idxname, str(RawStream()(stmt)), stmt))
        else:
            raise InvalidParams(f"--like: the file has a {type(stmt).__name__} statement; {FIX}")
    return Like(tuple(creates), tuple(constraints), tuple(indexes), main.partspec is not None)


def _relation(stmt: ast.CreateStmt | ast.IndexStmt) -> ast.RangeVar:
    assert stmt.relation is not None
    return stmt.relation


def _shadow(schema: str, name: str) -> ast.RangeVar:
    return ast.RangeVar(schemaname=schema, relname=name, inh=True, relpersistence="p")


def _take_constraints(stmt: ast.CreateStmt, table_name: str,
                      schema: str) -> list[AddedConstraint]:
    """Remove the table's constraints from its CREATE; a column's PRIMARY KEY
    leaves NOT NULL behind (the key's columns are NOT NULL from the start).
    A FOREIGN KEY to the file's table (``schema`` its schema) is to itself."""
    main = _relation(stmt).relname or ""

    def constraint_of(element: ast.Constraint, columns: list[str]) -> AddedConstraint:
        taken = _constraint(element, table_name, columns)
        if taken.contype == "f" and names_table(element.pktable, schema, main):
            return replace(taken, self_reference=True)
        return taken

    taken: list[AddedConstraint] = []
    elements = []
    for element in stmt.tableElts or ():
        if isinstance(element, ast.Constraint) and element.contype in _CONTYPES:
            columns = [k.sval for k in (element.keys or element.fk_attrs or ())]
            taken.append(constraint_of(element, columns))
            continue
        if isinstance(element, ast.ColumnDef) and element.constraints:
            kept = []
            for constraint in element.constraints:
                kind = constraint.contype
                if kind not in _CONTYPES:
                    kept.append(constraint)
                    continue
                if kind == _C.CONSTR_PRIMARY:
                    kept.append(ast.Constraint(contype=_C.CONSTR_NOTNULL))
                    constraint.keys = (ast.String(sval=element.colname),)
                elif kind == _C.CONSTR_UNIQUE:
                    constraint.keys = (ast.String(sval=element.colname),)
                elif kind == _C.CONSTR_FOREIGN:
                    constraint.fk_attrs = (ast.String(sval=element.colname),)
                taken.append(constraint_of(constraint, [element.colname or ""]))
            element.constraints = tuple(kept) or None
        elements.append(element)
    stmt.tableElts = tuple(elements)
    return taken


def _constraint(constraint: ast.Constraint, table_name: str,
                columns: list[str]) -> AddedConstraint:
    contype = _CONTYPES[constraint.contype]  # type: ignore[index]
    name = constraint.conname
    if not name:  # PostgreSQL's choice (without its numbering of duplicates)
        middle = "" if contype == "p" else "_".join(columns)
        name = "_".join(filter(None, [table_name, middle, _SUFFIX[contype]]))[:63]
    constraint.conname = None
    return AddedConstraint(name, contype, str(RawStream()(constraint)))
