"""Index and constraint definitions moved from one column to another, by
PostgreSQL's own parser (pglast): every reference to the column (a key of
the index, an expression, a predicate, a CHECK expression, a foreign key's
columns) is renamed, nothing else is touched, and the statement is printed
back. Text substitution would also rename a string literal or another column
whose name contains the first."""

from __future__ import annotations

from typing import Any

from pglast import ast, parse_sql
from pglast.stream import RawStream
from pglast.visitors import Visitor


class _Rename(Visitor):  # type: ignore[misc]
    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def visit_ColumnRef(self, parent: Any, node: ast.ColumnRef) -> Any:
        fields = node.fields or ()
        if len(fields) == 1 and isinstance(fields[0], ast.String) and fields[0].sval == self.old:
            return ast.ColumnRef(fields=(ast.String(sval=self.new),), location=node.location)
        return None

    def visit_IndexElem(self, parent: Any, node: ast.IndexElem) -> Any:
        if node.name == self.old:
            node.name = self.new
        return None

    def visit_Constraint(self, parent: Any, node: ast.Constraint) -> Any:
        if node.fk_attrs:
            node.fk_attrs = tuple(ast.String(sval=self.new) if a.sval == self.old else a
                                  for a in node.fk_attrs)
        return None


def index_on_column(definition: str, old: str, new: str, name: str,
                    tablespace: str | None = None) -> str:
    """``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ...``: the index
    of ``definition`` (pg_get_indexdef) built on column ``new`` instead of
    ``old``, in ``tablespace`` (pg_get_indexdef leaves it out)."""
    tree = parse_sql(definition)
    _Rename(old, new)(tree)
    stmt = tree[0].stmt
    if not isinstance(stmt, ast.IndexStmt):
        raise ValueError(f"not an index definition: {definition}")
    stmt.idxname = name
    if tablespace is not None:
        stmt.tableSpace = tablespace
    stmt.concurrent = True
    stmt.if_not_exists = True
    return str(RawStream()(tree))


def constraint_on_column(table: str, definition: str, old: str, new: str, name: str) -> str:
    """``ALTER TABLE table ADD CONSTRAINT name <definition> NOT VALID``, the
    constraint (pg_get_constraintdef) moved to column ``new``: added without
    checking existing rows (a short lock); VALIDATE checks them later without
    blocking writes."""
    body = definition.removesuffix(" NOT VALID")
    tree = parse_sql(f"ALTER TABLE {table} ADD CONSTRAINT {_quote(name)} {body} NOT VALID")
    _Rename(old, new)(tree)
    return str(RawStream()(tree))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
