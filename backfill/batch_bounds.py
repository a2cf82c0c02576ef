"""Where a batch ends: at most ``n`` keys of a relation from ``curr`` within
its range, for keys of any type (``framework.keys``). Gappy or skewed keys
still give even batches, since the bound is found by counting keys, not by
key arithmetic."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from framework.keys import END, Key, KeySpec, decode


def next_bound(conn: Connection, relation: str, key: KeySpec, curr: Key, end: Key,
               n: int) -> tuple[Key, int]:
    """``(upper, rows)``: the batch is ``[curr, upper)``, the next ``n`` keys
    of ``relation`` (``upper`` is ``end`` when fewer are left); ``rows``: how
    many keys it holds now."""
    if key.arithmetic:  # the bound is the last key + 1: one read of the n keys
        k = key.expr()
        last, count = conn.execute(
            text(f"""
                SELECT max(k), count(*) FROM (
                    SELECT {k} AS k FROM {relation} WHERE {k} >= :curr AND {k} < :end
                    ORDER BY {k} LIMIT :n) batch"""),
            {"curr": curr, "end": end, "n": n},
        ).one()
        if count < n or last is None:
            return end, int(count)
        return int(last) + 1, int(count)
    # The key just past the batch is the next batch's first: [curr, it) holds
    # exactly n keys. Only the last batch of a range needs counting.
    where = key.in_range(None, bounded=end is not END, lo="curr", hi="end")
    bounds = {"curr": key.bind(curr), "end": key.bind(end)}
    after = conn.execute(text(f"SELECT {key.read_nth(relation, where, ':n')}"),
                         {**bounds, "n": n}).scalar()
    if after is not None:
        return decode(after), n
    rows = conn.execute(text(f"SELECT count(*) FROM {relation} WHERE {where}"), bounds).scalar_one()
    return end, int(rows)
