"""Contenders (2), (3) and (4): what people do without reorg."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg

from bench.dataplane.chunks import in_parallel
from bench.dataplane.errors import BenchError
from bench.dataplane.records import CHUNK_ROWS, SQL_CONNECTIONS, TABLE, PlainSpark
from bench.dataplane.reorg_cli import REPO, clean_env
from bench.dataplane.server import execute, query_one
from bench.dataplane.timing import timed


def run_single_update(url: str) -> float:
    """(4) one ``UPDATE`` of the whole table."""
    with timed("one UPDATE") as lap:
        execute(url, f"UPDATE {TABLE} SET c = md5(b)")
    return lap.seconds


# (3) with before-images, as ``sql-update`` overwriting a column writes them
# (``backfill.sql_update.statements.UpdateSql.update``), into a table like its
# images table, from the same chunks and connections: what PostgreSQL alone
# needs for those writes.
IMAGES = "bench.chunk_images"
IMAGES_CHUNK = f"""
    WITH r AS (SELECT id AS k, c AS old, ctid AS tid FROM {TABLE} WHERE id >= %s AND id < %s),
    u AS (UPDATE {TABLE} t SET c = md5(b) FROM r WHERE t.ctid = r.tid AND t.id >= %s AND t.id < %s
          RETURNING r.k, r.old)
    INSERT INTO {IMAGES} (k, old, xid) SELECT k, old, pg_current_xact_id() FROM u
    WHERE num_nulls(old) = 0"""


def run_chunked_sql(url: str, *, images: bool = False) -> float:
    """(3) ``UPDATE`` in key chunks handed out in order to parallel autocommit
    connections; ``images``: each chunk keeps before-images as sql-update does."""
    low, high = query_one(url, f"SELECT min(id), max(id) FROM {TABLE}")
    if images:
        execute(url, f"DROP TABLE IF EXISTS {IMAGES}",
                f"CREATE TABLE {IMAGES} (k bigint NOT NULL, old text, xid xid8 NOT NULL)")

    def update(conn: psycopg.Connection[Any], lo: int) -> None:
        hi = lo + CHUNK_ROWS
        if images:
            conn.execute(IMAGES_CHUNK, (lo, hi, lo, hi))
        else:
            conn.execute(f"UPDATE {TABLE} SET c = md5(b) WHERE id >= %s AND id < %s", (lo, hi))

    label = " with before-images" if images else ""
    try:
        with timed(f"chunked SQL{label} ({SQL_CONNECTIONS} connections)") as lap:
            in_parallel(url, SQL_CONNECTIONS, iter(range(int(low), int(high) + 1, CHUNK_ROWS)),
                        update, "chunked SQL")
    finally:
        if images:
            execute(url, f"DROP TABLE IF EXISTS {IMAGES}")
    return lap.seconds


def run_plain_spark(url: str, partitions: int) -> PlainSpark:
    """(2) ``plain_spark`` in its own process."""
    cmd = [sys.executable, "-m", "bench.dataplane.plain_spark", "--db", url,
           "--partitions", str(partitions)]
    with timed("plain Spark (process)") as lap:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=clean_env())
    if done.returncode != 0:
        raise BenchError(f"plain Spark job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    laps = json.loads(done.stdout.strip().splitlines()[-1])
    result = PlainSpark(lap.seconds, laps["with_session"], laps["job"], laps["session_start"],
                        laps["spark_read_transform_write"], laps["update_from_staging"])
    print(f"    SparkSession start {result.session_start:.2f} s, read+md5+write "
          f"{result.read_transform_write:.2f} s, UPDATE ... FROM {result.update:.2f} s", flush=True)
    return result
