"""Output helpers shared by every command: JSON for scripts, compact numbers
for people (durations are ``framework.durations``', shared with the owner's
log line). rich's console is made on first use: a command that prints JSON
or plain lines never imports rich."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


class LazyConsole:
    """rich's ``Console``, made when first printed to; ``get()`` is the
    console itself (for rich's own classes that take one)."""

    def __init__(self) -> None:
        self._console: Console | None = None

    def get(self) -> Console:
        if self._console is None:
            from rich.console import Console

            # Piped output is read by people in logs and pagers, not cut to a
            # terminal: rich would otherwise wrap every table at 80 columns.
            width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
            self._console = Console(highlight=False, width=width)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


console = LazyConsole()

_QUOTED_NAME = re.compile(r'"((?:[^"]|"")*)"')


def print_json(value: Any) -> None:
    print(json_text(value))


def json_text(value: Any) -> str:
    """``value`` as every ``--json`` prints it (and the dashboard's ``/api/``
    answers): times in ISO 8601, intervals in seconds, decimals as numbers."""
    return json.dumps(value, default=_json_default, indent=2)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


def table_name(quoted: str) -> str:
    """``"public"."items"`` as users write it: ``public.items``."""
    parts = _QUOTED_NAME.findall(quoted)
    return ".".join(p.replace('""', '"') for p in parts) if parts else quoted


def count(n: int | float | Decimal | None) -> str:
    return "-" if n is None else f"{int(n):,}"


def rate(per_sec: float | None) -> str:
    return "-" if not per_sec else f"{per_sec:,.0f}"


def print_rows(rows: list[dict[str, Any]], *, as_json: bool, empty: str,
               columns: dict[str, bool], cells: Any) -> None:
    """A read command's output: ``rows`` as JSON for scripts, else ``empty``
    when there are none, else a table with ``columns`` (name -> right-aligned)
    whose row cells ``cells(row)`` gives."""
    from rich.table import Table

    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(empty)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, right in columns.items():
        table.add_column(name, overflow="fold", justify="right" if right else "left")
    for row in rows:
        table.add_row(*cells(row))
    console.print(table)
