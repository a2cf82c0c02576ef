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
comment cannot swallow it, and checks it again: a job row written by other
means than submit (or by an older version) cannot bring a second statement
to a worker either.

A job's SQL runs with its submitter's privileges (``SET LOCAL ROLE``,
framework.privileges). PostgreSQL lets the session's own role back in with
``set_config('role', ...)``, so an expression may not call the built-ins that
change settings or run SQL text (whose text no check here could see).
"""

from __future__ import annotations

import re
from functools import lru_cache

from pglast import ast, parse_sql
from pglast.parser import ParseError

from framework.errors import InvalidParams

# SelectStmt fields that must be empty for ``SELECT <expr>`` to be a bare expression.
_MUST_BE_EMPTY = (
    "distinctClause", "intoClause", "fromClause", "whereClause", "groupClause",
    "havingClause", "windowClause", "valuesLists", "sortClause", "limitOffset",
    "limitCount", "lockingClause", "withClause", "larg", "rarg",
)


# Built-ins that change a setting (the role among them) or run SQL given as
# text: refused by name, schema-qualified or not.
FORBIDDEN_CALLS = frozenset({
    "set_config", "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema",
    "cursor_to_xml", "cursor_to_xmlschema", "dblink", "dblink_exec", "dblink_open",
    "dblink_send_query", "dblink_fetch",
})


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
    if len(statements) != 1 or not _bare_select(statements[0].stmt) or not _parses_embedded(
            stripped):
        raise InvalidParams(
            f"{option} {stripped!r} is not one SQL expression; give a single expression "
            "(no ';', FROM, AS alias or set operation)")
    called = sorted(_forbidden_calls(statements[0].stmt))
    if called:
        raise InvalidParams(
            f"{option} {stripped!r} calls {called[0]}(), which reorg refuses: a job's SQL "
            "runs with its submitter's privileges and may not change settings or run SQL "
            "text; compute the value without it")
    return stripped


def optional_expression(text: str | None, option: str) -> str | None:
    """``one_expression`` of an optional option (``--where``): None when not given."""
    stripped = (text or "").strip()
    return one_expression(stripped, option) if stripped else None


def embed(expression: str) -> str:
    """A checked expression, parenthesised, safe to paste into a statement
    (checked again here; InvalidParams if it is not one expression)."""
    return _embedded(expression)


@lru_cache(maxsize=256)
def _embedded(expression: str) -> str:
    return f"({one_expression(expression, 'expression')}\n)"


def _parses_embedded(expression: str) -> bool:
    """Whether the fragment, as ``embed`` pastes it, is one expression still
    (a trailing ``;`` passes the bare parse, and breaks the pasted form)."""
    try:
        return len(parse_sql(f"SELECT ({expression}\n)")) == 1
    except ParseError:
        return False


def _forbidden_calls(node: object) -> set[str]:
    """Names of FORBIDDEN_CALLS called anywhere in the parse tree ``node``."""
    found: set[str] = set()
    if isinstance(node, ast.FuncCall):
        name = getattr(node.funcname[-1], "sval", None) if node.funcname else None
        if name and name.lower() in FORBIDDEN_CALLS:
            found.add(name.lower())
    if isinstance(node, ast.Node):
        for attr in node:
            found |= _forbidden_calls(getattr(node, attr))
    elif isinstance(node, tuple | list):
        for item in node:
            found |= _forbidden_calls(item)
    return found


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
