"""Values survive the trip PostgreSQL -> JDBC -> Spark -> Arrow -> CSV -> COPY
exactly, for the column types a backfill writes (``--set dst=src``)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.spark import JobKind

from backfill.spark_backfill.batches import SubtaskRunner
from backfill.spark_backfill.job import BackfillJobType, spec_of

pytestmark = pytest.mark.spark

CASES = {
    "smallint": ["-32768", "32767", "0"],
    "integer": ["-2147483648", "2147483647"],
    "bigint": ["-9223372036854775808", "9223372036854775807"],
    "numeric(14,4)": ["-1234567890.1234", "0.0001", "0"],
    "double precision": ["0.1", "-1e300", "5e-324", "'NaN'", "'Infinity'", "'-Infinity'"],
    "real": ["0.1", "3.4e38", "-1.5"],
    "boolean": ["true", "false"],
    "text": ["''", "'a,b'", "'quote \" '' mix'", "E'two\\nlines'", "'ünïcødé ✓'", "'\\N'", "'NULL'"],
    "character varying(20)": ["'short'", "''"],
    "date": ["'2024-02-29'", "'1970-01-01'", "'0001-01-01'"],
    "timestamp without time zone": ["'2024-02-29 23:59:59.999999'", "'1999-12-31 00:00:00'"],
    "timestamp with time zone": ["'2024-06-01 12:00:00.5+02'", "'2000-01-01 00:00:00+00'"],
    "jsonb": ["'{\"a\": [1, 2, {\"b\": null}]}'", "'\"s\"'"],
    "uuid": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"],
}


@pytest.mark.parametrize("pg_type", list(CASES))
def test_values_round_trip_exactly(spark, target_db, pg_type):
    values = CASES[pg_type] + ["NULL"]
    with target_db.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE t (id bigint PRIMARY KEY, src {pg_type}, dst {pg_type})"))
        for i, v in enumerate(values, 1):
            conn.execute(sa.text(f"INSERT INTO t VALUES ({i}, CAST({v} AS {pg_type}), NULL)"))
        # A non-NULL old value in every row, so before-images of this type are kept too.
        conn.execute(sa.text("UPDATE t SET dst = src WHERE src IS NOT NULL"))
        conn.execute(sa.text("UPDATE t SET dst = (SELECT src FROM t WHERE id = 1) WHERE id > 1"))
    backfill = JobKind(BackfillJobType(), SubtaskRunner, spec_of)
    job = backfill.submit(target_db, 300, {"table": "t", "set": "dst=src"}, batch_rows=10_000)
    with target_db.connect() as conn:
        before = conn.execute(sa.text("SELECT id, dst::text FROM t ORDER BY id")).all()
    backfill.run_range(target_db, job, 1, 1, len(values) + 1)
    with target_db.connect() as conn:
        wrong = conn.execute(sa.text(
            "SELECT id, src::text, dst::text FROM t WHERE dst IS DISTINCT FROM src")).all()
    assert wrong == []
    backfill.rollback(target_db, job)
    with target_db.connect() as conn:
        assert conn.execute(sa.text("SELECT id, dst::text FROM t ORDER BY id")).all() == before
