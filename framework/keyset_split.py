"""Splitting a table keyed by anything but one integer column (text, uuid,
numeric, timestamps, several columns) into ranges of equal row counts.

There is no key arithmetic here: every cut is a key of the table itself, read
in the key's own order (row comparisons on the key's btree index). The first
range starts at the smallest key and the last one ends at ``END``, so the
ranges tile the whole key space (DESIGN 5): ``[k0, k1), [k1, k2), ...,
[kn, END)``. Keys arriving during the job past the largest one fall in the
last range, so no catch-up is needed; rows committed below ``k0`` before the
job's prepare commits are taken into the first range by the owner
(``reach_back``, for integer keys too).

- Small tables (up to ``exact_max_rows`` estimated rows) are cut exactly at
  every ``rows_per_range``-th key: a walk of the key index, one probe a cut
  (``OFFSET per`` from the previous cut), or numbered with a window function
  when ranges are small.
- Bigger ones are cut at the quantiles of a repeatable block sample
  (``TABLESAMPLE SYSTEM ... REPEATABLE``: the same table gives the same
  cuts), ``SAMPLE_PAGES_PER_RANGE`` sampled pages a range, so a range's row
  count is right to within about 1/sqrt(that many pages); the integer split's
  second level (equal key widths inside a bucket) has no meaning here.
"""

from __future__ import annotations

import math
from dataclasses import replace

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework.keys import END, Key, KeySpec, decode
from framework.splitting import (
    DEFAULT_ROWS_PER_RANGE,
    EXACT_SPLIT_MAX_ROWS,
    MAX_SAMPLE_ROWS,
    SAMPLE_PAGES_PER_RANGE,
    SAMPLE_WORK_MEM,
    WALK_MIN_ROWS_PER_RANGE,
    SplitPlan,
    plan_integer_split,
    rows_per_range_for,
    table_size,
)


def plan_split(conn: Connection, table: str, key: KeySpec | str, rows_per_range: int | None = None,
               *, from_key: int | None = None,
               exact_max_rows: int = EXACT_SPLIT_MAX_ROWS) -> SplitPlan:
    """The ranges of ``table`` by its key: ``key`` the job's (``Job.key``),
    or the quoted name of a single integer key column. One integer column
    is split by ``splitting`` (``from_key``: only the tail from that key on);
    any other key by keyset (``plan``). Call inside a REPEATABLE READ
    transaction so every read comes from one snapshot (DESIGN 5)."""
    if isinstance(key, KeySpec) and not key.arithmetic:  # no equal key widths to cut
        assert from_key is None, "a key of any type has no tail: its last range is open"
        return plan(conn, table, key, rows_per_range, exact_max_rows)
    column = key.expr() if isinstance(key, KeySpec) else key
    return plan_integer_split(conn, table, column, rows_per_range, from_key=from_key,
                              exact_max_rows=exact_max_rows)


def plan(conn: Connection, table: str, key: KeySpec, rows_per_range: int | None,
         exact_max_rows: int) -> SplitPlan:
    estimate, pages = table_size(conn, table)
    if estimate > exact_max_rows:
        return _sampled(conn, table, key, rows_per_range, estimate, pages)
    per = rows_per_range or DEFAULT_ROWS_PER_RANGE
    if per >= WALK_MIN_ROWS_PER_RANGE:
        walked = _walked(conn, table, key, per)
        if rows_per_range or walked.row_count == 0 or (
                rows_per_range_for(walked.row_count) == per):
            return walked
    return _numbered(conn, table, key, rows_per_range)


def ranges_from_cuts(cuts: list[Key]) -> list[tuple[Key, Key]]:
    """``cuts`` are the first keys of the ranges, in key order; the last
    range ends at ``END``."""
    return list(zip(cuts, [*cuts[1:], END], strict=True))


def _walked(conn: Connection, table: str, key: KeySpec, per: int) -> SplitPlan:
    order, stored = key.order_by(), key.as_stored()
    cuts = [decode(k) for k in conn.execute(
        text(f"""
            WITH RECURSIVE cuts(k) AS (
                (SELECT {stored} FROM {table} ORDER BY {order} LIMIT 1)
                UNION ALL
                SELECT (SELECT {stored} FROM {table}
                        WHERE {key.expr()} >= {key.from_stored("cuts.k")}
                        ORDER BY {order} OFFSET :per LIMIT 1)
                FROM cuts WHERE cuts.k IS NOT NULL)
            SELECT CAST(k AS text) FROM cuts WHERE k IS NOT NULL"""),
        {"per": per},
    ).scalars()]
    if not cuts:
        return SplitPlan([], 0, per)
    last_count = conn.execute(
        text(f"SELECT count(*) FROM {table} WHERE {key.expr()} >= {key.param('last')}"),
        {"last": key.bind(cuts[-1])}).scalar_one()
    return SplitPlan(ranges_from_cuts(cuts), (len(cuts) - 1) * per + int(last_count), per)


def _numbered(conn: Connection, table: str, key: KeySpec,
              rows_per_range: int | None) -> SplitPlan:
    count = int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    per = rows_per_range or rows_per_range_for(count)
    if count == 0:
        return SplitPlan([], 0, per)
    cuts = [decode(k) for k in conn.execute(
        text(f"""
            SELECT CAST(k AS text) FROM (
                SELECT {key.as_stored()} AS k,
                       row_number() OVER (ORDER BY {key.order_by()}) AS rn
                FROM {table}) numbered
            WHERE (rn - 1) % :per = 0 ORDER BY rn"""),
        {"per": per},
    ).scalars()]
    return SplitPlan(ranges_from_cuts(cuts), count, per)


def _sampled(conn: Connection, table: str, key: KeySpec, rows_per_range: int | None,
             estimate: int, pages: int) -> SplitPlan:
    first = conn.execute(
        text(f"SELECT {key.read()} FROM {table} ORDER BY {key.order_by()} LIMIT 1")
    ).scalar()
    per = rows_per_range or rows_per_range_for(estimate)
    if first is None:
        return SplitPlan([], 0, per)
    ranges = max(1, math.ceil(estimate / per))
    rows_per_page = max(estimate / pages, 1.0)
    wanted_pages = min(ranges * SAMPLE_PAGES_PER_RANGE, MAX_SAMPLE_ROWS / rows_per_page)
    percent = min(100.0, 100.0 * wanted_pages / pages)
    conn.execute(text(f"SET LOCAL work_mem = '{SAMPLE_WORK_MEM}'"))
    # Every (sampled / ranges)-th sampled key, in key order, past the first.
    sampled = conn.execute(
        text(f"""
            SELECT CAST(k AS text) FROM (
                SELECT {key.as_stored()} AS k,
                       row_number() OVER (ORDER BY {key.order_by()}) AS rn,
                       count(*) OVER () AS n
                FROM {table} TABLESAMPLE SYSTEM (:percent) REPEATABLE (0)) sample
            WHERE rn > 1 AND (rn - 1) % greatest(n / :ranges, 1) = 0
            ORDER BY rn"""),
        {"percent": percent, "ranges": ranges},
    ).scalars()
    cuts: list[Key] = [decode(first)]
    cuts += [decode(k) for k in sampled][:ranges - 1]
    return SplitPlan(ranges_from_cuts(cuts), estimate, per)


def reach_back(conn: Connection, table: str, key: KeySpec, plan: SplitPlan) -> SplitPlan:
    """``plan`` with its first range starting at the table's smallest key as
    ``conn`` sees it now, when a row below the split's first key (or in a
    table that was empty) was committed after the split's snapshot: no key
    arithmetic makes a "minus infinity" for a text or a uuid, and without
    this such a row lies in no range. One index probe. The owner calls it in
    the transaction that prepares the job and inserts its ranges, for keys
    of every type: an integer key's ranges start at the smallest key too,
    and its catch-up (``framework.catch_up``) looks only past the last range
    (and covers a table that was empty, having no range to look past)."""
    if key.has_tail and not plan.ranges:
        return plan  # catch-up gives an empty table its first range
    where, bounds = "", {}
    if plan.ranges:
        where = f"WHERE {key.expr()} < {key.param('first')}"
        bounds = {"first": key.bind(plan.ranges[0][0])}
    below = conn.execute(
        text(f"SELECT {key.read()} FROM {table} {where} "
             f"ORDER BY {key.order_by()} LIMIT 1"), bounds).scalar()
    if below is None:
        return plan
    if not plan.ranges:
        return replace(plan, ranges=[(decode(below), END)])
    return replace(plan, ranges=[(decode(below), plan.ranges[0][1]), *plan.ranges[1:]])
