"""Output helpers shared by every command: JSON for scripts, tables and
compact numbers for people (durations are ``framework.durations``', shared
with the owner's log line).

The read commands' tables (``status``, ``events``, ``nodes``, ``history``)
are plain aligned columns (``table_text``), not rich's: importing rich is a
fifth of ``reorg status JOB``'s time (issue 25). rich draws what needs it
(``status --watch``'s live bars, the demo) and its console is made on first
use, so a command that prints JSON, lines or tables never imports it."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

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


class Styled(NamedTuple):
    """A table cell drawn in a style on a terminal (``STYLES``), e.g. a job's
    state in its colour."""

    text: str
    style: str


Cell = str | Styled

# SGR codes of the few styles the tables use.
STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def colour_wanted() -> bool:
    """Styles on a terminal, as rich decides: not in a pipe or a file, not
    with NO_COLOR set or on a dumb terminal."""
    return (sys.stdout.isatty() and "NO_COLOR" not in os.environ
            and os.environ.get("TERM") != "dumb")


def table_text(columns: dict[str, bool], rows: list[tuple[Cell, ...]], *,
               colour: bool = False) -> str:
    """``rows`` under a header of ``columns`` (name -> right-aligned), each
    column as wide as its widest cell, two spaces apart; the header bold and
    styled cells in their style when ``colour``. A cell is one line (line
    breaks become spaces); a row wider than the terminal wraps as the
    terminal wraps it."""
    header = tuple(Styled(name, "bold") for name in columns)
    lines = [header, *rows]
    texts = [[_plain(cell) for cell in line] for line in lines]
    widths = [max(len(row[i]) for row in texts) for i in range(len(columns))]
    out = []
    for line, row in zip(lines, texts, strict=True):
        cells = []
        for cell, text, width, right in zip(line, row, widths, columns.values(), strict=True):
            pad = " " * (width - len(text))
            if colour and isinstance(cell, Styled) and text:
                text = f"\x1b[{STYLES[cell.style]}m{text}\x1b[0m"
            cells.append(pad + text if right else text + pad)
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def _plain(cell: Cell) -> str:
    text = cell.text if isinstance(cell, Styled) else cell
    return " ".join(text.splitlines())


def print_table(columns: dict[str, bool], rows: list[tuple[Cell, ...]]) -> None:
    print(table_text(columns, rows, colour=colour_wanted()))


def print_rows(rows: list[dict[str, Any]], *, as_json: bool, empty: str,
               columns: dict[str, bool], cells: Any) -> None:
    """A read command's output: ``rows`` as JSON for scripts, else ``empty``
    when there are none, else a table with ``columns`` (name -> right-aligned)
    whose row cells ``cells(row)`` gives."""
    if as_json:
        print_json(rows)
    elif not rows:
        print(empty)
    else:
        print_table(columns, [tuple(cells(row)) for row in rows])
