"""The duplicate-key search of ``add-index --unique``, before any index exists.

Two rows with the same key may sit anywhere in the table, so ranges of the
primary key cannot be checked on their own: a duplicate whose rows fall in
two ranges would go unseen. Instead the table's rows are split by a hash of
the index key into buckets, one subtask each: equal keys hash alike, so every
duplicate has both rows in one bucket, and each subtask finds the duplicates
of its bucket with one GROUP BY (a sort or a hash spilling to disk, never all
keys in memory at once). Each bucket reads the table once; PostgreSQL's
synchronised sequential scans let the buckets running together share the
reads. ``hash_record_extended`` hashes with each type's own hash function,
which agrees with its equality (numeric 1.0 = 1.00, ...); a key of a type
without one is checked as one bucket.

Nothing here ranges over the table's own key, so the search is the same on
a table keyed by anything (``framework.keys``); the key only names the
first rows of each duplicate (``keys.shown``: ``7``, ``'a1'``, ``('eu', 3)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.expressions import embed
from backfill.tables import quote
from framework.keys import Key, KeySpec, decode, shown

# Rows per bucket aimed at, and the most buckets a job gets.
ROWS_PER_BUCKET = 2_000_000
MAX_BUCKETS = 16
# Duplicate keys named in the job's error.
SHOWN = 3


@dataclass(frozen=True)
class Duplicate:
    key: str  # the index key as PostgreSQL prints a row, e.g. (1,x)
    rows: int
    first_keys: list[Key]  # the table's keys of the first rows holding it


def bucket_count(conn: Connection, table: str, hashable: bool,
                 rows_per_bucket: int | None = None) -> int:
    """How many buckets: by the planner's row estimate (no scan), of about
    ``rows_per_bucket`` rows each (``--rows-per-subtask``)."""
    if not hashable:
        return 1
    rows = conn.execute(text("SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = "
                             "CAST(:t AS regclass)"), {"t": table}).scalar() or 0
    per_bucket = max(1, rows_per_bucket or ROWS_PER_BUCKET)
    return int(min(MAX_BUCKETS, max(1, -(-int(rows) // per_bucket))))


def key_is_hashable(conn: Connection, table: str, columns: list[str]) -> bool:
    """Whether every key column's type has a default hash operator class."""
    missing = conn.execute(text("""
        SELECT count(*) FROM pg_attribute a
        WHERE a.attrelid = CAST(:t AS regclass) AND a.attname = ANY(:cols)
          AND NOT EXISTS (
            SELECT 1 FROM pg_opclass o JOIN pg_am m ON m.oid = o.opcmethod
            WHERE m.amname = 'hash' AND o.opcdefault
              AND o.opcintype IN (a.atttypid, (SELECT typbasetype FROM pg_type
                                               WHERE oid = a.atttypid)))"""),
        {"t": table, "cols": columns}).scalar()
    return not missing


def find_duplicates(conn: Connection, *, table: str, key: KeySpec, columns: list[str],
                    where: str | None, bucket: int, buckets: int) -> list[Duplicate]:
    """The first duplicate keys of one bucket (at most ``SHOWN``). Rows with a
    NULL in the key never clash in a unique index, so they are left out."""
    cols = ", ".join(quote(c) for c in columns)
    not_null = " AND ".join(f"{quote(c)} IS NOT NULL" for c in columns)
    in_bucket = ("TRUE" if buckets == 1 else
                 f"(hash_record_extended(ROW({cols}), 0) & 9223372036854775807) % {int(buckets)}"
                 f" = {int(bucket)}")
    # Keys in their stored form (jsonb, framework.keys); the duplicates in
    # the order of their first row's key, compared as the key's own values
    # (a row of them for several columns).
    order = key.order_by()
    found = conn.execute(text(f"""
        SELECT CAST(ROW({cols}) AS text), count(*),
               to_jsonb((array_agg({key.as_stored()} ORDER BY {order}))[1:3])
        FROM {table}
        WHERE {not_null} AND {in_bucket} AND {embed(where or 'TRUE')}
        GROUP BY {cols} HAVING count(*) > 1
        ORDER BY (array_agg({key.expr()} ORDER BY {order}))[1] LIMIT {SHOWN}""")).all()
    return [Duplicate(row[0], int(row[1]), [decode(k) for k in row[2]]) for row in found]


def describe(found: list[Duplicate], columns: list[str]) -> str:
    """The one line a job fails with: the first duplicate keys and their rows."""
    named = "; ".join(f"({', '.join(columns)})={d.key} in {d.rows} rows "
                      f"(keys {', '.join(map(shown, d.first_keys))}"
                      f"{', ...' if d.rows > len(d.first_keys) else ''})" for d in found)
    return (f"duplicate keys, no unique index can be built: {named}; remove the duplicates "
            "or submit without --unique")
