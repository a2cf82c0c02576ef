"""User SQL fragments (``--set`` expressions, ``--where`` predicates) checked
to be exactly one expression before they are pasted into a statement.

EXPLAIN of the statement a fragment is pasted into is not enough: a fragment
can close the parenthesis it is put in and open another (``FALSE) OR (g = 1``)
and the assembled statement still parses, with a different meaning. So each
fragment is parsed on its own by PostgreSQL's parser (libpg_query, through
``pglast``) as the single target of ``SELECT <fragment>``: a second statement,
an unbalanced parenthesis, an unterminated comment or dollar quote, an alias,
a FROM or set operation all fail that. ``embed`` then pastes it inside
parentheses with the closing one on a line of its own, so a trailing ``--``
comment cannot swallow it.
"""

from __future__ import annotations

import re

from pglast import ast, parse_sql
from pglast.parser import ParseError

from framework.jobtype import InvalidParams

# SelectStmt fields that must be empty for ``SELECT <expr>`` to be a bare expression.
_MUST_BE_EMPTY = (
    "distinctClause", "intoClause", "fromClause", "whereClause", "groupClause",
    "havingClause", "windowClause", "valuesLists", "sortClause", "limitOffset",
    "limitCount", "lockingClause", "withClause", "larg", "rarg",
)


def one_expression(text: str, option: str) -> str:
    """``text`` stripped, if it is exactly one SQL expression; else InvalidParams
    naming ``option`` (e.g. ``--where``)."""
    stripped = (text or "").strip()
    if not stripped:
        raise InvalidParams(f"{option} is empty; give one SQL expression")
    try:
        statements = parse_sql(f"SELECT {stripped}")
    except ParseError as exc:
        # The parser's position counts our "SELECT " prefix: leave it out.
        reason = re.sub(r",? at index \d+", "", str(exc))
        raise InvalidParams(
            f"{option} {stripped!r} is not one SQL expression ({reason}); "
            "balance its parentheses and quotes") from None
    if len(statements) != 1 or not _bare_select(statements[0].stmt):
        raise InvalidParams(
            f"{option} {stripped!r} is not one SQL expression; give a single expression "
            "(no ';', FROM, AS alias or set operation)")
    return stripped


def optional_expression(text: str | None, option: str) -> str | None:
    """``one_expression`` of an optional option (``--where``): None when not given."""
    stripped = (text or "").strip()
    return one_expression(stripped, option) if stripped else None


def embed(expression: str) -> str:
    """A checked expression, parenthesised, safe to paste into a statement."""
    return f"({expression}\n)"


def on_one_line(statement: str) -> str:
    """A statement as a dry run prints it: its whitespace runs made one space."""
    return " ".join(statement.split())


def _bare_select(stmt: ast.Node | None) -> bool:
    if not isinstance(stmt, ast.SelectStmt) or stmt.op not in (0, "SETOP_NONE"):
        return False
    if any(getattr(stmt, name, None) for name in _MUST_BE_EMPTY):
        return False
    targets = stmt.targetList or ()
    return len(targets) == 1 and targets[0].name is None
