"""The user-SQL gate (backfill.expressions), without a server: a ``--set``,
``--where`` or ``--select``-style fragment is exactly one expression, or it
is refused with one line; nothing a fragment holds can end its place in the
statement it is pasted into; role-switching and SQL-running built-ins are
refused (docs/security.md)."""

from __future__ import annotations

import pytest
from pglast import parse_sql

from backfill.expressions import embed, one_expression, optional_expression
from framework.errors import InvalidParams

SMUGGLED = {
    "semicolon": "1; DROP TABLE items",
    "semicolon at the end": "1;",
    "semicolon after a string": "'a'; DROP TABLE items",
    "closes its parenthesis": "1) ; DROP TABLE items; SELECT (1",
    "closes and reopens": "FALSE) OR (TRUE",
    "line comment hides the rest": "1 -- ) ; DROP TABLE items",  # accepted: see below
    "unterminated block comment": "1 /* ; DROP TABLE items",
    "block comment closing outside": "1 */ ; DROP TABLE items",
    "nested comment left open": "1 /* /* */ ; DROP TABLE items",
    "unterminated dollar quote": "$$1; DROP TABLE items",
    "tagged dollar quote left open": "$x$ 1 $y$; DROP TABLE items",
    "dollar quote closes early": "$$a$$; DROP TABLE items; SELECT $$b$$",
    "unbalanced single quote": "'abc; DROP TABLE items",
    "quote escaped with backslash": "E'\\''; DROP TABLE items; SELECT '",
    "unbalanced double quote": '"b; DROP TABLE items',
    "unbalanced parenthesis": "(1; DROP TABLE items",
    "extra closing parenthesis": "1)",
    "two expressions": "1, 2",
    "alias": "1 AS c",
    "FROM clause": "b FROM items",
    "set operation": "1 UNION SELECT 2",
    "WHERE clause": "1 WHERE FALSE",
    "INTO clause": "1 INTO t",
    "a whole statement": "DROP TABLE items",
    "empty": "   ",
}


@pytest.mark.parametrize("text", [v for k, v in SMUGGLED.items()
                                  if k != "line comment hides the rest"],
                         ids=[k for k in SMUGGLED if k != "line comment hides the rest"])
def test_a_second_statement_or_a_broken_fragment_is_refused(text: str) -> None:
    with pytest.raises(InvalidParams) as exc:
        one_expression(text, "--set")
    message = str(exc.value)
    assert "\n" not in message and message.startswith("--set ")


def test_a_trailing_line_comment_cannot_swallow_what_follows_it() -> None:
    """Accepted as one expression; pasted, the comment ends at the newline
    ``embed`` puts before its closing parenthesis, so the statement around it
    keeps its shape: one statement, the fragment's value alone inside."""
    text = SMUGGLED["line comment hides the rest"]
    assert one_expression(text, "--set") == text
    statement = f"UPDATE items SET c = {embed(text)} WHERE id >= 1 AND id < 10"
    (parsed,) = parse_sql(statement)
    assert parsed.stmt.whereClause is not None  # the range survived the comment


OK = {
    "call": "md5(b)",
    "semicolon in a string": "'a;b'",
    "comment markers in a string": "'-- /* */'",
    "dollar-quoted string with a semicolon": "$$a; DROP TABLE items$$",
    "tagged dollar quote": "$t$x$$y$t$",
    "balanced block comment": "1 /* ; DROP TABLE items */ + 1",
    "scalar subquery": "(SELECT max(a) FROM items)",
    "case": "CASE WHEN a > 1 THEN 'x' ELSE b END",
    "quoted identifier with a semicolon": '"odd;name"',
}


@pytest.mark.parametrize("text", OK.values(), ids=OK.keys())
def test_one_expression_is_accepted_and_embeds_as_one(text: str) -> None:
    assert one_expression(f"  {text} ", "--where") == text
    (parsed,) = parse_sql(f"SELECT 1 FROM items WHERE {embed(text)}")
    assert parsed.stmt.fromClause is not None


FORBIDDEN = {
    "role switch": "set_config('role', 'reorg_worker', true)",
    "schema-qualified, upper case": "PG_CATALOG.SET_CONFIG('role', 'x', false)",
    "inside a subquery": "coalesce(b, (SELECT set_config('role', 'x', true)))",
    "SQL text run by query_to_xml": "query_to_xml('SELECT secret FROM s', true, false, '')::text",
    "dblink": "(SELECT x FROM dblink('dbname=x', 'SELECT 1') AS t(x int))",
}


@pytest.mark.parametrize("text", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_role_switching_and_sql_running_builtins_are_refused(text: str) -> None:
    with pytest.raises(InvalidParams, match=r"calls \w+\(\), which reorg refuses"):
        one_expression(text, "--set")


def test_embed_checks_again_what_it_pastes() -> None:
    """A job row not written by submit still cannot bring a statement."""
    with pytest.raises(InvalidParams):
        embed("1); DROP TABLE items; SELECT (1")
    with pytest.raises(InvalidParams):
        embed("set_config('role', 'x', true)")


def test_optional_expression_is_none_when_not_given() -> None:
    assert optional_expression(None, "--where") is None
    assert optional_expression("  ", "--where") is None
    assert optional_expression("a > 1", "--where") == "a > 1"
