"""How the owner cuts a key space (``framework/splitting.py``,
``framework/keyset_split.py``), each way timed in-process on a durable
server: the figures behind docs/benchmarks.md, "Splitting a table".

    python -m bench.split [--db URL] [--rows 2000000] [--repeats 5]

Three tables of ``--rows`` rows, analysed, each with its key indexed:

    dense    bigint keys 1 .. n: equal key widths from two index probes
             (``DENSE_KEYS_SHARE``), against the block sample the same
             table would get were its keys not dense
    sparse   bigint keys 1, 3, 5, ... (half their span): the block sample
             (``EXACT_SPLIT_MAX_ROWS`` and up), and the exact split of the
             same table forced: the index walk (``WALK_MIN_ROWS_PER_RANGE``
             and up) against numbering every key with a window function
    text     a text key: the keyset sample, and the exact keyset walk

Each figure is the median of ``--repeats`` runs after one warm-up run (the
table and its index in the server's buffers or the OS's cache), each in a
REPEATABLE READ transaction as the owner's; plus how even the sample's
ranges are (a count of rows in 25 of them). A split only reads; durability
matters to it only through what else the server does.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bench.dataplane.server import database, execute, server_kind, tool_parser
from framework import keyset_split, splitting
from framework.db import sqlalchemy_url
from framework.keys import END, KeySpec

SCHEMA = "bench_split"
COUNTED = 25  # ranges whose rows are counted for the evenness figure
TEXT_KEY = KeySpec.of(["k"], ["text"])


def build(url: str, rows: int) -> None:
    execute(url, f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE", f"CREATE SCHEMA {SCHEMA}",
            f"CREATE TABLE {SCHEMA}.dense AS SELECT g::bigint AS id, md5(g::text) AS b "
            f"FROM generate_series(1, {rows}) g",
            f"CREATE TABLE {SCHEMA}.sparse AS SELECT (2 * g - 1)::bigint AS id, "
            f"md5(g::text) AS b FROM generate_series(1, {rows}) g",
            f"CREATE TABLE {SCHEMA}.texts AS SELECT md5(g::text) AS k, g AS n "
            f"FROM generate_series(1, {rows}) g",
            f"ALTER TABLE {SCHEMA}.dense ADD PRIMARY KEY (id)",
            f"ALTER TABLE {SCHEMA}.sparse ADD PRIMARY KEY (id)",
            f"ALTER TABLE {SCHEMA}.texts ADD PRIMARY KEY (k)",
            f"VACUUM (ANALYZE) {SCHEMA}.dense, {SCHEMA}.sparse, {SCHEMA}.texts")


def timed(engine: sa.Engine, split: Callable[[Connection], splitting.SplitPlan],
          repeats: int) -> tuple[float, splitting.SplitPlan]:
    """Median seconds of ``split`` over ``repeats`` runs after a warm-up."""
    seconds = []
    plan = None
    for n in range(repeats + 1):
        with engine.connect() as conn, conn.begin():
            conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            began = time.perf_counter()
            plan = split(conn)
            if n:
                seconds.append(time.perf_counter() - began)
    assert plan is not None
    return statistics.median(seconds), plan


def evenness(engine: sa.Engine, table: str, key: KeySpec, plan: splitting.SplitPlan) -> str:
    """Rows in COUNTED of the plan's ranges, against the median of them."""
    ranges = list(plan.ranges)
    picked = ranges[:: max(len(ranges) // COUNTED, 1)][:COUNTED]
    with engine.connect() as conn:
        counts = [int(conn.execute(sa.text(
            f"SELECT count(*) FROM {table} WHERE {key.in_range(None, bounded=hi is not END)}"),
            {"lo": key.bind(lo), "hi": None if hi is END else key.bind(hi)}).scalar_one())
            for lo, hi in picked]
    mid = statistics.median(counts)
    return (f"rows in {len(counts)} of {len(ranges):,} ranges: min {min(counts):,} "
            f"({min(counts) / mid:.2f}x the median), median {mid:,.0f}, max {max(counts):,} "
            f"({max(counts) / mid:.2f}x)")


def measure(engine: sa.Engine, repeats: int) -> list[tuple[str, float, splitting.SplitPlan]]:
    dense, sparse, texts = (f"{SCHEMA}.{t}" for t in ("dense", "sparse", "texts"))
    exact = 10**12  # exact_max_rows above any table: the exact split forced
    cases: list[tuple[str, Callable[[Connection], Any]]] = [
        ("dense bigint: equal widths from two probes (the default)",
         lambda c: splitting.plan_integer_split(c, dense, "id", exact_max_rows=0)),
        ("dense bigint: block sample (as if not dense)",
         lambda c: splitting._sampled_split(c, dense, "id", None, *splitting.table_size(
             c, dense), dense_if_so=False)),
        ("sparse bigint: block sample (the default)",
         lambda c: splitting.plan_integer_split(c, sparse, "id", exact_max_rows=0)),
        ("sparse bigint: exact, index walk",
         lambda c: splitting.plan_integer_split(c, sparse, "id", exact_max_rows=exact)),
        ("sparse bigint: exact, window function",
         lambda c: splitting._numbered_split(c, sparse, "id", None, None)),
        ("text key: keyset block sample (the default)",
         lambda c: keyset_split.plan_split(c, texts, TEXT_KEY, exact_max_rows=0)),
        ("text key: exact, keyset index walk",
         lambda c: keyset_split.plan_split(c, texts, TEXT_KEY, exact_max_rows=exact)),
    ]
    results = []
    for label, split in cases:
        seconds, plan = timed(engine, split, repeats)
        results.append((label, seconds, plan))
        print(f"    {label}: {seconds * 1000:,.1f} ms, {len(plan.ranges):,} ranges", flush=True)
    return results


def main() -> None:
    parser = tool_parser("bench.split", __doc__, rows=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with database(args.db, durable=not args.fast_server) as server:
        print(f"building three tables of {args.rows:,} rows "
              f"({'the --db server' if args.db else server_kind(args.fast_server)})", flush=True)
        build(server.url, args.rows)
        engine = sa.create_engine(sqlalchemy_url(server.url), poolclass=sa.pool.NullPool)
        try:
            results = measure(engine, args.repeats)
            by_label = {label: plan for label, _, plan in results}
            for label, table, key in (
                    ("sparse bigint: block sample (the default)", f"{SCHEMA}.sparse",
                     KeySpec.integer_column('"id"')),
                    ("text key: keyset block sample (the default)", f"{SCHEMA}.texts", TEXT_KEY)):
                print(f"    {label}: {evenness(engine, table, key, by_label[label])}", flush=True)
        finally:
            engine.dispose()
            execute(server.url, f"DROP SCHEMA {SCHEMA} CASCADE")
    print(f"\n| {args.rows:,} rows, median of {args.repeats} | ms | ranges |\n| --- | ---: | ---: |")
    for label, seconds, plan in results:
        print(f"| {label} | {seconds * 1000:,.1f} | {len(plan.ranges):,} |")


if __name__ == "__main__":
    main()
