"""``rewrite --engine spark``: the --set column computed by Spark (here a
Python function, which PostgreSQL could not run) for every row the copy,
the catch-up's replays and the swap's last replay write, with an
application writing throughout and its oracle, on an integer key and a
composite text key (matrix); bad input refused in one line; the dry run
shows Spark's part."""

from __future__ import annotations

import pytest
from support import execute, rows, scalar, wait_state
from support.rewrite import BIGINT, COMPOSITE, KeyApp, make_table, table_as_oracle
from test_rewrite_job import catalogue, leftovers, more_writes, step_rows

from backfill.rewrite.job import register
from framework import faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark

ROWS = 1_500
KEYS = {"integer": BIGINT, "composite": COMPOSITE}
ON_SPARK = {"alter": "ALTER COLUMN a TYPE bigint, ADD COLUMN d text",
            "sets": ["d=reverse_text(b)"], "engine": "spark", "udf": "support.spark:reverse_text"}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def rewrite(**params) -> SubmitRequest:
    # Batches of 500: each is a Spark job (~0.3 s whatever its rows).
    return SubmitRequest("rewrite", {"table": "items", **params}, batch_rows=500,
                         rows_per_subtask=750)


def not_reversed(url: str) -> int:
    """Rows whose d is not their b reversed (PostgreSQL's reverse: the oracle
    of the Python function's)."""
    return execute(url, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM reverse(b)")[0][0]


# In the matrix (~30 s under CI's load): CI's short form is test_spark_any_key's,
# rows written during the copy and before the swap, without an application.
@pytest.mark.matrix
@pytest.mark.parametrize("key_kind", list(KEYS))
def test_spark_computes_the_set_of_every_row_copied_and_replayed(spark, db, settings, start_node,
                                                                 key_kind):
    url, key = settings.database_url, KEYS[key_kind]
    make_table(url, key, ROWS)
    app = KeyApp(url, key, space=10 * ROWS)  # free keys for every insert until the swap
    app.load()
    app.start()
    faults.enable_signals()
    faults.arm("worker.after_batch", "block")  # the copy held a moment: a backlog to replay
    faults.arm("rewrite.before_swap", "block")
    job_id = submit(db, rewrite(**ON_SPARK)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch")
    more_writes(app, 200)
    faults.release("worker.after_batch")
    faults.wait_blocked("rewrite.before_swap", timeout=120)
    app.stop(at_least_ops=20)
    # Writes the swap's last replay takes (the owner waits before its locks).
    touched = execute(url, "UPDATE items SET b = b || '-last' WHERE id % 97 = 0 "
                           "RETURNING id")
    faults.release("rewrite.before_swap")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    oracle = {k: (a, f"{b}-last" if k[-1] % 97 == 0 else b) for k, (a, b) in app.oracle.items()}
    assert table_as_oracle(url, key[0]) == oracle
    assert touched and not_reversed(url) == 0
    assert scalar(db, "SELECT count(*) FROM items WHERE d LIKE 'tsal-%'") == len(touched)
    assert step_rows(db, job_id, 3) > 0  # the catch-up replayed on Spark
    assert execute(url, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = 'items'::regclass AND attname = 'a'") == [("bigint",)]
    assert leftovers(url) == []


@pytest.mark.parametrize(("params", "says"), [
    ({"sets": ["b=upper(b)", "a=a+1"], "engine": "spark"},
     "--engine spark computes one column on Spark: give exactly one --set"),
    ({"sets": ["b=upper(b)"], "udf": "support.spark:reverse_text"}, "--udf is for --engine spark"),
    ({"sets": ["b=upper(b)"], "engine": "spark", "udf": "os:system"}, "not allowed for UDFs"),
    ({"sets": ["b=no_such_function(b)"], "engine": "spark"},
     "--set b=no_such_function(b) is not a Spark SQL expression over public.items"),
    ({"sets": ["a=b"], "engine": "spark"}, "yields string but a is integer"),
    ({"sets": ["b=upper(b)"], "engine": "duckdb"}, "--engine 'duckdb': give sql"),
])
def test_bad_input_is_refused_in_one_line_and_changes_nothing(spark, db, settings, params, says):
    url = settings.database_url
    make_table(url, BIGINT, 50)
    before = catalogue(url)
    with pytest.raises(InvalidParams) as refused:
        submit(db, rewrite(**params))
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert catalogue(url) == before and leftovers(url) == []
    assert rows(db, "SELECT id FROM {s}.jobs") == []


def test_a_dry_run_shows_what_spark_computes(spark, db, settings):
    url = settings.database_url
    make_table(url, BIGINT, 50)
    result = submit(db, SubmitRequest("rewrite", {"table": "items", **ON_SPARK}, dry_run=True))
    text = "\n".join(result.notes)
    assert ("Spark reads SELECT *, xmin FROM \"public\".\"items\" WHERE \"id\" >= lo AND \"id\" < hi "
            "and computes d = reverse_text(b) (--udf support.spark:reverse_text)") in text, text
    assert 'AND "public"."items".xmin = s."__reorg_s_ver"' in text
    assert rows(db, "SELECT id FROM {s}.jobs") == [] and leftovers(url) == []

