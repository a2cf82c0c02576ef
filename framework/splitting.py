"""Splitting a table's key space into half-open ranges of equal row counts.

Ranges are cut at every ``rows_per_range``-th key in key order, so skewed or
gappy keys still give ranges of equal work (not equal key width). The cut is
a pure function of the table's keys, hence deterministic (DESIGN 5); the
ranges tile ``[min_key, max_key + 1)`` with no gap and no overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

DEFAULT_ROWS_PER_RANGE = 50_000
MAX_RANGES = 10_000


@dataclass(frozen=True)
class SplitPlan:
    ranges: list[tuple[int, int]]
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
    the SQL in ``plan_split``, used by tests as its oracle)."""
    return list(sorted_keys[::rows_per_range])


def plan_split(
    conn: Connection, table: str, key: str, rows_per_range: int | None = None,
    *, from_key: int | None = None,
) -> SplitPlan:
    """Read the cut points from the table (from ``from_key`` on, when given: the
    tail that arrived after an earlier split). Call inside a REPEATABLE READ
    transaction so the count and the cut points come from one snapshot."""
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


def max_key(conn: Connection, table: str, key: str) -> int | None:
    """The table's largest key: one index probe."""
    value = conn.execute(text(f"SELECT max({key}) FROM {table}")).scalar()
    return int(value) if value is not None else None
