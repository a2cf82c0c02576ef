"""Splitting a table's key space into half-open ranges of equal row counts.

Ranges are cut at every ``rows_per_range``-th key in key order, so skewed or
gappy keys still give ranges of equal work (not equal key width). The cut is
a pure function of the table's keys, hence deterministic (DESIGN 5); the
ranges tile ``[min_key, max_key + 1)`` with no gap and no overlap.

A table estimated above ``EXACT_SPLIT_MAX_ROWS`` is not read whole. A block
sample (``TABLESAMPLE SYSTEM ... REPEATABLE``, so the same table gives the
same cuts) between its exact smallest and largest keys (two index probes)
gives it in two levels:

- buckets: quantiles of the sample, each bucket holding the same number of
  sampled rows from at least ``SAMPLED_PAGES_PER_BUCKET`` sampled pages. A
  block sample's information is in its pages, not its rows (a page holds
  neighbouring keys), so a bucket's row count is right to within about
  1/sqrt(that many pages): ~7 %, where cutting each range at the sample's
  own quantiles would give ranges of a few sampled pages, ±35 % and worse;
- ranges: each bucket refined into its share of the ranges at equal key
  widths, exact where keys are dense within a bucket (serial and identity
  keys), while the buckets follow skew at the coarse level.

Ranges stay a tiling of ``[min, max + 1)``; a sample of the whole table
(small tables, tests) cuts every range at the sample's exact quantiles.

Where the keys fill their span (serial and identity keys: the analysed row
count is at least ``DENSE_KEYS_SHARE`` of ``max - min + 1``), no sample is
read: the span is cut at equal key widths, which is what the buckets'
refinement would give, from two index probes. A range of ``w`` unique
integer keys never holds more than ``w`` rows, so however the missing keys
lie, no range holds more than ``1 / DENSE_KEYS_SHARE`` times its share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework.keys import Key

DEFAULT_ROWS_PER_RANGE = 50_000
MAX_RANGES = 10_000


@dataclass(frozen=True)
class SplitPlan:
    ranges: Sequence[tuple[Key, Key]]  # ints for one integer key (framework.keys)
    row_count: int
    rows_per_range: int


def rows_per_range_for(row_count: int, target: int = DEFAULT_ROWS_PER_RANGE,
                       max_ranges: int = MAX_RANGES) -> int:
    """The target range size, grown where needed so no job has more than
    ``max_ranges`` subtasks."""
    return max(target, math.ceil(row_count / max_ranges), 1)


def ranges_from_boundaries(boundaries: Sequence[int], max_key: int) -> list[tuple[int, int]]:
    """``boundaries`` are the sorted first keys of each range; the last range
    ends just past ``max_key``."""
    ends = [*boundaries[1:], max_key + 1]
    return list(zip(boundaries, ends, strict=True))


def boundaries_of(sorted_keys: Sequence[int], rows_per_range: int) -> list[int]:
    """Every ``rows_per_range``-th key, starting with the first (pure twin of
    the SQL in ``plan_integer_split``, used by tests as its oracle)."""
    return list(sorted_keys[::rows_per_range])


# Above this estimate the split comes from a block sample: walking the key
# index reads all of it in the owner's prepare, which the job waits for
# (docs/benchmarks.md, "Splitting a table"). Small tables keep the exact cut
# at every N-th key, where the walk costs little.
EXACT_SPLIT_MAX_ROWS = 100_000
# Pages sampled per range wanted (capped by MAX_SAMPLE_ROWS rows in all).
SAMPLE_PAGES_PER_RANGE = 50
MAX_SAMPLE_ROWS = 2_000_000
# Sampled pages per bucket: a bucket's row count is right to within about
# 1/sqrt(this), so ~7 %.
SAMPLED_PAGES_PER_BUCKET = 200
SAMPLE_WORK_MEM = "160MB"  # sorts MAX_SAMPLE_ROWS keys in memory
# Keys holding at least this share of their span are cut at equal widths
# from the min and max probes, without a sample: a sample reads pages at
# random, seconds of the owner's prepare at 100M rows (docs/benchmarks.md,
# "Splitting a table").
DENSE_KEYS_SHARE = 0.9


def plan_integer_split(
    conn: Connection, table: str, key: str, rows_per_range: int | None = None,
    *, from_key: int | None = None, exact_max_rows: int = EXACT_SPLIT_MAX_ROWS,
) -> SplitPlan:
    """The ranges of ``table`` by its single integer key column ``key``
    (quoted), from ``from_key`` on when given (the tail that arrived after
    an earlier split, always read exactly). A key of any type:
    ``framework.keyset_split.plan_split``. Call inside a REPEATABLE READ
    transaction so every read comes from one snapshot."""
    if from_key is None:
        estimate, pages, analysed = _table_size(conn, table)
        if estimate > exact_max_rows:
            return _sampled_split(conn, table, key, rows_per_range, estimate, pages,
                                  dense_if_so=analysed)
    return _exact_split(conn, table, key, rows_per_range, from_key)


def table_size(conn: Connection, table: str) -> tuple[int, int]:
    """(rows, pages) as the planner estimates them (no scan); from the table's
    size on disk when it was never analysed."""
    rows, pages, _ = _table_size(conn, table)
    return rows, pages


def _table_size(conn: Connection, table: str) -> tuple[int, int, bool]:
    """``table_size``, and whether the row count comes from an ANALYZE (or a
    VACUUM) rather than from the size on disk."""
    reltuples, size = conn.execute(
        text("SELECT reltuples, pg_relation_size(CAST(:t AS regclass)) FROM pg_class "
             "WHERE oid = CAST(:t AS regclass)"), {"t": table}).one()
    pages = max(int(size) // 8192, 1)
    if reltuples >= 0:
        return int(reltuples), pages, True
    return int(size) // 100, pages, False


# From this range size on, the exact split walks the key index one cut at a
# time (each probe skips ``per`` entries of it, an index-only scan) instead of
# counting and numbering every key with a window function, several times
# slower (docs/benchmarks.md, "Splitting a table"). Below it the probes' own
# start-up cost dominates (100,000 ranges of 5 keys), and the window function
# stays.
WALK_MIN_ROWS_PER_RANGE = 1_000


def _exact_split(conn: Connection, table: str, key: str, rows_per_range: int | None,
                 from_key: int | None) -> SplitPlan:
    per = rows_per_range or DEFAULT_ROWS_PER_RANGE
    if per >= WALK_MIN_ROWS_PER_RANGE:
        plan = _walked_split(conn, table, key, per, from_key)
        # A table far bigger than its estimate: the range size must grow with
        # the count (``rows_per_range_for``), so cut again at that size.
        if rows_per_range or plan.row_count == 0 or (
                rows_per_range_for(plan.row_count) == per):
            return plan
    return _numbered_split(conn, table, key, rows_per_range, from_key)


def _walked_split(conn: Connection, table: str, key: str, per: int,
                  from_key: int | None) -> SplitPlan:
    """Every ``per``-th key from the first (``boundaries_of``), found by index
    probes: each cut is the key ``per`` entries past the one before. The row
    count follows: ``per`` per range but the last, which is counted."""
    start = f"WHERE {key} >= :from_key" if from_key is not None else ""
    bound = {"from_key": from_key} if from_key is not None else {}
    boundaries = [int(k) for k in conn.execute(
        text(f"""
            WITH RECURSIVE cuts(k) AS (
                SELECT min({key}) FROM {table} {start}
                UNION ALL
                SELECT (SELECT {key} FROM {table} WHERE {key} >= cuts.k
                        ORDER BY {key} OFFSET :per LIMIT 1)
                FROM cuts WHERE cuts.k IS NOT NULL)
            SELECT k FROM cuts WHERE k IS NOT NULL"""),
        {"per": per, **bound},
    ).scalars()]
    if not boundaries:
        return SplitPlan([], 0, per)
    last_count, max_key = conn.execute(
        text(f"SELECT count(*), max({key}) FROM {table} WHERE {key} >= :last"),
        {"last": boundaries[-1]}).one()
    if from_key is not None:
        boundaries[0] = from_key  # the tail starts where the covered ranges end
    count = (len(boundaries) - 1) * per + int(last_count)
    return SplitPlan(ranges_from_boundaries(boundaries, int(max_key)), count, per)


def _numbered_split(conn: Connection, table: str, key: str, rows_per_range: int | None,
                    from_key: int | None) -> SplitPlan:
    tail = f"WHERE {key} >= :from_key" if from_key is not None else ""
    bound = {"from_key": from_key} if from_key is not None else {}
    count, max_key = conn.execute(
        text(f"SELECT count(*), max({key}) FROM {table} {tail}"), bound).one()
    if count == 0:
        return SplitPlan([], 0, rows_per_range or DEFAULT_ROWS_PER_RANGE)
    per = rows_per_range or rows_per_range_for(count)
    boundaries = list(conn.execute(
        text(f"""
            SELECT k FROM (
                SELECT {key} AS k, row_number() OVER (ORDER BY {key}) AS rn
                FROM {table} {tail}
            ) numbered
            WHERE (rn - 1) % :per = 0 ORDER BY k"""),
        {"per": per, **bound},
    ).scalars())
    if from_key is not None:
        boundaries[0] = from_key  # the tail starts where the covered ranges end
    return SplitPlan(ranges_from_boundaries(boundaries, max_key), count, per)


def _sampled_split(conn: Connection, table: str, key: str, rows_per_range: int | None,
                   estimate: int, pages: int, *, dense_if_so: bool) -> SplitPlan:
    """``dense_if_so``: the estimate is an analysed row count, so keys that
    fill their span by it are cut at equal widths without a sample."""
    low, high = conn.execute(text(f"SELECT min({key}), max({key}) FROM {table}")).one()
    if low is None:
        return SplitPlan([], 0, rows_per_range or DEFAULT_ROWS_PER_RANGE)
    per = rows_per_range or rows_per_range_for(estimate)
    ranges = max(1, math.ceil(estimate / per))
    if dense_if_so and estimate >= DENSE_KEYS_SHARE * (int(high) - int(low) + 1):
        boundaries = refine_buckets([int(low), int(high) + 1], ranges)
        return SplitPlan(ranges_from_boundaries(boundaries, int(high)), estimate, per)
    rows_per_page = max(estimate / pages, 1.0)
    wanted_pages = min(ranges * SAMPLE_PAGES_PER_RANGE, MAX_SAMPLE_ROWS / rows_per_page)
    percent = min(100.0, 100.0 * wanted_pages / pages)
    buckets = ranges if percent >= 100.0 else max(
        1, min(ranges, int(pages * percent / 100.0) // SAMPLED_PAGES_PER_BUCKET))
    # The first sampled key of each bucket but the first: one sort of the
    # sample (percentile_disc), in memory (a sample of MAX_SAMPLE_ROWS keys
    # spilled to disk at the default work_mem and took seconds).
    conn.execute(text(f"SET LOCAL work_mem = '{SAMPLE_WORK_MEM}'"))
    cuts = conn.execute(
        text(f"""
            SELECT percentile_disc(CAST(:fractions AS float8[])) WITHIN GROUP (ORDER BY k)
            FROM (SELECT {key} AS k FROM {table}
                  TABLESAMPLE SYSTEM (:percent) REPEATABLE (0)) sample"""),
        {"percent": percent, "fractions": [i / buckets for i in range(1, buckets)]},
    ).scalar() or []
    edges = [int(low)]
    for cut in cuts:
        if edges[-1] < cut <= high:
            edges.append(int(cut))
    edges.append(int(high) + 1)
    boundaries = refine_buckets(edges, ranges)
    return SplitPlan(ranges_from_boundaries(boundaries, int(high)), estimate, per)


def refine_buckets(edges: Sequence[int], ranges: int) -> list[int]:
    """The first keys of ``ranges`` ranges over the buckets ``[edges[i],
    edges[i + 1])`` (each estimated to hold the same number of rows): each
    bucket gets its share of the ranges, cut at equal key widths (fewer where
    the bucket holds fewer keys than ranges). Pure, so deterministic."""
    buckets = len(edges) - 1
    boundaries: list[int] = []
    for i in range(buckets):
        lo, hi = edges[i], edges[i + 1]
        share = round((i + 1) * ranges / buckets) - round(i * ranges / buckets)
        share = max(1, min(share, hi - lo))
        boundaries += [lo + (hi - lo) * j // share for j in range(share)]
    return boundaries


def max_key(conn: Connection, table: str, key: str) -> int | None:
    """The table's largest key: one index probe."""
    value = conn.execute(text(f"SELECT max({key}) FROM {table}")).scalar()
    return int(value) if value is not None else None
