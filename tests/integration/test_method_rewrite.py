"""``alter-type --method rewrite`` and ``add-column --method rewrite``: the
same change made by the table-rewrite engine, as a ``rewrite`` job
(``backfill.rewrite.handover``), with an application writing throughout
and its oracle; the column keeps its place; a bad --method is one line."""

from __future__ import annotations

import psycopg
import pytest
from support import job_of, scalar, wait_state
from support.app import App, table_as_oracle

from backfill.rewrite.job import register
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 1_200


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def _items(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL, b text, "
                     "c text DEFAULT 'c');"
                     "CREATE INDEX items_a ON items (a);"
                     f"INSERT INTO items (a, b) SELECT g, 'v' || g "
                     f"FROM generate_series(1, {ROWS}) g")


def _columns(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'items'::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum").fetchall()


def _run_with_app(db, url: str, start_node, request: SubmitRequest) -> dict:
    app = App(url)
    app.load()
    app.start()
    job_id = submit(db, request).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=20)
    assert done["state"] == "succeeded", done
    assert app.errors == [], app.errors[:3]
    assert {k: v for k, v in table_as_oracle(url).items()} == app.oracle
    return job_of(db, job_id)


def test_alter_type_by_rewrite_keeps_every_write_and_the_columns_place(
        db, settings, start_node):
    url = settings.database_url
    _items(url)
    job = _run_with_app(db, url, start_node, SubmitRequest(
        "alter-type", {"table": "items", "column": "a", "type": "bigint", "method": "rewrite"},
        rows_per_subtask=400, batch_rows=200))
    assert job["type"] == "rewrite"
    assert _columns(url) == [("id", "integer"), ("a", "bigint"), ("b", "text"), ("c", "text")]
    assert scalar(db, "SELECT count(*) FROM pg_indexes WHERE indexname = 'items_a'") == 1


def test_add_column_by_rewrite_gives_every_row_its_value_then_the_default(
        db, settings, start_node):
    url = settings.database_url
    _items(url)
    _run_with_app(db, url, start_node, SubmitRequest(
        "add-column", {"table": "items", "column": "d:text", "value": "'d' || id",
                       "default": "'none'", "not_null": True, "method": "rewrite"},
        rows_per_subtask=400, batch_rows=200))
    assert _columns(url)[-1] == ("d", "text")
    # Every row the table had at the swap has its value (of a column the
    # application never changes, so its updates after the swap keep it);
    # rows it inserted after the swap have the default.
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM 'd' || id "
                      "AND d IS DISTINCT FROM 'none'") == 0
    assert scalar(db, "SELECT count(*) FROM items WHERE d = 'd' || id") >= ROWS // 2
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT attnotnull, pg_get_expr(adbin, adrelid) FROM pg_attribute "
                            "LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum "
                            "WHERE attrelid = 'items'::regclass AND attname = 'd'"
                            ).fetchone() == (True, "'none'::text")


@pytest.mark.parametrize("request_", [
    SubmitRequest("alter-type", {"table": "items", "column": "a", "type": "bigint",
                                 "method": "copy"}),
    SubmitRequest("add-column", {"table": "items", "column": "d:text", "value": "b",
                                 "method": "Rewrite"}),
], ids=["alter-type", "add-column"])
def test_a_bad_method_is_one_line_and_changes_nothing(db, settings, request_):
    url = settings.database_url
    _items(url)
    with pytest.raises(InvalidParams) as refused:
        submit(db, request_)
    message = str(refused.value)
    assert message.startswith("--method ") and "column" in message and "rewrite" in message
    assert "\n" not in message
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0
