"""``alter-type`` against plain ``ALTER TABLE ... ALTER COLUMN ... TYPE``, with
an application writing the whole time::

    python -m bench.alter_type                    # 2,000,000 rows, a throwaway PostgreSQL
    python -m bench.alter_type --rows 200000      # a quick try
    python -m bench.alter_type --db postgresql://me@127.0.0.1:5432/scratch

Each contender changes ``id``, the primary key of ``bench_alter.items (id int,
a int, b text)`` with an index on ``(a, b)``, to bigint, on the same fresh
table. Meanwhile one application thread inserts, updates and deletes single
rows in autocommit, timing every statement: the longest is the time an
application statement waited (the plain ALTER holds ACCESS EXCLUSIVE for its
whole rewrite; alter-type only for the cut-over). Printed: wall time of each,
the ratio against the plain ALTER (measured in the same run, so a loaded
machine slows both), the longest application statement and the statements
run. reorg runs on one in-process node of 2 slots, default job knobs.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import logging
import random
import threading
import time

import psycopg

from bench.dataplane.server import add_fast_server, database
from bench.dataplane.tracking import node_in_process, run_to_success
from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.submit import SubmitRequest

TABLE = "bench_alter.items"


class Writer(threading.Thread):
    """One application session: single-row writes, each statement timed."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop_event = url, threading.Event()
        self.longest, self.statements = 0.0, 0

    def run(self) -> None:
        r = random.Random(1)
        with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as conn:
            top = conn.execute(f"SELECT max(id) FROM {TABLE}").fetchone()[0]  # type: ignore[index]
            while not self.stop_event.is_set():
                roll, key = r.random(), r.randrange(1, top)
                statement = (f"INSERT INTO {TABLE} (a, b) VALUES (%s, 'app')" if roll < 0.4 else
                             f"UPDATE {TABLE} SET b = 'upd' WHERE id = %s" if roll < 0.8 else
                             f"DELETE FROM {TABLE} WHERE id = %s")
                started = time.monotonic()
                conn.execute(statement, (key % 97 if roll < 0.4 else key,))
                self.longest = max(self.longest, time.monotonic() - started)
                self.statements += 1
                self.stop_event.wait(0.005)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)


def make_table(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE SCHEMA IF NOT EXISTS bench_alter; DROP TABLE IF EXISTS {TABLE};
            CREATE TABLE {TABLE} (id serial PRIMARY KEY, a int NOT NULL, b text);
            INSERT INTO {TABLE} (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {rows}) g;
            CREATE INDEX items_a_b ON {TABLE} (a, b)""")
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def plain_alter(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.monotonic()
        conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id TYPE bigint")
        return time.monotonic() - started


def reorg_alter(url: str) -> float:
    with node_in_process(url) as db:
        return run_to_success(db, SubmitRequest(
            "alter-type", {"table": TABLE, "column": "id", "type": "bigint"}))


def run(url: str, rows: int) -> dict[str, tuple[float, float, int]]:
    migrate.upgrade(Database(Settings(url)))
    results = {}
    for name, contender in (("ALTER TABLE ... TYPE", plain_alter), ("reorg alter-type", reorg_alter)):
        make_table(url, rows)
        writer = Writer(url)
        writer.start()
        time.sleep(1)  # the application is running before the change starts
        took = contender(url)
        time.sleep(1)
        writer.finish()
        results[name] = (took, writer.longest, writer.statements)
        print(f"{name}: {took:.1f} s, longest application statement {writer.longest:.3f} s "
              f"({writer.statements} statements)", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--db", help="postgresql:// URL; default: a throwaway server under /tmp")
    add_fast_server(parser)
    args = parser.parse_args()
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # skipped ticks on a busy host
    with database(args.db, durable=not args.fast_server) as server:
        results = run(server.url, args.rows)
    base, _, _ = results["ALTER TABLE ... TYPE"]
    print(f"\n| {args.rows:,} rows, id int -> bigint | wall time | vs plain ALTER "
          "| longest app statement | app statements |\n| --- | --- | --- | --- | --- |")
    for name, (took, longest, statements) in results.items():
        print(f"| {name} | {took:.1f} s | {took / base:.1f}x | {longest * 1000:.0f} ms "
              f"| {statements} |")


if __name__ == "__main__":
    main()
