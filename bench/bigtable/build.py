"""The big table, built fast: chunks of ``generate_series`` inserted from
parallel connections into a table with no index yet, then the primary key
(one sort, parallel maintenance workers) and VACUUM (ANALYZE), so the table
starts all-visible and with statistics, as a loaded table at rest is."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from bench.dataplane.chunks import in_parallel
from bench.dataplane.records import TABLE
from bench.dataplane.server import execute, query_one

CHUNK = 1_000_000  # rows per INSERT (one transaction each)
LOADERS = 2  # parallel connections (the machine has 2 cores)


def existing_rows(url: str) -> int | None:
    """Rows of a ``bench.items`` left by an earlier run (reused with
    ``--reuse``), from the planner's estimate: no scan. After a run's updates
    and their put-back the estimate can be off by several percent."""
    (exists,) = query_one(url, f"SELECT to_regclass('{TABLE}') IS NOT NULL")
    if not exists:
        return None
    (reltuples,) = query_one(url, f"SELECT reltuples::bigint FROM pg_class "
                                  f"WHERE oid = '{TABLE}'::regclass")
    return int(reltuples)


# ``--old-values``: c holds this in every row (else NULL), so the job keeps
# a before-image of every row it writes and a rollback restores them all.
OLD_VALUE = "'old ' || {key}"


def original_c(key: str, old_values: bool) -> str:
    """What c holds in a row before any job, as SQL over the key ``key``."""
    return OLD_VALUE.format(key=key) if old_values else "NULL"


def build_table(url: str, rows: int, old_values: bool = False) -> float:
    """``rows`` rows ``(g, g % 1000, 'item ' || g, c)``, c NULL or
    ``original_c``; returns seconds."""
    began = time.perf_counter()
    execute(url, "CREATE SCHEMA IF NOT EXISTS bench", f"DROP TABLE IF EXISTS {TABLE}",
            f"CREATE TABLE {TABLE} (id bigint NOT NULL, a int, b text, c text)",
            # A bulk load's WAL needs room: without it a checkpoint every 1 GB.
            "ALTER SYSTEM SET max_wal_size = '16GB'", "SELECT pg_reload_conf()")
    lock = threading.Lock()
    done = [0]

    def load(conn: psycopg.Connection[Any], lo: int) -> None:
        hi = min(lo + CHUNK, rows + 1)
        conn.execute(f"INSERT INTO {TABLE} SELECT g, g %% 1000, 'item ' || g, "  # type: ignore[arg-type]
                     f"{original_c('g', old_values)} "
                     "FROM generate_series(%s::bigint, %s::bigint - 1) g", (lo, hi))
        with lock:
            done[0] += hi - lo
            if done[0] % (10 * CHUNK) == 0:
                print(f"    {done[0]:,} rows loaded "
                      f"({time.perf_counter() - began:.0f} s)", flush=True)

    in_parallel(url, LOADERS, iter(range(1, rows + 1, CHUNK)), load, f"loading {TABLE}")
    print(f"    loaded in {time.perf_counter() - began:.0f} s; primary key, VACUUM (ANALYZE)",
          flush=True)
    execute(url, "SET maintenance_work_mem = '1GB'",
            f"ALTER TABLE {TABLE} ADD PRIMARY KEY (id)",
            f"VACUUM (ANALYZE) {TABLE}", "CHECKPOINT")
    return time.perf_counter() - began
