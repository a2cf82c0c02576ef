"""``sql-update`` on tables keyed by other things than one integer column,
against what a user would write instead for the same key, in one run.

    python -m bench.keys [--rows 1000000] [--batch-rows 10000] [--slots 2]

For each key kind (``bigint``, ``uuid``, ``(text, integer)``) a table of
``--rows`` rows gets ``c = md5(b)`` twice, on a throwaway durable local
PostgreSQL:

- reorg: ``sql-update --add-column`` (no before-images: the column is new)
  on one in-process node of ``--slots`` slots; wall time from submit to
  succeeded, warm (the node runs before the submit);
- the baseline: a keyset loop as an expert writes it for a table without an
  integer key, two connections (one per half of the key space, cut at the
  median key): find the key ``--batch-rows`` past the last one, ``UPDATE
  ... WHERE key >= last AND key < it``, commit (for ``bigint`` too, so the
  kinds compare on the same footing).

Prints one JSON object: seconds per kind and contender, and the ratio
reorg / baseline per kind.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import sqlalchemy as sa

from bench.dataplane.server import add_fast_server, database
from bench.dataplane.tracking import run_to_success
from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.submit import SubmitRequest

KINDS = {
    "bigint": ("id bigint PRIMARY KEY", "i", ("id",)),
    "uuid": ("id uuid PRIMARY KEY", "md5(i::text)::uuid", ("id",)),
    "text+int": ("region text, n integer, PRIMARY KEY (region, n)",
                 "(ARRAY['eu', 'us', 'ap'])[i % 3 + 1], i", ("region", "n")),
}


def make_table(url: str, name: str, kind: str, rows: int) -> None:
    columns, key_sql, _ = KINDS[kind]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {name} ({columns}, b bigint)")  # type: ignore[arg-type]
        names = ", ".join(KINDS[kind][2])
        conn.execute(f"INSERT INTO {name} ({names}, b) SELECT {key_sql}, i "  # type: ignore
                     f"FROM generate_series(1, {int(rows)}) i")
        conn.execute(f"VACUUM ANALYZE {name}")  # type: ignore[arg-type]


def keyset_loop(url: str, name: str, kind: str, batch_rows: int) -> float:
    """The user's loop, as an expert writes it for a key of any type: the
    table's key space cut in two at its median key, one connection a half
    (as reorg runs two slots); each finds the key ``batch_rows`` past its
    last one (an index probe), updates the range up to it and commits."""
    cols = KINDS[kind][2]
    key = ", ".join(cols)
    row = f"({key})"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {name} ADD COLUMN c text")  # type: ignore[arg-type]
        (count,) = conn.execute(f"SELECT count(*) FROM {name}").fetchone()  # type: ignore
        median = tuple(conn.execute(f"SELECT {key} FROM {name} ORDER BY {key} "  # type: ignore
                                    f"OFFSET {count // 2} LIMIT 1").fetchone() or ())
    marks = ", ".join(["%s"] * len(cols))

    def half(lo: tuple[Any, ...] | None, hi: tuple[Any, ...] | None) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                above = f"{row} >= ({marks})" if lo is not None else "true"
                below = f"{row} < ({marks})" if hi is not None else "true"
                bounds = (*(lo or ()), *(hi or ()))
                upto = conn.execute(
                    f"SELECT {key} FROM {name} WHERE {above} AND {below} "  # type: ignore
                    f"ORDER BY {key} OFFSET {batch_rows} LIMIT 1", bounds).fetchone()
                end = f"{row} < ({marks})" if upto is not None else below
                with conn.transaction():
                    conn.execute(f"UPDATE {name} SET c = md5(b::text) "  # type: ignore
                                 f"WHERE {above} AND {end}",
                                 (*(lo or ()), *(upto or hi or ())))
                if upto is None:
                    return
                lo = tuple(upto)

    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(half, None, median), pool.submit(half, median, None)]:
            done.result()
    return time.perf_counter() - started


def reorg_run(db: Database, name: str, batch_rows: int) -> float:
    return run_to_success(db, SubmitRequest("sql-update", {
        "table": name, "set": "c=md5(b::text)", "add_column": "c:text"},
        batch_rows=batch_rows, concurrency=64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--db", help="an empty database to use instead of a throwaway server")
    add_fast_server(parser)
    args = parser.parse_args()
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    from framework.node import Node

    report: dict[str, Any] = {"rows": args.rows, "batch_rows": args.batch_rows,
                              "slots": args.slots, "kinds": {}}
    with database(args.db, durable=not args.fast_server) as server:
        url = server.url
        settings = Settings(url)
        db = Database(settings)
        migrate.upgrade(db)
        node = Node(settings, node_id="bench", slots=args.slots, owner_tick_seconds=0.2)
        node.start()
        try:
            for kind in KINDS:
                make_table(url, "loop_t", kind, args.rows)
                baseline = keyset_loop(url, "loop_t", kind, args.batch_rows)
                make_table(url, "reorg_t", kind, args.rows)
                reorg = reorg_run(db, "reorg_t", args.batch_rows)
                with db.begin() as conn:
                    wrong = conn.execute(sa.text(
                        "SELECT count(*) FROM reorg_t WHERE c IS DISTINCT FROM md5(b::text)"
                    )).scalar_one()
                if wrong:
                    raise RuntimeError(f"{kind}: {wrong} rows wrong after reorg's job")
                report["kinds"][kind] = {"reorg_seconds": round(reorg, 2),
                                         "keyset_loop_seconds": round(baseline, 2),
                                         "ratio": round(reorg / baseline, 2)}
                print(kind, report["kinds"][kind], flush=True)
        finally:
            node.drain()
            db.dispose()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
