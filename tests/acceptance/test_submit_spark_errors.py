"""Bad input to the Spark job types through the ``reorg`` command (DESIGN 11):
an expression Spark cannot parse, resolve, type or evaluate is one ``error:``
line naming the option, with none of Spark's own output (JVM banners,
PySpark's JSON query-context records, stack traces of failed dry-run tasks),
exit code 2, and every table exactly as it was: no job row, no column."""

from __future__ import annotations

import pytest
from cli_support import assert_one_error_line, dump, ok, reorg
from support import execute

pytestmark = pytest.mark.spark

BAD_INPUT = 2
# Every case starts its own `reorg` process, hence its own Spark (seconds each).
SPARK_TIMEOUT = 180


ITEMS_ROWS = 200  # rows of ``items`` in the ``items_db`` fixture


# args after `submit backfill --table items`, and what the line must say: one
# case for each way Spark reports a failure (each starts a JVM, so the
# wording of the other rejections is tested in-process, in
# tests/integration/test_spark_backfill.py).
BAD_BACKFILLS = {
    # PySpark logs a JSON query-context record, then raises.
    "unknown column": (["--set", "c=upper(nope)"], "--set c=upper(nope) is not a Spark SQL"),
    "text into int": (["--set", "a=b"], "--set a=b yields string but a is integer"),
    # A failed dry-run task: the JVM logs a stack trace.
    "cast fails on the sample rows": (["--set", "a=CAST(b AS int)"],
                                      "--set a=CAST(b AS int) fails on sample rows"),
    # A Python worker's traceback.
    "--udf raises on the sample rows": (["--set", "c=loads(b)", "--udf", "json:loads"],
                                        "--set c=loads(b) fails on sample rows of public.items: "
                                        "json.decoder.JSONDecodeError: Expecting value"),
    # PostgreSQL's error through the JDBC driver.
    "--where fails on the rows": (["--set", "c=b", "--where", "b::int > 5"],
                                  "--where fails on rows of public.items: invalid input syntax"),
    "bad expression in a dry run": (["--set", "c=nosuch_fn(b)", "--dry-run"], "--set"),
}


# In CI, one case for each of Spark's channels (a query-context record, a
# failed task's JVM trace, a Python worker's traceback); the rest, a JVM each,
# in the matrix (``-m matrix``).
_CI_CASES = {"unknown column", "cast fails on the sample rows", "--udf raises on the sample rows"}


@pytest.mark.parametrize(("args", "says"), [
    pytest.param(*case, id=name, marks=() if name in _CI_CASES else pytest.mark.matrix)
    for name, case in BAD_BACKFILLS.items()])
def test_bad_backfill_is_one_line_and_changes_nothing(items_db: str, args: list[str],
                                                      says: str) -> None:
    before = dump(items_db)
    result = reorg(items_db, "submit", "backfill", "--table", "items", *args,
                   timeout=SPARK_TIMEOUT)
    line = assert_one_error_line(result, BAD_INPUT)
    assert says in line, line
    assert result.stdout == ""
    assert dump(items_db) == before


def test_bad_copy_select_is_one_line_and_changes_nothing(items_db: str) -> None:
    before = dump(items_db)
    result = reorg(items_db, "submit", "copy", "--table", "items", "--target", "items2",
                   "--create-target", "--select", "id", "--select", "nosuch_fn(b) AS x",
                   timeout=SPARK_TIMEOUT)
    line = assert_one_error_line(result, BAD_INPUT)
    assert "--select 'nosuch_fn(b) AS x' is not a Spark SQL expression" in line
    assert dump(items_db) == before


def test_good_backfill_prints_the_job_id_alone(items_db: str) -> None:
    """The same Spark start-up, accepted: stdout is the id, stderr is empty."""
    result = reorg(items_db, "submit", "backfill", "--table", "items", "--set", "c=upper(b)",
                   timeout=SPARK_TIMEOUT)
    job_id = int(ok(result).strip())
    assert result.stderr == ""
    assert execute(items_db, "SELECT type, state FROM reorg.jobs WHERE id = %(j)s",
                   {"j": job_id}) == [("backfill", "queued")]
