"""``alter-type --method rewrite`` and ``add-column --method rewrite``: the
same change made by the table-rewrite engine, as a ``rewrite`` job
(``JobType.handed_over``). The table is copied once into a new one with
the change, its indexes built after, changes replayed, every range
verified, then one short swap: the column keeps its place in ``SELECT *``,
no trigger of the table fires, and the job needs the table's size again in
disk until its end. ``--method column`` (the default) changes the table in
place: a shadow column, a backfill UPDATE of every row, a cut-over
(README, "Choosing a method")."""

from __future__ import annotations

from typing import Any

from backfill.tables import check_identifier, quote
from framework.errors import InvalidParams

METHODS = ("column", "rewrite")
REWRITE = "rewrite"


def method(params: dict[str, Any]) -> str:
    value = params.get("method") or "column"
    if value not in METHODS:
        raise InvalidParams(f"--method {value!r}: give column (change the table in place) or "
                            "rewrite (copy it into a new table and swap)")
    return str(value)


def alter_type(params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``ALTER COLUMN c TYPE t [USING e]`` as a rewrite's --alter."""
    if method(params) != REWRITE:
        return None
    column = check_identifier(params.get("column") or "", "--column")
    type_ = (params.get("type") or "").strip()
    if not type_:
        raise InvalidParams("--type is empty; give the column's new type, e.g. bigint")
    using = params.get("using")
    action = f"ALTER COLUMN {quote(column)} TYPE {type_}" + (f" USING {using}" if using else "")
    return REWRITE, {"table": params.get("table"), "alter": action}


def add_column(params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``ADD COLUMN c t [DEFAULT d] [NOT NULL]`` as a rewrite's --alter, its
    value computed from each row by the copy (``--set c=VALUE``)."""
    if method(params) != REWRITE:
        return None
    name, sep, type_ = (params.get("column") or "").partition(":")
    if not sep or not type_.strip():
        raise InvalidParams(f"--column {params.get('column')!r} is not COLUMN:TYPE, "
                            "e.g. --column c:text")
    column = check_identifier(name.strip(), "column")
    value = params.get("value") or ""
    if not value.strip():
        raise InvalidParams("--value is empty; give the expression of the row's columns "
                            "each row gets")
    default = params.get("default")
    action = (f"ADD COLUMN {quote(column)} {type_.strip()}"
              + (f" DEFAULT {default}" if default else "")
              + (" NOT NULL" if params.get("not_null") else ""))
    return REWRITE, {"table": params.get("table"), "alter": action, "sets": [[column, value]]}
