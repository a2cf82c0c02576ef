"""What indexing the before-images from prepare on costs a forward batch:
``python -m bench.images_index``.

``sql-update`` and ``backfill`` keep before-images of an overwritten column
(``backfill.before_images``); the restore batches of a rollback find them by
key, so the images need an index. It is made when the job is prepared (the
images tables are empty then) and kept up by every batch, instead of built
over all the images when a rollback begins. This benchmark measures what
that costs the forward path: sql-update's real overwrite batch statement
(``backfill.ranged_update.UpdateSql``: the update, its images, its batch
record) on two identical tables, batch for batch, one whose images tables
are indexed and one whose are not, in alternating order, each batch its own
transaction as a worker commits it. It also times building the same indexes
over all the images afterwards: what the first revert used to do in the
owner's fenced transaction.

Figures are ratios measured in the same run (the machine is shared):
indexed batch time / plain batch time, and the late index build against the
batches' total time.

Server: a durable throwaway PostgreSQL (fsync, synchronous_commit and
full_page_writes on, as in production: a commit waits for its WAL flush)
unless ``--db`` is given; ``--fast-server`` turns the three off.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import psycopg

from backfill.ranged_update import UpdateSql
from bench.dataplane.server import add_fast_server, database
from framework.keys import KeySpec


def _bind(statement: str) -> str:
    """SQLAlchemy's ``:name`` placeholders in psycopg's style."""
    for name in ("lo", "hi", "subtask"):
        statement = statement.replace(f":{name}", f"%({name})s")
    return statement


def _setup(conn: psycopg.Connection, name: str, rows: int, *, indexed: bool) -> UpdateSql:
    table = f'"public"."{name}"'
    sql = UpdateSql(table, f'"{name}"', KeySpec(("id",), ("bigint",)), "c", "md5(c)", None,
                    f'"public"."{name}_images"', f'"public"."{name}_batches"')
    conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, b int, c text)")  # type: ignore[arg-type]
    conn.execute(f"INSERT INTO {table} SELECT g, g, md5(g::text) "  # type: ignore[arg-type]
                 "FROM generate_series(1, %s) g", (rows,))
    statements = sql.kept.create("text") + (sql.kept.index_for_restore() if indexed else [])
    for stmt in statements:
        conn.execute(stmt)  # type: ignore[arg-type]
    conn.execute(f"VACUUM ANALYZE {table}")  # type: ignore[arg-type]
    return sql


def _batch(conn: psycopg.Connection, sql: UpdateSql, lo: int, hi: int, subtask: int) -> float:
    started = time.perf_counter()
    with conn.transaction():
        conn.execute(_bind(sql.update()), {"lo": lo, "hi": hi})  # type: ignore[arg-type]
        conn.execute(_bind(sql.record_batch()),  # type: ignore[arg-type]
                     {"lo": lo, "hi": hi, "subtask": subtask})
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.images_index", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in each table")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--db", help="postgresql:// URL of an existing server; "
                                     "default: a throwaway local cluster, durable")
    add_fast_server(parser)
    args = parser.parse_args(argv)
    with (database(args.db, durable=not args.fast_server) as server,
          psycopg.connect(server.url, autocommit=True) as conn):
        conn.execute("DROP TABLE IF EXISTS plain, plain_images, plain_batches, "
                     "indexed, indexed_images, indexed_batches")
        plain = _setup(conn, "plain", args.rows, indexed=False)
        indexed = _setup(conn, "indexed", args.rows, indexed=True)
        times: dict[str, list[float]] = {"plain": [], "indexed": []}
        for n, lo in enumerate(range(1, args.rows + 1, args.batch_rows)):
            hi = lo + args.batch_rows
            pair = [("plain", plain), ("indexed", indexed)]
            for name, sql in pair if n % 2 else reversed(pair):
                times[name].append(_batch(conn, sql, lo, hi, n))
        started = time.perf_counter()
        with conn.transaction():
            for stmt in plain.kept.index_for_restore():
                conn.execute(stmt)  # type: ignore[arg-type]
        late_build = time.perf_counter() - started
        (count,) = conn.execute(f"SELECT count(*) FROM {plain.kept.images}").fetchone()  # type: ignore
    plain_total, indexed_total = sum(times["plain"]), sum(times["indexed"])
    print(f"{len(times['plain'])} batches of {args.batch_rows:,} rows on each table "
          f"({count:,} images)")
    print(f"  images not indexed: {plain_total:.2f} s, median batch "
          f"{statistics.median(times['plain']) * 1000:.1f} ms")
    print(f"  images indexed from prepare on: {indexed_total:.2f} s, median batch "
          f"{statistics.median(times['indexed']) * 1000:.1f} ms")
    print(f"  indexed / not indexed: total {indexed_total / plain_total:.3f}, median "
          f"{statistics.median(times['indexed']) / statistics.median(times['plain']):.3f}")
    print(f"  building the indexes afterwards over all {count:,} images: {late_build:.2f} s "
          f"({late_build / plain_total:.3f} of the unindexed batches' time)")


if __name__ == "__main__":
    main()
