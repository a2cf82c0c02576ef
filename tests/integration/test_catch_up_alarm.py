"""The success event's note that rows inserted after the last catch-up round
were not processed (framework.catch_up) is true or absent (issue 22, item
12): a job type whose trigger gives every inserted row its value
(``alter-type``) never records it, and its table holds every row the
application wrote; a type without such a trigger (``test-fill``) still does
when rows past its last range really went unprocessed. An application
inserts rows the whole time, so each range step runs out of catch-up rounds."""

from __future__ import annotations

import re

import psycopg
from support import fill, scalar, wait_state
from support.app import App, table_as_oracle

from framework import control
from framework.catch_up import MAX_CATCH_UP_ROUNDS
from framework.submit import SubmitRequest, submit

ROWS = 2_000
ALARM = re.compile(r"rows inserted with keys >= (\d+) after the last of \d+ catch-up ranges "
                   r"were not processed")


def _make_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL DEFAULT 7, b text, c text);
            INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
            ANALYZE items""")


def _run_with_inserts(db, url: str, start_node, request: SubmitRequest) -> tuple[dict, App, str]:
    """Run the job to its end while the application writes; returns its
    final status, the application (stopped) and its events' details (a step
    that ends notes its catch-up there, the last one in the success event)."""
    app = App(url, pause=0.001)
    app.load()
    app.start()
    job_id = submit(db, request).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=20)
    assert done["state"] == "succeeded", done
    assert app.errors == []
    rounds = scalar(db, """
        SELECT max((meta ->> 'catch_up')::int) FROM (
            SELECT meta FROM {s}.background_subtask WHERE job_id = :j
            UNION ALL SELECT meta FROM {s}.background_subtask_history WHERE job_id = :j) s""",
                    j=job_id)
    # Else this run did not reach the case under test (the app inserted too slowly).
    assert rounds == MAX_CATCH_UP_ROUNDS, f"{rounds} catch-up rounds"
    return done, app, "\n".join(e["detail"] or "" for e in control.events(db, job_id))


def test_a_type_whose_trigger_covers_inserted_rows_records_no_alarm(db, settings, start_node):
    url = settings.database_url
    _make_table(url)
    _, app, details = _run_with_inserts(db, url, start_node, SubmitRequest(
        "alter-type", {"table": "items", "column": "a", "type": "bigint"},
        rows_per_subtask=500, batch_rows=200))
    assert not ALARM.search(details), details
    # Nothing was missed: every row the application wrote, as it wrote it.
    assert table_as_oracle(url) == app.oracle


def test_a_type_without_such_a_trigger_names_the_rows_it_really_missed(
        db, settings, start_node):
    url = settings.database_url
    _make_table(url)
    _, _, details = _run_with_inserts(db, url, start_node,
                                     fill("md5(b)", rows_per_subtask=500, batch_rows=200))
    found = ALARM.search(details)
    assert found, details
    first = int(found.group(1))
    assert scalar(db, "SELECT count(*) FROM items WHERE id < :k AND d IS NULL", k=first) == 0
    missed, filled = scalar(db, "SELECT ARRAY[count(*) FILTER (WHERE d IS NULL), "
                                "count(*) FILTER (WHERE d IS NOT NULL)] FROM items "
                                "WHERE id >= :k", k=first)
    assert (missed > 0, filled) == (True, 0)
