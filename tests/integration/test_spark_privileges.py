"""The Spark job types with a job's submitter's privileges, never more
(docs/security.md), on a real PostgreSQL and a real local SparkSession: the
JDBC reads run as the submitter (a --where calling a function that reads a
table the submitter may not read fails, though the engine's role may read
it), and the Spark expressions and UDFs that would reach the worker's JVM,
environment or files are refused at submit and again on the worker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
import sqlalchemy as sa
from support import make_items, scalar, snapshot
from support.spark import JobKind

from backfill.copy.batches import CopyPipeline
from backfill.copy.job import CopyJobType
from backfill.copy.job import spec_of as copy_spec_of
from backfill.spark.expression_guard import check_spark_expression
from backfill.spark.failures import first_line
from backfill.spark.transform import udf_module_allowed
from backfill.spark_backfill.batches import SubtaskRunner
from backfill.spark_backfill.job import BackfillJobType, spec_of
from framework.errors import InvalidParams
from framework.privileges import RUN_AS

pytestmark = pytest.mark.spark

BACKFILL = JobKind(BackfillJobType(), SubtaskRunner, spec_of)


@pytest.fixture
def roles(target_db) -> Iterator[dict[str, str]]:
    """``reader`` may read the secret, ``outsider`` may not; both may read and
    update ``items``. The engine's role (a superuser) may do anything."""
    suffix = uuid.uuid4().hex[:8]
    names = {"reader": f"spk_reader_{suffix}", "outsider": f"spk_outsider_{suffix}"}
    make_items(target_db, 2_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("""
            CREATE TABLE secret_table (secret text);
            INSERT INTO secret_table VALUES ('s3cret');
            CREATE FUNCTION peek() RETURNS text LANGUAGE plpgsql STABLE
                AS 'BEGIN RETURN (SELECT secret FROM secret_table LIMIT 1); END'"""))
        for role in names.values():
            conn.execute(sa.text(f"CREATE ROLE {role}; GRANT SELECT, UPDATE ON items TO {role}"))
        conn.execute(sa.text(f"GRANT SELECT ON secret_table TO {names['reader']}"))
    yield names
    with target_db.begin() as conn:
        for role in names.values():
            conn.execute(sa.text(f"DROP OWNED BY {role}; DROP ROLE {role}"))


def test_jdbc_reads_run_as_the_submitter(spark, target_db, roles) -> None:
    params = {"table": "items", "set": "c=upper(b)", "where": "peek() IS NOT NULL",
              "target_batch_seconds": 0}
    job = BACKFILL.submit(target_db, 201, params)
    before = snapshot(target_db)
    refused = replace(job, params={**job.params, RUN_AS: roles["outsider"]})
    with pytest.raises(Exception) as failed:  # noqa: PT011 - Spark's, its cause checked
        BACKFILL.run_all(target_db, refused, 2_000)
    assert "permission denied for table secret_table" in first_line(failed.value)
    assert snapshot(target_db) == before

    allowed = replace(job, params={**job.params, RUN_AS: roles["reader"]})
    BACKFILL.run_all(target_db, allowed, 2_000)
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM upper(b)") == 0


FORBIDDEN = {
    "java_method": "java_method('java.lang.System', 'getenv', 'REORG_DATABASE_URL')",
    "reflect, upper case, nested": "upper(REFLECT('java.lang.System', 'getenv', 'HOME'))",
    "a subquery reading a file": "(SELECT max(value) FROM text.`/etc/hostname`)",
    "exists subquery": "EXISTS (SELECT 1)",
}


@pytest.mark.parametrize("expr", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_expressions_reaching_outside_the_row_are_refused(spark, expr) -> None:
    with pytest.raises(InvalidParams, match="which reorg refuses"):
        check_spark_expression(spark, expr, "--set")


def test_ordinary_expressions_pass(spark) -> None:
    for expr in ("upper(b)", "concat(md5(b), ':', a)", "exists(array(1, 2), x -> x > 1)",
                 "upper(b) AS b", "transform(array(a), x -> x + 1)[0]"):
        check_spark_expression(spark, expr, "--set")


def test_submit_refuses_them_and_changes_nothing(spark, target_db) -> None:
    make_items(target_db, 200)
    BACKFILL.assert_rejected(target_db, {"table": "items", "set": f"c={FORBIDDEN['java_method']}"},
                             "calls java_method()")
    BACKFILL.assert_rejected(target_db, {"table": "items", "set": "c=getenv(b)",
                                         "udf": "os:getenv"}, "module os is not allowed")
    copy = JobKind(CopyJobType(), CopyPipeline, copy_spec_of)
    copy.assert_rejected(target_db, {
        "table": "items", "target": "items_copy", "create_target": True,
        "select": ["id", f"{FORBIDDEN['a subquery reading a file']} AS h"]}, "holds a subquery")


def test_a_worker_refuses_an_expression_that_skipped_submit(spark, target_db) -> None:
    make_items(target_db, 500)
    job = BACKFILL.submit(target_db, 202, {"table": "items", "set": "c=upper(b)"})
    before = snapshot(target_db)
    tampered = replace(job, params={**job.params, "expr": FORBIDDEN["java_method"]})
    with pytest.raises(InvalidParams, match="calls java_method"):
        BACKFILL.run_all(target_db, tampered, 500)
    assert snapshot(target_db) == before


def test_udf_modules_follow_the_allowlist() -> None:
    assert udf_module_allowed("mylib.clean") and not udf_module_allowed("subprocess")
    assert not udf_module_allowed("os.path")
    assert udf_module_allowed("mylib.clean", "mylib") and not udf_module_allowed("json", "mylib")
