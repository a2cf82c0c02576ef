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

    # -- what a key of one integer column does differently ------------------
    # Where a job's behaviour differs by key (not only how its SQL is
    # written), the code asks one of these by name; every rendering
    # difference stays inside this class.

    @property
    def arithmetic(self) -> bool:
        """One column of an integer type: keys are ints and a range has a
        width, which these paths use where other keys cannot:

        - the split cuts a bucket into equal key widths
          (``framework.splitting``); other keys are cut at keys of the table;
        - a batch ends at its last key + 1 (``backfill.batch_bounds``), and a
          dense range's batch is ``[curr, curr + n)`` with no key scan at all
          (``backfill.update_batch``);
        - a rollback finds a batch's record by ``int8range`` overlap
          (``backfill.before_images``); other keys by transaction id;
        - Spark reads the key as a number: it filters and partitions its JDBC
          reads on it, stages it as a number, and one read is cut into
          several batches on the driver (``backfill.spark.pipeline``); other
          keys are read in keyset predicates, one batch a read;
        - a job type without ``keys_of_any_type`` runs only on such keys (it
          may add to them, ``framework.submit``)."""
        return len(self.columns) == 1 and self.types[0] in INTEGER_TYPES

    @property
    def has_tail(self) -> bool:
        """A step's ranges end just past the table's largest key (max + 1),
        so rows inserted with larger keys later fall past the last range and
        get catch-up ranges (``framework.catch_up``); an empty table has no
        range at all until then. A key without arithmetic has no "just past
        the largest key": its last range ends at ``END`` and takes every key
        that arrives later, so nothing is left to catch up."""
        return self.arithmetic

    @property
    def _number(self) -> bool:
        """Stored as a JSON number, compared and bound as a bigint (the form a
        single integer key had before keys of any type, which jobs in flight
        keep): the one rendering difference, decided here alone."""
        return self.arithmetic

    def matches(self, other: KeySpec) -> bool:
        """Rows of a table keyed by ``other`` can be matched with rows keyed
        by this key: the same columns of the same types, or two single
        integer keys of any width (their values compare as numbers; a
        caller that needs the same column name checks it itself)."""
        return self == other or (self._number and other._number)

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

    def renamed(self, prefix: str) -> KeySpec:
        """The key's types under the names ``prefix0``, ``prefix1``, ... (the
        key's columns as a CTE or a work table names them)."""
        return KeySpec.of([f"{prefix}{i}" for i in range(len(self.columns))], self.types)

    def work_key(self) -> KeySpec:
        """The key as a job's work tables hold it (before-images, owned keys,
        copied keys, a batch's stage), in the key's own types: ``k`` for a
        single integer key (the layout from before keys of any type, which
        jobs in flight keep), else ``k0``, ``k1``, ..."""
        return KeySpec(("k",), self.types) if self._number else self.renamed("k")

    # -- stored keys in SQL -------------------------------------------------

    def stored_of(self, values: Sequence[str]) -> str:
        """SQL giving the stored form (jsonb) of the key whose columns' values
        are the SQL expressions ``values``, in the key's order."""
        if self._number:
            return f"to_jsonb({values[0]})"
        return f"jsonb_build_array({', '.join(values)})"

    def as_stored(self, alias: str | None = None) -> str:
        """SQL giving a row's key in its stored form (jsonb for every kind)."""
        return self.stored_of(self.names(alias))

    def read(self, alias: str | None = None) -> str:
        """``as_stored`` as text, for a SELECT list read into Python
        (``decode`` then parses its numbers exactly)."""
        return f"CAST({self.as_stored(alias)} AS text)"

    def read_nth(self, relation: str, where: str, offset: str) -> str:
        """A scalar subquery: the key ``offset`` keys into the rows of
        ``relation`` matching ``where``, in key order, as ``read`` gives it
        (NULL past the last). The stored form is made of the one key found:
        made in the scan, it would be made of every key skipped too (4x the
        scan's own time on a bigint key)."""
        order = self.order_by()
        return (f"(SELECT {self.read('reorg_nth')} FROM (SELECT {order} FROM {relation} "
                f"WHERE {where} ORDER BY {order} OFFSET {offset} LIMIT 1) reorg_nth)")

    def from_stored(self, jsonb_sql: str) -> str:
        """SQL turning a stored key (a jsonb expression) back into the key's
        typed value, comparable with ``expr``."""
        if self._number:
            return f"CAST({jsonb_sql} AS bigint)"
        values = [f"CAST(({jsonb_sql}) ->> {i} AS {t})" for i, t in enumerate(self.types)]
        return values[0] if len(values) == 1 else "(" + ", ".join(values) + ")"

    @property
    def bound_type(self) -> str:
        """The SQL type of a work table's column that holds a key as a batch's
        bound (before-images' batch records): ``bigint`` for a single integer
        key (the layout jobs in flight keep), else the stored form, jsonb."""
        return "bigint" if self._number else "jsonb"

    # -- bind parameters ----------------------------------------------------

    def param(self, name: str) -> str:
        """A bind parameter holding a key (bound with ``bind``), typed."""
        if self._number:
            return f":{name}"
        return self.from_stored(f"CAST(:{name} AS jsonb)")

    def bound_param(self, name: str) -> str:
        """A bind parameter holding a key (bound with ``bind``) as a value of
        ``bound_type``."""
        return f":{name}" if self._number else f"CAST(:{name} AS jsonb)"

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

    def among(self, name: str, alias: str | None = None) -> str:
        """The key is one of the keys bound to ``:name`` (with ``bind_all``)."""
        if self._number:
            return f"{self.expr(alias)} = ANY(CAST(:{name} AS bigint[]))"
        return (f"{self.expr(alias)} IN (SELECT {self._elements()} "
                f"FROM jsonb_array_elements(CAST(:{name} AS jsonb)) AS reorg_e)")

    def bind_all(self, keys: Sequence[Key]) -> Any:
        """The value to bind for ``among``: a list of ints, or one jsonb array."""
        if self._number:
            return [int(k) for k in keys]  # type: ignore[arg-type]
        return "[" + ", ".join(encode(k) for k in keys) + "]"

    def _elements(self, element: str = "reorg_e") -> str:
        """The typed columns of ``element``, one stored key (a JSON array)."""
        return ", ".join(f"CAST({element} ->> {i} AS {t})" for i, t in enumerate(self.types))

    # -- literals, for statements sent without bind parameters ---------------

    def literal(self, key: Key) -> str:
        """SQL for ``key`` written into the statement, comparable with
        ``expr``: for statements that go to the driver as they are (the
        user's ``--using``, ``backfill.schema.sql``) or to Spark's JDBC
        source as a partition's predicate."""
        if self._number:
            return str(int(key))  # type: ignore[arg-type]
        return self.from_stored(f"CAST({sql_string(encode(key))} AS jsonb)")

    def between(self, lo: Key | None, hi: Key | None, alias: str | None = None) -> str:
        """``lo <= key < hi`` with literal bounds; None or ``END``: no bound on
        that side."""
        k = self.expr(alias)
        conds = []
        if lo is not None:
            conds.append(f"{k} >= {self.literal(lo)}")
        if hi is not None and hi is not END:
            conds.append(f"{k} < {self.literal(hi)}")
        return " AND ".join(conds) or "TRUE"

    def among_literal(self, keys: Sequence[Key], alias: str | None = None) -> str:
        """``among`` with the keys written into the statement."""
        if self._number:
            array = "{" + ",".join(str(int(k)) for k in keys) + "}"  # type: ignore[arg-type]
            return f"{self.expr(alias)} = ANY('{array}'::bigint[])"
        array = sql_string("[" + ",".join(encode(k) for k in keys) + "]")
        return (f"{self.expr(alias)} IN (SELECT {self._elements()} "
                f"FROM jsonb_array_elements(CAST({array} AS jsonb)) AS reorg_e)")


def sql_string(value: str) -> str:
    """``value`` as an SQL string literal, read the same whatever
    ``standard_conforming_strings`` says (as psycopg writes one)."""
    quoted = value.replace("'", "''")
    if "\\" in value:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return "'" + quoted + "'"
