"""A second statement never runs, whichever way it is brought (docs/security.md):
refused at submit with the table unchanged, and refused again by the worker
when a job row carries it without going through submit (written by hand, or
by another tool), so the job fails cleanly and the table still exists,
unchanged."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from support import TERMINAL, table_rows, wait_state

from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

DROP = "DROP TABLE g"
TRICKS = {
    "semicolon": f"1; {DROP}",
    "closing parenthesis": f"1); {DROP}; SELECT (1",
    "line comment": f"1 --\n); {DROP}; SELECT (1",
    "block comment": f"1 /* */); {DROP}; SELECT (/* 1",
    "dollar quote": f"$$1$$); {DROP}; SELECT ($$",
    "unbalanced quote": f"'1'); {DROP}; SELECT ('",
}


def make_g(db) -> None:
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE g (id bigint PRIMARY KEY, g int, v bigint)"))
        conn.execute(sa.text("INSERT INTO g SELECT i, i % 10, i FROM generate_series(1, 500) i"))


def g_exists(db) -> bool:
    with db.begin() as conn:
        return conn.execute(sa.text("SELECT to_regclass('public.g') IS NOT NULL")).scalar()


@pytest.mark.parametrize("option", ["set", "where"])
@pytest.mark.parametrize("trick", TRICKS.values(), ids=TRICKS.keys())
def test_submit_refuses_a_smuggled_statement(db, trick, option) -> None:
    make_g(db)
    before = table_rows(db, "g")
    params = {"table": "g", "set": "v=v+1", "where": None} | (
        {"set": f"v={trick}"} if option == "set" else {"where": trick})
    with pytest.raises(InvalidParams) as exc:
        submit(db, SubmitRequest("sql-update", params))
    assert "\n" not in str(exc.value)
    assert g_exists(db) and table_rows(db, "g") == before


@pytest.mark.parametrize("key", ["expr", "where"])
def test_a_worker_refuses_a_smuggled_statement_in_a_job_row(db, start_node, key) -> None:
    make_g(db)
    before = table_rows(db, "g")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "g", "set": "v=v+1"},
                                      rows_per_subtask=100)).job_id
    # The job row changed behind submit's back, before any node saw it.
    with db.begin() as conn:
        conn.execute(db.sql("UPDATE {s}.jobs SET params = params || CAST(:p AS jsonb) "
                            "WHERE id = :id"),
                     {"p": json.dumps({key: TRICKS["closing parenthesis"]}), "id": job_id})
    start_node("n1")
    job = wait_state(db, job_id, TERMINAL)
    assert job["state"] == "reverted"
    assert "is not one SQL expression" in job["error"]
    assert g_exists(db) and table_rows(db, "g") == before
