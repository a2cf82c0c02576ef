"""A job's key, of any type: how its columns are named in SQL, how its values
are stored in the system tables, and the predicates of a key range.

A key is the table's primary key, or else a unique index on NOT NULL
columns: one column or several, of an integer type or of another type with a
total order (text, uuid, numeric, date, timestamp, ...).

Stored values (``start_key``, ``end_key``, ``curr_key``: jsonb):

- A single integer key is a JSON number, exactly the bigint it always was;
  its ranges end just past the table's largest key, and rows that arrive
  later get catch-up ranges (``framework.catch_up``).
- Any other key is a JSON array of its columns' values as
  ``jsonb_build_array`` gives them (numbers as numbers, everything else as
  strings in PostgreSQL's output form), read back with ``CAST(k ->> i AS
  type)``. There is no "just past the largest key" for a text or a uuid, so
  a step's last range ends at ``END``, the JSON object ``{}``: jsonb orders
  every object above every array, so the system tables' checks
  (``start_key < end_key``, ``curr_key`` between them) and the checkpoint's
  forward-only test (DESIGN 6) hold for every kind of key; a range ending at
  ``END`` has no upper bound in its SQL.

jsonb compares numbers numerically and strings in the database's default
collation: the order of the key's own columns for every type accepted (text
columns of another collation are refused at submit, ``backfill.tables``).
The job's SQL never relies on jsonb order; it compares the typed values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})


class _End:
    """Past every key: the end of a step's last range for a non-integer key."""

    _instance: _End | None = None

    def __new__(cls) -> _End:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "END"


END: Final = _End()

# A stored key as Python sees it: an int (single integer key), a tuple of the
# columns' JSON values (any other key), or END.
Key = int | tuple[Any, ...] | _End


def encode(key: Key) -> str:
    """The jsonb text of a key, for a bind parameter. Numbers are written
    exactly (a ``numeric`` key's Decimal digit for digit, never a float)."""
    if key is END:
        return "{}"
    if isinstance(key, tuple):
        return "[" + ", ".join(_json_value(v) for v in key) + "]"
    return str(int(key))  # type: ignore[arg-type]


def _json_value(value: Any) -> str:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"a key value of {value} has no JSON form")
        return str(value)
    return json.dumps(value)


def stored_json(key: Key) -> Any:
    """A key as its stored JSON value (for ``--json`` output)."""
    return json.loads(encode(key))


def decode(value: Any) -> Key:
    """A key read back: jsonb text (``KeySpec.read``, ``CAST(... AS text)``),
    or jsonb already parsed by psycopg, whose floats are exact only for
    integers: keys that carry a ``numeric`` are read as text."""
    if isinstance(value, dict):
        return END
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str):  # jsonb read as text (``KeySpec.read``): numbers exact
        if value.isascii() and value.isdigit():  # a single integer key: most keys
            return int(value)
        return decode(_EXACT.decode(value))
    return int(value)


# ``json.loads`` given ``parse_float`` builds a decoder per call: a claim
# decodes three keys per subtask, up to thousands a second on a worker.
_EXACT = json.JSONDecoder(parse_float=Decimal)


def shown(key: Key) -> str:
    """A key for people: ``42``, ``'a1'``, ``('a', 3)`` or ``end``."""
    if key is END:
        return "end"
    if isinstance(key, tuple):
        parts = [repr(v) if isinstance(v, str) else str(v) for v in key]
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"
    return str(key)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class KeySpec:
    """The key columns (unquoted names) and their types (``format_type``)."""

    columns: tuple[str, ...]
    types: tuple[str, ...]

    @classmethod
    def of(cls, columns: Sequence[str], types: Sequence[str]) -> KeySpec:
        return cls(tuple(columns), tuple(types))

    @classmethod
    def integer_column(cls, quoted: str) -> KeySpec:
        """One integer column, by its quoted name (``"id"``)."""
        return cls((quoted[1:-1].replace('""', '"'),), ("bigint",))

    @property
    def integer(self) -> bool:
        """One integer column: keys are numbers, ranges end at max + 1."""
        return len(self.columns) == 1 and self.types[0] in INTEGER_TYPES

    def described(self) -> str:
        """``id bigint`` or ``(region text, id integer)``."""
        parts = [f"{c} {t}" for c, t in zip(self.columns, self.types, strict=True)]
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"

    # -- SQL ------------------------------------------------------------------

    def names(self, alias: str | None = None) -> list[str]:
        prefix = f"{alias}." if alias else ""
        return [prefix + quote(c) for c in self.columns]

    def expr(self, alias: str | None = None) -> str:
        """The key as one value: ``a."id"`` or the row ``(a."r", a."id")``
        (row comparisons walk a multi-column btree index)."""
        names = self.names(alias)
        return names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"

    def order_by(self, alias: str | None = None) -> str:
        return ", ".join(self.names(alias))

    def as_stored(self, alias: str | None = None) -> str:
        """SQL giving a row's key in its stored form (jsonb for every kind)."""
        if self.integer:
            return f"to_jsonb({self.expr(alias)})"
        return f"jsonb_build_array({self.order_by(alias)})"

    def read(self, alias: str | None = None) -> str:
        """``as_stored`` as text, for a SELECT list read into Python
        (``decode`` then parses its numbers exactly)."""
        return f"CAST({self.as_stored(alias)} AS text)"

    def from_stored(self, jsonb_sql: str) -> str:
        """SQL turning a stored key (a jsonb expression) back into the key's
        typed value, comparable with ``expr``."""
        if self.integer:
            return f"CAST({jsonb_sql} AS bigint)"
        values = [f"CAST(({jsonb_sql}) ->> {i} AS {t})" for i, t in enumerate(self.types)]
        return values[0] if len(values) == 1 else "(" + ", ".join(values) + ")"

    def param(self, name: str) -> str:
        """A bind parameter holding a key (bound with ``bind``), typed."""
        if self.integer:
            return f":{name}"
        return self.from_stored(f"CAST(:{name} AS jsonb)")

    @staticmethod
    def bind(key: Key) -> Any:
        """The value to bind for ``param``: the int itself, or jsonb text."""
        if isinstance(key, int) and not isinstance(key, bool):
            return key
        return encode(key)

    def in_range(self, alias: str | None, *, bounded: bool = True, lo: str = "lo",
                 hi: str = "hi") -> str:
        """``key >= :lo AND key < :hi``; without the upper bound for a range
        that ends at ``END`` (``bounded=False``)."""
        k = self.expr(alias)
        lower = f"{k} >= {self.param(lo)}"
        return f"{lower} AND {k} < {self.param(hi)}" if bounded else lower
