"""Spark SQL expressions of a job (``backfill --set``, ``copy --select``)
kept to computing a row's value (docs/security.md).

A Spark expression runs inside the worker's JVM, as the worker's OS user:
``reflect``/``java_method`` call any static Java method (read the worker's
environment, and with it the database URL and its password), and a subquery
may read a file (``SELECT ... FROM text.`/etc/passwd```). Neither computes
a row's value from the row, so both are refused, by Spark's own parser:
at submit or the owner's analysis, and again by each worker before it runs
an expression it has not checked (a job row need not come from submit).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from framework.errors import InvalidParams

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Functions that reach outside the row: Java reflection.
FORBIDDEN_FUNCTIONS = frozenset({"reflect", "java_method", "try_reflect"})
# Catalyst nodes that run a query (class names): subqueries of every kind.
_QUERY_NODES = ("Subquery", "Exists", "ListQuery")

_checked: set[str] = set()
_lock = threading.Lock()


def check_spark_expression(spark: SparkSession, expression: str, option: str) -> None:
    """InvalidParams (one line naming ``option``) if ``expression`` calls a
    forbidden function or holds a subquery. A parse error is left to the
    analysis that follows, which words it."""
    with _lock:
        if expression in _checked:
            return
    try:
        parsed = spark._jsparkSession.sessionState().sqlParser().parseExpression(expression)
    except Exception:
        return  # not an expression at all: the caller's analysis says so
    reason = _refused(parsed)
    if reason:
        raise InvalidParams(
            f"{option} {expression!r} {reason}, which reorg refuses: a job's expression "
            "computes a row's value from the row and may not reach the worker's JVM, "
            "files or other tables")
    with _lock:
        _checked.add(expression)


def _refused(node: Any) -> str | None:
    kind = node.getClass().getSimpleName()
    if any(name in kind for name in _QUERY_NODES):
        return "holds a subquery"
    if kind == "UnresolvedFunction":
        name = str(node.nameParts().last()).lower()
        if name in FORBIDDEN_FUNCTIONS:
            return f"calls {name}()"
    children = node.children().iterator()
    while children.hasNext():
        reason = _refused(children.next())
        if reason:
            return reason
    return None
