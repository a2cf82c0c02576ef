"""Contender (2) of the data-plane benchmark: the same backfill as a hand-written PySpark job.

    python -m bench.dataplane.plain_spark --db postgresql://user@127.0.0.1:5432/db [--partitions 4]

JDBC read of the whole table, partitioned on the key; ``c = md5(b)`` in Spark;
JDBC write into an UNLOGGED staging table; one ``UPDATE ... FROM`` staging.
No leases, checkpoints, fencing or retries: the job a competent engineer
would write by hand. It uses nothing of reorg's framework; only the Spark
settings (loopback binding, JDBC driver discovery, quiet logging) and the
URL conversion come from ``backfill.spark``, so both contenders run Spark the
same way. Prints one JSON line of timings on stdout. Run from the repository's
root (``-m`` puts it first on ``sys.path``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STAGING = "bench.items_stage"
TABLE = "bench.items"


def start_session() -> SparkSession:
    from pyspark.sql import SparkSession

    from backfill.spark.session import SparkSettings, build_conf, find_jdbc_driver, quiet_log_config

    log4j = quiet_log_config("bench-plain-spark-log4j2.properties")
    # As reorg does: bind to loopback, not the host's external address.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    conf = build_conf(SparkSettings(), find_jdbc_driver(), log4j)
    conf["spark.app.name"] = "bench-plain-spark"
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def run_job(spark: SparkSession, url: str, partitions: int) -> dict[str, float]:
    import psycopg
    from pyspark.sql import functions as F

    from backfill.spark.jdbc import jdbc_target

    jdbc = jdbc_target(url)
    laps: dict[str, float] = {}
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        low, high = conn.execute(f"SELECT min(id), max(id) FROM {TABLE}").fetchone() or (0, 0)
        conn.execute(f"DROP TABLE IF EXISTS {STAGING}")
        conn.execute(f"CREATE UNLOGGED TABLE {STAGING} (id bigint, c text)")
    source = spark.read.jdbc(
        jdbc.url, TABLE, column="id", lowerBound=int(low), upperBound=int(high) + 1,
        numPartitions=partitions, properties={**jdbc.properties, "fetchsize": "10000"})
    (source.select("id", F.md5(F.col("b")).alias("c"))
        .write.jdbc(jdbc.url, STAGING, mode="append",
                    properties={**jdbc.properties, "batchsize": "10000",
                                "reWriteBatchedInserts": "true"}))
    laps["spark_read_transform_write"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ANALYZE {STAGING}")
        conn.execute(f"UPDATE {TABLE} t SET c = s.c FROM {STAGING} s WHERE t.id = s.id")
        conn.execute(f"DROP TABLE {STAGING}")
    laps["update_from_staging"] = time.perf_counter() - t1
    return laps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="postgresql:// URL (TCP host)")
    parser.add_argument("--partitions", type=int, default=4, help="JDBC read partitions")
    args = parser.parse_args()
    t0 = time.perf_counter()
    spark = start_session()
    t1 = time.perf_counter()
    laps = run_job(spark, args.db, args.partitions)
    t2 = time.perf_counter()
    spark.stop()
    print(json.dumps({"session_start": t1 - t0, "job": t2 - t1, "with_session": t2 - t0, **laps}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
