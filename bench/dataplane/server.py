"""The PostgreSQL server the benchmark runs on (a throwaway cluster or --db),
its table, the reset that puts the table into one physical state before every
contender, and the checks after it."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.dataplane.errors import BenchError
from bench.dataplane.records import TABLE


@dataclass
class Server:
    url: str
    log_file: Path | None  # the server log, when we started the server ourselves
    postmaster: int | None  # its pid, likewise


def tool_parser(module: str, doc: str | None, *, rows: int) -> argparse.ArgumentParser:
    """The parser a data-plane tool starts from: ``python -m MODULE``, the
    first paragraph of its docstring, ``--rows`` of ``TABLE`` and ``--db``
    (``database``'s URL)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}",
                                     description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--db", help="postgresql:// URL of an existing server; default: a "
                        "throwaway local cluster, durable")
    add_fast_server(parser)
    return parser


def add_fast_server(parser: argparse.ArgumentParser) -> None:
    """``--fast-server``: the throwaway cluster without durability. Durable
    is the default because a batch's commit costs a WAL flush in
    production, for reorg and every baseline alike; without it commits are
    cheap and per-batch costs look smaller than they are."""
    parser.add_argument("--fast-server", action="store_true",
                        help="start the throwaway cluster with fsync, synchronous_commit and "
                             "full_page_writes off (faster commits, unlike production; "
                             "default: durable)")


def server_kind(fast: bool) -> str:
    """How a report names the throwaway cluster."""
    return ("throwaway local cluster, durability off (--fast-server)" if fast
            else "throwaway local cluster, durable (fsync, synchronous_commit, full_page_writes)")


@contextlib.contextmanager
def database(url: str | None, *, durable: bool = True) -> Iterator[Server]:
    """The server at ``url``, or a throwaway local cluster (its data
    directory deleted after): durable (fsync, synchronous_commit and
    full_page_writes on, as in production) unless ``durable`` is False
    (``--fast-server``; ``framework.localpg``)."""
    if url:
        yield Server(url, None, None)
        return
    from framework.localpg.cluster import LocalPostgres

    data_dir = Path(tempfile.mkdtemp(prefix="reorg-bench-", dir="/tmp"))
    cluster = LocalPostgres(data_dir, durable=durable)
    try:
        cluster.init()
        cluster.start()
        print(f"PostgreSQL ({'durable' if durable else 'durability off'}) at {cluster.url()}, "
              f"data in {data_dir}", file=sys.stderr, flush=True)  # stdout: the tool's figures
        pid = int((cluster.pgdata / "postmaster.pid").read_text().split()[0])
        yield Server(cluster.url(), cluster.log_file, pid)
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def query_one(url: str, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return tuple(row)


def build_table(url: str, rows: int, *, autovacuum: bool = True) -> None:
    """``TABLE`` with ``rows`` rows. ``autovacuum=False`` for contenders that
    take turns on it, each after ``reset_table``: an autovacuum of the rows
    one contender leaves dead would land in whichever contender its naptime
    tick falls on (the reset vacuums instead)."""
    execute(url,
            "CREATE SCHEMA IF NOT EXISTS bench",
            f"DROP TABLE IF EXISTS {TABLE}",
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, a int, b text, c text)",
            f"INSERT INTO {TABLE} SELECT g, g % 1000, 'item ' || g, NULL "
            f"FROM generate_series(1, {int(rows)}) g")
    if not autovacuum:
        execute(url, f"ALTER TABLE {TABLE} SET (autovacuum_enabled = off)")


# What the table's c holds before an "overwrite" contender: a value every row
# has (so a job keeping before-images keeps one per row), as long as md5(b).
OLD_VALUE_SQL = "'old ' || md5(a::text)"


def reset_table(url: str, *, old_values: bool = False) -> None:
    """Put the table into the state it had right after loading, whatever the
    previous contender did: c all NULL (``old_values``: ``OLD_VALUE_SQL`` in
    every row), no column d (an ``--add-column`` contender adds it). The table
    is loaded again from itself into a new one in key order, with a fresh
    primary-key index, so no contender inherits the dead tuples and free
    space of the one before. A new table, not ``DROP COLUMN d``: a dropped
    column stays an attribute of every row written after it, and from the
    ninth attribute on the null bitmap makes each row's header 32 bytes
    instead of 24, so the fifth ``--add-column`` of a run wrote ~9 % more
    bytes than chunked SQL before it. Then the visibility map set (VACUUM)
    and fresh statistics (ANALYZE); CHECKPOINT writes out the dirty buffers,
    so nobody pays for the previous contender's writes. The table stays in
    the OS page cache for all of them alike."""
    fill = OLD_VALUE_SQL if old_values else "NULL"
    schema, name = TABLE.split(".")
    fresh = f"{schema}.{name}_reset"
    options = query_one(url, "SELECT coalesce(array_to_string(reloptions, ', '), '') "
                             "FROM pg_class WHERE oid = %s::regclass", (TABLE,))[0]
    execute(url,
            f"DROP TABLE IF EXISTS {fresh}",
            f"CREATE TABLE {fresh} (id bigint NOT NULL, a int, b text, c text)"
            + (f" WITH ({options})" if options else ""),
            f"INSERT INTO {fresh} SELECT id, a, b, {fill} FROM {TABLE} ORDER BY id",
            f"DROP TABLE {TABLE}",
            f"ALTER TABLE {fresh} RENAME TO {name}",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {name}_pkey PRIMARY KEY (id)",
            f"VACUUM (ANALYZE) {TABLE}")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        execute(url, "CHECKPOINT")


def verify(url: str, rows: int, who: str, column: str = "c") -> None:
    total, wrong = query_one(
        url, f"SELECT count(*), count(*) FILTER (WHERE {column} IS DISTINCT FROM md5(b)) "
             f"FROM {TABLE}")
    if total != rows or wrong:
        raise BenchError(f"{who}: {wrong} of {total} rows have {column} other than md5(b) "
                         f"(expected {rows} rows)")
    print(f"    verified: all {total:,} rows have {column} = md5(b)", flush=True)


def rows_updated(url: str) -> int:
    """n_tup_upd of the table: every row version written by an UPDATE, in
    committed and in rolled-back transactions alike."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT n_tup_upd FROM pg_stat_user_tables "
                           "WHERE schemaname = 'bench' AND relname = 'items'").fetchone()
    return int(row[0]) if row else 0
