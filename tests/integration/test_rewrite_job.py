"""scratch"""
from __future__ import annotations

import pytest
from support import job_of, wait_state
from support.rewrite import BIGINT, COMPOSITE, KeyApp, make_table, table_as_oracle

from backfill.rewrite.job import register
from framework.submit import SubmitRequest, submit


@pytest.fixture(autouse=True, scope="module")
def _registered():
    register()


def test_repack(db, settings, start_node):
    url = settings.database_url
    make_table(url, BIGINT, 2000)
    app = KeyApp(url, BIGINT, space=3000)
    app.load()
    app.start()
    job_id = submit(db, SubmitRequest("rewrite", {"table": "items"}, batch_rows=100,
                                      rows_per_subtask=500)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done
    assert app.errors == []
    assert table_as_oracle(url, BIGINT[0]) == app.oracle


def test_debug_events(db, settings, start_node):
    from support import execute
    from framework import control
    url = settings.database_url
    make_table(url, COMPOSITE, 2000)
    before = execute(url, "SELECT 'items'::regclass::oid")
    app = KeyApp(url, COMPOSITE, space=3000)
    app.load()
    app.start()
    job_id = submit(db, SubmitRequest("rewrite", {"table": "items", "keep_old": "1s"}, batch_rows=100,
                                      rows_per_subtask=500)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=50)
    for e in control.events(db, job_id):
        print(e)
    print(execute(url, "SELECT 'items'::regclass::oid"), before)
    print(execute(url, "SELECT relname FROM pg_class WHERE relname LIKE '%reorg%' OR relname like 'rewrite%'"))
    print(done)
    assert done["state"] == "succeeded", done
    assert table_as_oracle(url, COMPOSITE[0]) == app.oracle
    assert 0
