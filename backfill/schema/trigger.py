"""The trigger of a shadow column (TiDB's write-only state): BEFORE INSERT
OR UPDATE of every row, the shadow column is set from the row being written,
so every application write reaches the old and the shadow column in the
same row version (DESIGN 12).

The expression is evaluated over the row as a one-row relation named like
the table (``SELECT expr FROM (SELECT NEW.*) AS items``), so it is written
exactly as in ``UPDATE items SET shadow = expr``: plain column names, or
qualified by the table's name. A value the expression cannot convert makes
the application's write fail, as it would fail after the change: leaving the
shadow column wrong would lose that row at the cut-over."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.schema.sql import run


def install(conn: Connection, *, table: str, table_name: str, function: str, trigger: str,
            shadow: str, expression: str, column: str | None = None) -> None:
    """Create ``function`` (qualified, quoted) and ``trigger`` (quoted) on
    ``table``; ``table_name`` is the table's bare name (quoted), the alias the
    expression may use; ``shadow`` the shadow column (quoted). With
    ``column`` (quoted), ``expression`` is a function of that column alone,
    written with it: it is then evaluated on ``NEW.column`` directly, without
    the one-row relation (cheaper on every application write)."""
    if column is not None:
        value = expression.replace(column, f"NEW.{column}")
    else:
        value = f"(SELECT {expression} FROM (SELECT NEW.*) AS {table_name})"
    run(conn, f"""
        CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $reorg$
        #variable_conflict use_column
        BEGIN
            NEW.{shadow} := {value};
            RETURN NEW;
        END
        $reorg$""")
    conn.execute(text(f"CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE ON {table} "
                      f"FOR EACH ROW EXECUTE FUNCTION {function}()"))


def remove(conn: Connection, *, table: str, function: str, triggers: Iterable[str]) -> None:
    """Drop the trigger (under each of its names, ``triggers``) and its
    function, whichever of them exists."""
    exists = conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": table}).scalar()
    if exists:
        for trigger in triggers:
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger} ON {table}"))
    conn.execute(text(f"DROP FUNCTION IF EXISTS {function}()"))
